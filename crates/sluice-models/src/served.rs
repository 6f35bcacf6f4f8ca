//! What a template family (Qwen3-MoE, GPT-OSS, DeepSeek-V3: routed experts from an expert
//! store, a spine placed piece by piece) holds and does around its own math, written once.
//!
//! - [`Served`]: the checkpoint, the expert store, the prefetch switch and the spine placement,
//!   with the step every forward takes before a layer and before the head: take the piece,
//!   rolling the staged state back when its read fails.
//! - [`Experts`]: what the family table's `load` and `with_experts` lines differ by (experts
//!   mapped in place, or served by a given store), so that each family writes one `load`.
//! - [`norm_rows`] and [`finite_logits`]: the row-wise RMSNorm and the logits check of every
//!   family's forward, Qwen3 dense's included.
//! - [`served_methods!`]: the [`crate::family::FamilyModel`] methods that only reach the
//!   [`Served`] (attaching a store, prefetch, the spine store and its counters), which
//!   [`crate::family::family_model!`] writes for a `served` family.
//!
//! What differs stays in each family's folder: its config, tensor roster, expert layout, memory
//! needs and the layer math of its forward.

use crate::family::RoutedExperts;
use crate::spine::{PieceRef, Spine};
use crate::{FamilyState, ModelError};
use sluice_checkpoint::Checkpoint;
use sluice_kernels::ops::rms_norm;
use sluice_store::{ExpertStore, SpineIndex, SpineStore};
use std::sync::Arc;

/// Where a template family's routed experts come from when it loads.
pub enum Experts {
    /// Served in place from the checkpoint's mapped shards (the table line's `load`).
    Mapped,
    /// Served by this store from the start (the line's `with_experts`): for a checkpoint whose routed
    /// experts are not mapped (a stream install's sparse shards), where the in-place store
    /// cannot open.
    Given(Arc<dyn ExpertStore>),
}

impl Experts {
    /// True when the experts are served in place.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self, Self::Mapped)
    }
}

/// What a template family holds besides its config and weights.
pub(crate) struct Served {
    /// The opened checkpoint (the mapped spine, and the source of a placed one).
    pub(crate) ckpt: Arc<Checkpoint>,
    /// The store routed experts come from.
    pub(crate) experts: Arc<dyn ExpertStore>,
    /// Guess the next MoE layer's experts for the store to prefetch (worth it when experts
    /// stream): each MoE layer guesses the next one's with that layer's router on its own input,
    /// and the first MoE layer's are guessed before its attention runs.
    pub(crate) prefetch: bool,
    /// Where a pass reads its spine matrices: mapped, or placed by a spine store.
    pub(crate) spine: Spine,
}

impl Served {
    /// The checkpoint with its routed experts (those of `routed`) taken from `experts`; the
    /// spine mapped and prefetch off until the engine says otherwise.
    pub(crate) fn open(
        ckpt: Arc<Checkpoint>,
        experts: Experts,
        routed: &RoutedExperts,
    ) -> Result<Self, ModelError> {
        let experts: Arc<dyn ExpertStore> = match experts {
            Experts::Mapped => Arc::new(routed.mapped(ckpt.clone())?),
            Experts::Given(store) => store,
        };
        Ok(Self { ckpt, experts, prefetch: false, spine: Spine::Mapped })
    }

    /// Spine piece `i` (mapped, resident, or its stream buffer, waited for); when it cannot be
    /// had, `state` is rolled back, so that the failed pass leaves nothing staged.
    pub(crate) fn piece(
        &self,
        i: usize,
        state: &mut dyn FamilyState,
    ) -> Result<PieceRef<'_>, ModelError> {
        self.spine.piece(&self.ckpt, i).inspect_err(|_| state.rollback())
    }

    /// Embedding rows of `tokens` (read through `embed`) widened to f32 into `h` (`[T, d]`).
    pub(crate) fn embed(
        &self,
        embed: &crate::linear::Linear,
        tokens: &[u32],
        h: &mut [f32],
    ) -> Result<(), ModelError> {
        self.spine.embed(&self.ckpt, embed, tokens, h)
    }

    /// Spine piece `i` if it is at hand without waiting for a read (for the prefetch guess).
    pub(crate) fn peek(&self, i: usize) -> Option<PieceRef<'_>> {
        self.spine.peek(&self.ckpt, i)
    }

    /// Takes spine bytes from `store`, which must have been opened on `index` (the model's own).
    pub(crate) fn set_spine(
        &mut self,
        store: Arc<SpineStore>,
        index: &SpineIndex,
    ) -> Result<(), ModelError> {
        self.spine = Spine::placed(store, index)?;
        Ok(())
    }
}

/// Rows a chunk of the row-wise passes over a prefill ([`norm_rows`], [`rows_on_pool`]) takes:
/// 256 rows are 16 chunks for the pool's threads; a decode row runs on the calling thread.
pub(crate) const ROWS_PER_CHUNK: usize = 16;

