//! What one routed expert is made of, as a model family describes it: a list of **parts**, each a
//! byte range of one checkpoint tensor with the dtype and shape that tensor must have. The store
//! resolves the parts once at open (checking dtype, shape and that the range lies inside the
//! tensor and the tensor inside its file), computes spans and slot sizes from them, and hands the
//! model an [`ExpertView`]: the parts' bytes, in the order the family listed them.
//!
//! A family whose experts are separate tensors (Kimi K3's six MXFP4 tensors, Qwen3-MoE's three
//! bf16 matrices) lists whole tensors; one that stacks all experts of a layer in one `[E, ...]`
//! tensor (GPT-OSS) lists expert `e`'s slice of each stacked tensor. The store never knows which
//! family it serves, nor what the bytes mean.

use crate::StoreError;
use sluice_checkpoint::{Checkpoint, TensorEntry};
use sluice_core::DType;
use std::ops::Range;

/// Most parts one expert may have (an [`ExpertView`] holds them without allocating).
pub const MAX_PARTS: usize = 8;

/// One piece of a routed expert: a byte range of one checkpoint tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPart {
    /// The tensor's name without the checkpoint's name prefix.
    pub tensor: String,
    /// The dtype the whole tensor must have.
    pub dtype: DType,
    /// The shape the whole tensor must have.
    pub shape: Vec<u64>,
    /// The expert's bytes inside the tensor (relative to the tensor's first byte).
    pub range: Range<u64>,
}

impl ExpertPart {
    /// The whole tensor `tensor` of `dtype` and `shape`.
    pub fn whole(tensor: String, dtype: DType, shape: &[u64]) -> Self {
        let len = shape.iter().product::<u64>() * dtype.size();
        Self { tensor, dtype, shape: shape.to_vec(), range: 0..len }
    }

    /// Expert `expert`'s slice of a tensor that stacks every expert of a layer along its first
    /// axis (`shape[0]` experts of equal size).
    pub fn stacked(tensor: String, dtype: DType, shape: &[u64], expert: u64) -> Self {
        let per = shape.iter().skip(1).product::<u64>() * dtype.size();
        Self { tensor, dtype, shape: shape.to_vec(), range: expert * per..(expert + 1) * per }
    }

    /// Bytes of this part.
    pub fn len(&self) -> u64 {
        self.range.end.saturating_sub(self.range.start)
    }

    /// True for a part of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a model family lays out its routed experts in the checkpoint.
pub trait ExpertLayout: Send + Sync + std::fmt::Debug {
    /// The parts of expert `expert` of `layer`, in the order the family's forward pass takes
    /// them from an [`ExpertView`] (at most [`MAX_PARTS`]).
    fn parts(&self, layer: usize, expert: usize) -> Vec<ExpertPart>;
}

/// Resolves the parts of expert `expert` of `layer` in `ckpt`: each tensor present with its
/// dtype and shape (`mapped`: and mapped by the checkpoint, for a store that slices the map),
/// each range inside its tensor. The entries returned cover exactly the parts' bytes (name,
/// shard, offset and length of the slice).
pub fn resolve(
    ckpt: &Checkpoint,
    layout: &dyn ExpertLayout,
    layer: usize,
    expert: usize,
    mapped: bool,
) -> Result<Vec<TensorEntry>, StoreError> {
    let parts = layout.parts(layer, expert);
    if parts.is_empty() || parts.len() > MAX_PARTS {
        return Err(StoreError::Config(format!(
            "an expert layout gave {} parts for expert {expert} of layer {layer}; 1 to \
             {MAX_PARTS} are supported",
            parts.len()
        )));
    }
    let prefix = ckpt.name_prefix();
    parts
        .iter()
        .map(|p| {
            let name = format!("{prefix}{}", p.tensor);
            let t = if mapped {
                ckpt.expect(&name, p.dtype, &p.shape)?
            } else {
                ckpt.locate(&name, p.dtype, &p.shape)?
            };
            if p.range.start > p.range.end || p.range.end > t.len {
                return Err(StoreError::Config(format!(
                    "expert {expert} of layer {layer}: bytes {}..{} of tensor {name} asked for, \
                     but it has {} bytes",
                    p.range.start, p.range.end, t.len
                )));
            }
            let mut e = t.clone();
            e.offset = t.offset + p.range.start;
            e.len = p.len();
            Ok(e)
        })
        .collect()
}

/// One expert's parts as byte slices, in the order its family's layout lists them.
#[derive(Debug, Clone, Copy)]
pub struct ExpertView<'a> {
    parts: [&'a [u8]; MAX_PARTS],
    len: usize,
}

impl<'a> ExpertView<'a> {
    /// A view of `parts` (`None` for more than [`MAX_PARTS`]).
    pub fn new(parts: &[&'a [u8]]) -> Option<Self> {
        if parts.len() > MAX_PARTS {
            return None;
        }
        let mut all: [&'a [u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        all[..parts.len()].copy_from_slice(parts);
        Some(Self { parts: all, len: parts.len() })
    }

    /// Every part, in layout order.
    pub fn parts(&self) -> &[&'a [u8]] {
        &self.parts[..self.len]
    }

    /// Part `k` (empty when the expert has fewer parts).
    pub fn part(&self, k: usize) -> &'a [u8] {
        if k < self.len {
            self.parts[k]
        } else {
            &[]
        }
    }

    /// Bytes of all parts.
    pub fn byte_len(&self) -> u64 {
        self.parts().iter().map(|p| p.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stacked_part_is_the_experts_slice() {
        let p = ExpertPart::stacked("x".into(), DType::U8, &[4, 3, 2, 16], 2);
        assert_eq!(p.range, 192..288);
        let w = ExpertPart::whole("y".into(), DType::BF16, &[3, 5]);
        assert_eq!(w.range, 0..30);
    }

    #[test]
    fn a_view_returns_its_parts_in_order() {
        let (a, b) = ([1u8, 2], [3u8]);
        let v = ExpertView::new(&[&a, &b]).expect("two parts");
        assert_eq!(v.parts(), &[&a[..], &b[..]]);
        assert_eq!(v.part(1), &b);
        assert!(v.part(5).is_empty());
        assert_eq!(v.byte_len(), 3);
        assert!(ExpertView::new(&[&a[..]; MAX_PARTS + 1]).is_none());
    }
}
