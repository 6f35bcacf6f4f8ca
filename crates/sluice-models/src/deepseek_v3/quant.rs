//! The weight handle of the DeepSeek-V3 family and the two published quantized formats it reads:
//! FP8 e4m3 with 128×128 block scales (DeepSeek V3/R1, Kimi K2 Instruct) and compressed-tensors
//! pack-quantized INT4 (Kimi K2 Thinking's routed experts).
//!
//! [`Weight`] is the one type the forward pass multiplies by. A bf16 / f32 / int8 tensor is read
//! in place ([`Linear`]). An FP8 or INT4 tensor is, for now, dequantized once at load by the
//! scalar reference below into an owned f32 matrix; when `sluice-kernels` gains the
//! `Matrix::fp8_block` / `Matrix::int4_group` operands, [`Weight::get`] is the one place that
//! changes to read them in place. The dequantized values are exactly the ones the kernels will
//! compute (`f32(q) · scale` in f32), so the goldens do not change with the switch.
//!
//! - FP8 (DeepSeek-V3 `inference/kernel.py`, `weight_dequant`): `value[i, j] = f32(q[i, j]) ·
//!   weight_scale_inv[i / 128, j / 128]`, scales F32 `[ceil(rows/128), ceil(cols/128)]`; partial
//!   blocks on either axis.
//! - INT4 (compressed-tensors `pack_to_int32` / `unpack_from_int32`, symmetric, group 32): element
//!   `e` of a row is bits `4·(e mod 8)` of I32 word `e / 8`, stored as `q + 8`; `value = (nibble −
//!   8) · f32(weight_scale[row, e / 32])`, scales bf16 `[rows, cols/32]`.

use crate::qwen3::weights::Linear;
use sluice_checkpoint::Checkpoint;
use sluice_core::bf16_to_f32;
use sluice_kernels::Matrix;

/// The FP8 block edge (`weight_block_size` [128, 128]).
pub const FP8_BLOCK: usize = 128;
/// The INT4 group along the input axis.
pub const INT4_GROUP: usize = 32;

/// A linear layer's weight `[rows, cols]` (`[out, in]`).
#[derive(Debug, Clone)]
pub enum Weight {
    /// Read in place from the mapped shard (bf16, f32 or row-int8).
    Mapped(Linear),
    /// FP8-block or INT4-group weights, dequantized to f32 at load.
    Dequantized {
        /// Output rows.
        rows: usize,
        /// Input columns.
        cols: usize,
        /// `rows · cols` little-endian f32.
        data: Vec<u8>,
        /// Bytes of the stored tensors (quantized values and scales).
        stored: u64,
    },
}

impl Weight {
    /// The weight as a kernel operand.
    pub fn get<'a>(&'a self, ckpt: &'a Checkpoint) -> Matrix<'a> {
        match self {
            Self::Mapped(l) => l.get(ckpt),
            Self::Dequantized { rows, cols, data, .. } => Matrix::f32(*rows, *cols, data)
                .expect("invariant: the dequantized buffer holds rows · cols f32"),
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            Self::Mapped(l) => l.rows(),
            Self::Dequantized { rows, .. } => *rows,
        }
    }

    /// Bytes of the stored tensors in the checkpoint.
    pub fn byte_len(&self) -> u64 {
        match self {
            Self::Mapped(l) => l.byte_len(),
            Self::Dequantized { stored, .. } => *stored,
        }
    }
}

/// FP8 e4m3 (OCP "e4m3fn": bias 7, no infinities, `S.1111.111` is NaN) → f32, exactly.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let v =
        if exp == 0 { man / 8.0 * 2f32.powi(-6) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    sign * v
}

/// Dequantizes an FP8 matrix `q [rows, cols]` with F32 block scales `s [ceil(rows/128),
/// ceil(cols/128)]` (little-endian bytes, lengths checked by the caller).
pub fn dequant_fp8(q: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let bn = cols.div_ceil(FP8_BLOCK);
    let s: Vec<f32> =
        scales.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut out = Vec::with_capacity(rows * cols);
    for (i, row) in q.chunks_exact(cols).enumerate().take(rows) {
        let srow = &s[(i / FP8_BLOCK) * bn..(i / FP8_BLOCK + 1) * bn];
        out.extend(row.iter().enumerate().map(|(j, &b)| e4m3_to_f32(b) * srow[j / FP8_BLOCK]));
    }
    out
}

/// Dequantizes a pack-quantized INT4 matrix: `packed` I32 `[rows, cols/8]`, `scales` bf16
/// `[rows, cols/32]` (little-endian bytes, lengths checked by the caller; `cols % 32 == 0`).
pub fn dequant_int4(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    let (wpr, spr) = (cols / 8 * 4, cols / INT4_GROUP * 2);
    for i in 0..rows.min(packed.len() / wpr.max(1)) {
        let words = &packed[i * wpr..(i + 1) * wpr];
        let srow = &scales[i * spr..(i + 1) * spr];
        for e in 0..cols {
            let w = &words[(e / 8) * 4..(e / 8) * 4 + 4];
            let word = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            let nib = (word >> (4 * (e % 8))) & 0x0f;
            let g = e / INT4_GROUP;
            let scale = bf16_to_f32(u16::from_le_bytes([srow[2 * g], srow[2 * g + 1]]));
            #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
            let q = nib as i32 - 8;
            #[allow(clippy::cast_precision_loss)]
            out.push(q as f32 * scale);
        }
    }
    out
}

/// `v` as little-endian bytes.
pub(crate) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_every_class() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0, "the largest finite value");
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9), "the smallest subnormal");
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(e4m3_to_f32(0x78), 256.0, "exponent 15 is finite in e4m3fn");
    }

    #[test]
    fn fp8_blocks_cover_partial_edges() {
        // 130 × 129: blocks [2, 2]; element (129, 128) lies in the last, partial block.
        let (rows, cols) = (130, 129);
        let q = vec![0x38u8; rows * cols];
        let scales: Vec<u8> = to_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let v = dequant_fp8(&q, &scales, rows, cols);
        assert_eq!(
            (v[0], v[127], v[128], v[128 * cols], v[129 * cols + 128]),
            (1.0, 1.0, 2.0, 3.0, 4.0)
        );
    }

    #[test]
    fn int4_nibbles_are_offset_by_eight_low_first() {
        // One row of 32: word 0 holds elements 0..8 as q + 8; element 0 = 0xF → 7, element 1 = 0 → −8.
        let mut packed = vec![0u8; 16];
        packed[0] = 0x0f;
        for w in packed.chunks_exact_mut(4).skip(1) {
            w.copy_from_slice(&0x8888_8888u32.to_le_bytes());
        }
        let scale = 0x4000u16.to_le_bytes(); // bf16 2.0
        let v = dequant_int4(&packed, &scale, 1, 32);
        assert_eq!((v[0], v[1], v[2], v[8], v[31]), (14.0, -16.0, -16.0, 0.0, 0.0));
    }
}
