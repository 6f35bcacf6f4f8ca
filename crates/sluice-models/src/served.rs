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

/// RMSNorm with weight `w` and epsilon `eps` on every row of `x [n, d]` (each family's
/// `*RMSNorm` over the hidden rows).
pub(crate) fn norm_rows(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (i, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(i, Some(w), eps, o);
    }
    out
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
