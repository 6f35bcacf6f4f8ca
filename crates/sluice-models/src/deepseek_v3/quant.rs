//! The weight handle of the DeepSeek-V3 family: one type for the three ways a linear layer is
//! published — bf16 / f32 (or sluice's row-int8) read as is, FP8 e4m3 with 128×128 block scales
//! (DeepSeek V3/R1, Kimi K2 Instruct), and compressed-tensors pack-quantized INT4 (Kimi K2
//! Thinking's routed experts). All three are kernel operands over the mapped shard bytes; the
//! formats themselves (values, SIMD tiers, batch invariance) live in `sluice-kernels`
//! (`formats/fp8_block.rs`, `formats/int4_group.rs`):
//!
//! - FP8: `value[i, j] = f32(q[i, j]) · weight_scale_inv[i / 128, j / 128]` (DeepSeek-V3
//!   `inference/kernel.py`, `weight_dequant`), scales F32 `[ceil(rows/128), ceil(cols/128)]`;
//!   partial blocks on either axis.
//! - INT4 (compressed-tensors `pack_to_int32`, symmetric, group 32): element `e` of a row is bits
//!   `4·(e mod 8)` of I32 word `e / 8`, stored as `q + 8`; `value = (nibble − 8) ·
//!   f32(weight_scale[row, e / 32])`, scales bf16 `[rows, cols/32]`.

use crate::qwen3::weights::Linear;
use crate::spine::{self, TensorBytes};
use sluice_checkpoint::TensorEntry;
use sluice_kernels::Matrix;
use sluice_store::spine::TensorRange;

/// The FP8 block edge (`weight_block_size` [128, 128]).
pub const FP8_BLOCK: usize = 128;
/// The INT4 group along the input axis.
pub const INT4_GROUP: usize = 32;

/// A linear layer's weight `[rows, cols]` (`[out, in]`), resolved and checked at load.
#[derive(Debug, Clone)]
pub enum Weight {
    /// bf16, f32 or row-int8.
    Mapped(Linear),
    /// FP8 e4m3 `weight` with its F32 `weight_scale_inv`.
    Fp8 {
        /// `P.weight`.
        weight: TensorEntry,
        /// `P.weight_scale_inv`.
        scale: TensorEntry,
        /// Output rows.
        rows: usize,
        /// Input columns.
        cols: usize,
    },
    /// INT4 `weight_packed` with its bf16 `weight_scale` (and the `weight_shape` counted in
    /// `extra`).
    Int4 {
        /// `P.weight_packed`.
        packed: TensorEntry,
        /// `P.weight_scale`.
        scale: TensorEntry,
        /// Bytes of `P.weight_shape`.
        extra: u64,
        /// Output rows.
        rows: usize,
        /// Input columns.
        cols: usize,
    },
}

impl Weight {
    /// The weight as a kernel operand over the bytes `src` holds (the mapped checkpoint, or
    /// the placed spine piece of its layer, which holds its scales too).
    pub fn get<'a>(&self, src: &'a dyn TensorBytes) -> Matrix<'a> {
        let b = |e: &TensorEntry| {
            src.tensor_bytes(e).expect("invariant: a spine piece holds every tensor of its layer")
        };
        let m = match self {
            Self::Mapped(l) => return l.get(src),
            Self::Fp8 { weight, scale, rows, cols } => {
                Matrix::fp8_block(*rows, *cols, b(weight), b(scale))
            }
            Self::Int4 { packed, scale, rows, cols, .. } => {
                Matrix::int4_group(*rows, *cols, b(packed), b(scale))
            }
        };
        m.expect("invariant: dtypes and shapes were checked at load")
    }

    /// The byte ranges a pass reads for this weight (values and scales; an INT4 weight's
    /// `weight_shape`, read once at load, is not among them).
    pub fn ranges(&self) -> Vec<TensorRange> {
        match self {
            Self::Mapped(l) => spine::ranges(l),
            Self::Fp8 { weight: a, scale: b, .. } | Self::Int4 { packed: a, scale: b, .. } => {
                vec![spine::range_of(a), spine::range_of(b)]
            }
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            Self::Mapped(l) => l.rows(),
            Self::Fp8 { rows, .. } | Self::Int4 { rows, .. } => *rows,
        }
    }

    /// Bytes of the stored tensors in the checkpoint (values and scales).
    pub fn byte_len(&self) -> u64 {
        match self {
            Self::Mapped(l) => l.byte_len(),
            Self::Fp8 { weight, scale, .. } => weight.len + scale.len,
            Self::Int4 { packed, scale, extra, .. } => packed.len + scale.len + extra,
        }
    }
}
