//! The simplest expert store: every expert mapped in place from the published shards. The
//! checkpoint's tensors are validated once at open (parts as the family's [`ExpertLayout`]
//! describes them), so serving an expert is a few slices of the map, and every expert of a
//! layer is resident at once ([`ExpertStore::with_all`]: a layer's experts batched into a few
//! kernel calls).
//!
//! [`ExpertStore::populate`] enters every expert's pages in the page tables at load, on a few
//! threads. Without it the first pass took the faults: a 256-token prefill touches nearly every
//! expert, and its threads faulted in gigabytes 64 KiB at a time, inside the timed pass, where
//! llama.cpp (which maps with `MAP_POPULATE`) pays them at load (docs/PERFORMANCE.md, session 19).

use crate::layout::{resolve, ExpertLayout, MAX_PARTS};
use crate::platform::advice;
use crate::{AllExperts, ExpertStore, ExpertView, StoreError, StoreStats};
use sluice_checkpoint::{Checkpoint, TensorEntry};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes [`ExpertStore::populate`] hands one thread at a time.
const POPULATE_PIECE: usize = 64 << 20;
/// Most threads [`ExpertStore::populate`] runs on: page faults of one process share its page
/// table locks, so more threads than this add little.
const POPULATE_THREADS: usize = 8;

/// Experts served straight from the checkpoint's memory map.
#[derive(Debug)]
pub struct MappedExperts {
    ckpt: Arc<Checkpoint>,
    /// `layers[l]` is empty for layers without routed experts; otherwise each expert's parts.
    layers: Vec<Vec<Vec<TensorEntry>>>,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl MappedExperts {
    /// Resolves and checks every expert part of the `moe_layers` (each with `experts` experts)
    /// once, as `layout` describes them; a missing tensor or wrong dtype/shape is an error naming
    /// the shard and tensor.
    pub fn open(
        ckpt: Arc<Checkpoint>,
        num_layers: usize,
        moe_layers: &[usize],
        experts: usize,
        layout: &dyn ExpertLayout,
    ) -> Result<Self, StoreError> {
        let mut layers = vec![Vec::new(); num_layers];
        for &l in moe_layers {
            let Some(slot) = layers.get_mut(l) else {
                return Err(StoreError::Config(format!(
                    "MoE layer {l} is outside the model's {num_layers} layers"
                )));
            };
            *slot = (0..experts)
                .map(|e| resolve(&ckpt, layout, l, e, true))
                .collect::<Result<Vec<_>, _>>()?;
        }
        Ok(Self { ckpt, layers, requests: AtomicU64::new(0), bytes: AtomicU64::new(0) })
    }

    /// Bytes of one expert of `layer` (0 if the layer has none).
    pub fn expert_bytes(&self, layer: usize) -> u64 {
        self.layers.get(layer).and_then(|v| v.first()).map_or(0, |e| e.iter().map(|t| t.len).sum())
    }
}

impl MappedExperts {
    /// Expert `id` of `layer` as slices of the map, counted as one request of its bytes.
    fn view(&self, layer: usize, id: u32) -> Result<ExpertView<'_>, StoreError> {
        let experts = self.layers.get(layer).map_or(0, Vec::len);
        let Some(t) = self.layers.get(layer).and_then(|v| v.get(id as usize)) else {
            return Err(StoreError::NoSuchExpert { layer, expert: id, experts });
        };
        let mut parts: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        for (p, e) in parts.iter_mut().zip(t) {
            *p = self.ckpt.bytes(e);
        }
        let view = ExpertView::new(&parts[..t.len()])
            .expect("invariant: resolve gives at most MAX_PARTS parts");
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(t.iter().map(|e| e.len).sum(), Ordering::Relaxed);
        Ok(view)
    }
}

impl ExpertStore for MappedExperts {
    fn for_each(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut order = ids.to_vec();
        order.sort_unstable();
        for id in order {
            let view = self.view(layer, id)?;
            f(id, view)?;
        }
        Ok(())
    }

    fn with_all(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut AllExperts<'_>,
    ) -> Result<bool, StoreError> {
        let mut order = ids.to_vec();
        order.sort_unstable();
        let all = order
            .into_iter()
            .map(|id| Ok((id, self.view(layer, id)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        f(&all)?;
        Ok(true)
    }

    fn populate(&self) -> Result<u64, StoreError> {
        // Every part's bytes, cut into pieces that a few threads share.
        let pieces: Vec<&[u8]> = self
            .layers
            .iter()
            .flatten()
            .flatten()
            .flat_map(|e| self.ckpt.bytes(e).chunks(POPULATE_PIECE))
            .collect();
        let next = AtomicUsize::new(0);
        let threads =
            std::thread::available_parallelism().map_or(1, usize::from).min(POPULATE_THREADS);
        let work = || {
            while let Some(bytes) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                // A failure costs the first pass its faults, not correctness.
                let _ = advice::populate(bytes);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(work);
            }
            work();
        });
        Ok(pieces.iter().map(|p| p.len() as u64).sum())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_served: self.bytes.load(Ordering::Relaxed),
            ..StoreStats::default()
        }
    }
}
