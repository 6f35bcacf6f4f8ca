//! The simplest expert store: every expert mapped in place from the published shards. The
//! checkpoint's tensors are validated once at open, so serving an expert is a slice of the map.

use crate::{ExpertStore, ExpertView, StoreError, StoreStats};
use sluice_checkpoint::{Checkpoint, TensorEntry};
use sluice_core::DType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a model family names one expert's tensors and what shapes they have.
#[derive(Debug, Clone)]
pub struct ExpertTensorNames {
    /// For layer `l` and expert `e`, the six tensor names in the order w1 packed, w1 scale, w2
    /// packed, w2 scale, w3 packed, w3 scale.
    pub names: fn(prefix: &str, layer: usize, expert: usize) -> [String; 6],
    /// Expert FFN width (rows of w1/w3, cols of w2).
    pub inter: u64,
    /// Expert input width (cols of w1/w3, rows of w2).
    pub hidden: u64,
}

impl ExpertTensorNames {
    /// The `[rows, cols]` byte shapes of the six tensors, in the order of
    /// [`ExpertTensorNames::names`] (MXFP4: two values per packed byte, one scale per 32).
    pub fn shapes(&self) -> [[u64; 2]; 6] {
        let (i, h) = (self.inter, self.hidden);
        [[i, h / 2], [i, h / 32], [h, i / 2], [h, i / 32], [i, h / 2], [i, h / 32]]
    }
}

/// Experts served straight from the checkpoint's memory map.
#[derive(Debug)]
pub struct MappedExperts {
    ckpt: Arc<Checkpoint>,
    /// `layers[l]` is empty for layers without routed experts; otherwise six entries per expert.
    layers: Vec<Vec<[TensorEntry; 6]>>,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl MappedExperts {
    /// Resolves and checks every expert tensor of the `moe_layers` (each with `experts` experts)
    /// once; a missing tensor or wrong dtype/shape is an error naming the shard and tensor.
    pub fn open(
        ckpt: Arc<Checkpoint>,
        num_layers: usize,
        moe_layers: &[usize],
        experts: usize,
        names: &ExpertTensorNames,
    ) -> Result<Self, StoreError> {
        let prefix = ckpt.name_prefix().to_string();
        let shapes = names.shapes();
        let mut layers = vec![Vec::new(); num_layers];
        for &l in moe_layers {
            let mut v = Vec::with_capacity(experts);
            for e in 0..experts {
                let n = (names.names)(&prefix, l, e);
                let mut ents: Vec<TensorEntry> = Vec::with_capacity(6);
                for (name, shape) in n.iter().zip(&shapes) {
                    ents.push(ckpt.expect(name, DType::U8, shape)?.clone());
                }
                let arr: [TensorEntry; 6] = ents.try_into().map_err(|_| {
                    StoreError::Consumer("invariant: six expert tensors".to_string())
                })?;
                v.push(arr);
            }
            layers[l] = v;
        }
        Ok(Self { ckpt, layers, requests: AtomicU64::new(0), bytes: AtomicU64::new(0) })
    }

    /// Bytes of one expert of `layer` (0 if the layer has none).
    pub fn expert_bytes(&self, layer: usize) -> u64 {
        self.layers.get(layer).and_then(|v| v.first()).map_or(0, |e| e.iter().map(|t| t.len).sum())
    }
}

impl ExpertStore for MappedExperts {
    fn for_each(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let experts = self.layers.get(layer).map_or(0, Vec::len);
        for &id in ids {
            let Some(t) = self.layers.get(layer).and_then(|v| v.get(id as usize)) else {
                return Err(StoreError::NoSuchExpert { layer, expert: id, experts });
            };
            let b = |k: usize| self.ckpt.bytes(&t[k]);
            let view = ExpertView {
                w1_packed: b(0),
                w1_scale: b(1),
                w2_packed: b(2),
                w2_scale: b(3),
                w3_packed: b(4),
                w3_scale: b(5),
            };
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(t.iter().map(|e| e.len).sum(), Ordering::Relaxed);
            f(id, view)?;
        }
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_served: self.bytes.load(Ordering::Relaxed),
            ..StoreStats::default()
        }
    }
}