/// RMSNorm with weight `w` and epsilon `eps` on every row of `x [n, d]` (each family's
/// `*RMSNorm` over the hidden rows), rows in chunks on the kernel pool: each row's norm is
/// computed by the same code whatever thread runs it, so the bits do not depend on the split.
/// (On the engine thread alone, a 256-row prefill's norms were 4% of a 16-thread Qwen3-30B-A3B
/// pass: one dependent f64 addition per element.)
pub(crate) fn norm_rows(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    rows_on_pool(&mut out, d, |r0, block| {
        for (i, o) in x[r0 * d..].chunks_exact(d).zip(block.chunks_exact_mut(d)) {
            rms_norm(i, Some(w), eps, o);
        }
    });
    out
}

/// Runs `f(first_row, rows)` over `data` (rows of `width` values) in chunks of
/// [`ROWS_PER_CHUNK`] rows on the kernel pool; one chunk (a decode row) runs on the calling
/// thread. For row-wise work whose result per row does not depend on the other rows.
pub(crate) fn rows_on_pool(data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = ROWS_PER_CHUNK * width.max(1);
    if data.len() <= chunk {
        f(0, data);
        return;
    }
    sluice_kernels::pool::map_chunks_mut(data, chunk, |i, block| f(i * ROWS_PER_CHUNK, block));
}

/// `logits` when every value is finite; otherwise `state` is rolled back and the error names
/// the logits (a weight holds NaN/Inf or the arithmetic overflowed).
pub(crate) fn finite_logits(
    logits: Vec<f32>,
    state: &mut dyn FamilyState,
) -> Result<Vec<f32>, ModelError> {
    if crate::finite::all_finite(&logits) {
        return Ok(logits);
    }
    state.rollback();
    Err(ModelError::NonFiniteActivation {
        stage: "the logits".into(),
        cause: "a weight of the model holds NaN/Inf or the arithmetic overflowed".into(),
    })
}

/// The [`crate::family::FamilyModel`] methods of a `served` family (one with a `served:`
/// [`Served`] field): those that only reach the [`Served`], and those forwarded to the
/// family's inherent `routed_experts`, `spine_index` and `spine_small_bytes`.
macro_rules! served_methods {
    ($model:ident) => {
        fn routed_experts(&self) -> Option<$crate::family::RoutedExperts> {
            Some($model::routed_experts(self))
        }
        fn set_experts(&mut self, store: ::std::sync::Arc<dyn ::sluice_store::ExpertStore>) {
            self.served.experts = store;
        }
        fn set_prefetch(&mut self, on: bool) {
            self.served.prefetch = on;
        }
        fn experts(&self) -> Option<&::std::sync::Arc<dyn ::sluice_store::ExpertStore>> {
            Some(&self.served.experts)
        }
        fn spine_index(&self) -> Result<Option<::sluice_store::SpineIndex>, $crate::ModelError> {
            $model::spine_index(self).map(Some)
        }
        fn spine_small_bytes(&self) -> u64 {
            $model::spine_small_bytes(self)
        }
        fn set_spine(
            &mut self,
            store: ::std::sync::Arc<::sluice_store::SpineStore>,
        ) -> Result<(), $crate::ModelError> {
            let index = $model::spine_index(self)?;
            self.served.set_spine(store, &index)
        }
        fn spine_stats(&self) -> ::sluice_store::SpineStats {
            self.served.spine.stats()
        }
    };
}
pub(crate) use served_methods;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kimi_k3::Route;
    use sluice_kernels::Pool;

    /// Rows of mixed magnitudes, so that an order change in a norm would show in the bits.
    fn rows(n: usize, d: usize) -> Vec<f32> {
        (0..n * d)
            .map(|i| {
                let v = f32::from(u16::try_from(i % 9973).unwrap_or(0));
                (v * 0.731).sin() * (1.0 + (v * 0.01).cos() * 40.0)
            })
            .collect()
    }

    #[test]
    fn a_prefills_norms_and_routes_ran_on_the_engine_thread_alone_now_on_the_pool_same_bits() {
        let d = 96;
        let w: Vec<f32> =
            (0..d).map(|i| 0.5 + f32::from(u8::try_from(i).unwrap_or(0)) / 64.0).collect();
        for n in [1, 15, 16, 17, 64, 257] {
            let x = rows(n, d);
            let mut want = vec![0.0f32; x.len()];
            for (i, o) in x.chunks_exact(d).zip(want.chunks_exact_mut(d)) {
                rms_norm(i, Some(&w), 1e-6, o);
            }
            let route = |l: &[f32]| {
                let mut ids: Vec<u32> = (0..u32::try_from(l.len()).unwrap_or(0)).collect();
                ids.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
                ids.truncate(3);
                Route { weights: ids.iter().map(|&i| l[i as usize]).collect(), ids }
            };
            let want_routes: Vec<Route> = x.chunks_exact(d).map(route).collect();
            for threads in [1, 2, 3, 16] {
                let pool = Pool::new(threads).expect("pool");
                let (got, routes) = pool.install(|| {
                    (norm_rows(&x, &w, d, 1e-6), crate::combine::routes_on_pool(&x, d, route))
                });
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{n} rows, {threads} threads");
                assert_eq!(routes.len(), n);
                for (g, w) in routes.iter().zip(&want_routes) {
                    assert_eq!((&g.ids, bits(&g.weights)), (&w.ids, bits(&w.weights)));
                }
            }
        }
    }
}
