//! Advanced SIMD (NEON) bodies of the matmul inner loop.
//!
//! A 16-lane accumulator is four 4-lane registers (lanes 0–3, 4–7, 8–11, 12–15), so with a
//! group of [`GROUP`](super::GROUP) = 4 activation rows the accumulators take 16 of the 32
//! vector registers. Weights are loaded as bytes (no alignment) and widened exactly: bf16 by a
//! widening shift left of 16; MXFP4 by looking each nibble up in two byte tables that hold the
//! low and high byte of the E2M1 value's bf16 pattern (every E2M1 value is exactly a bf16, its
//! low 16 f32 bits are zero), then widening that bf16 and multiplying by the block scale
//! `e8m0_to_f32(s)`, which gives the scalar reference's `E2M1[nib] · e8m0_to_f32(s)` bit for bit.
//! A partial final chunk is folded from a zero-padded [`Tail`].

use super::{by_group_size, Row, Tail};
use crate::matmul::{e8m0_to_f32, reduce16, E2M1};
use core::arch::aarch64::*;

/// Byte `k` (2 = low, 3 = high byte of the bf16 half) of each E2M1 value's f32 pattern.
const fn e2m1_bytes(k: usize) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = E2M1[i].to_le_bytes()[k];
        i += 1;
    }
    t
}

/// Low byte of each E2M1 value's bf16 pattern.
const E2M1_BF16_LO: [u8; 16] = e2m1_bytes(2);
/// High byte of each E2M1 value's bf16 pattern.
const E2M1_BF16_HI: [u8; 16] = e2m1_bytes(3);

// Every E2M1 value must be exactly representable as bf16 for the table lookup to be exact.
const _: () = {
    let lo = e2m1_bytes(0);
    let mid = e2m1_bytes(1);
    let mut i = 0;
    while i < 16 {
        assert!(lo[i] == 0 && mid[i] == 0);
        i += 1;
    }
};

/// NEON dispatch on format and group size. Callers outside NEON code need `unsafe` and must
/// know the CPU supports Advanced SIMD; the bodies check every length they rely on.
#[target_feature(enable = "neon")]
pub(crate) fn neon_group(row: Row<'_>, cols: usize, x: &[f32], out: &mut [f32]) {
    match row {
        Row::F32(_) | Row::Bf16(_) => by_group_size!(out, dense(row, cols, x)),
        Row::Mxfp4 { packed, scales } => by_group_size!(out, mxfp4(packed, scales, cols, x)),
    }
}

/// Reduces each 16-lane accumulator in the canonical tree order.
#[target_feature(enable = "neon")]
#[inline]
fn finish<const N: usize>(acc: &[[float32x4_t; 4]; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for (o, regs) in out.iter_mut().zip(acc) {
        let mut lanes = [0.0f32; 16];
        for (q, r) in regs.iter().enumerate() {
            // SAFETY: `lanes` has room for 16 f32 and `4 * q + 4 <= 16`.
            unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * q), *r) };
        }
        *o = reduce16(lanes);
    }
    out
}

/// Folds one widened 16-column chunk into every row's accumulators.
///
/// # Safety
/// `c + 16 <= stride` and `x` points to `N * stride` activations (`stride` is `cols`, or 16
/// for a padded [`Tail`]).
#[target_feature(enable = "neon")]
#[inline]
unsafe fn fold<const N: usize>(
    acc: &mut [[float32x4_t; 4]; N],
    w: [float32x4_t; 4],
    x: *const f32,
    stride: usize,
    c: usize,
) {
    for (j, regs) in acc.iter_mut().enumerate() {
        for (q, (a, wq)) in regs.iter_mut().zip(w).enumerate() {
            // SAFETY: the caller guarantees 16 activations at `j * stride + c`; `4 * q + 4 <= 16`.
            let xv = unsafe { vld1q_f32(x.add(j * stride + c + 4 * q)) };
            *a = vfmaq_f32(*a, wq, xv);
        }
    }
}

/// Eight bf16 → two registers of four f32 (shift each 16-bit pattern into the high half).
#[target_feature(enable = "neon")]
#[inline]
fn widen_bf16(v: uint16x8_t) -> [float32x4_t; 2] {
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
    ]
}

/// f32 and bf16 weights.
#[target_feature(enable = "neon")]
fn dense<const N: usize>(row: Row<'_>, cols: usize, x: &[f32]) -> [f32; N] {
    row.assert_cols(cols);
    assert!(x.len() == N * cols);
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; 4]; N];
    let full = cols - cols % 16;
    match row {
        Row::F32(w) => {
            for c in (0..full).step_by(16) {
                // SAFETY: `c + 16 <= cols` and `w` holds `4 * cols` bytes (checked above), so the
                // four 16-byte loads lie inside `w`; `x` was checked.
                unsafe {
                    let p = w.as_ptr().add(4 * c);
                    let wv = [0, 1, 2, 3].map(|q| vreinterpretq_f32_u8(vld1q_u8(p.add(16 * q))));
                    fold(&mut acc, wv, x.as_ptr(), cols, c);
                }
            }
        }
        Row::Bf16(w) => {
            for c in (0..full).step_by(16) {
                // SAFETY: `c + 16 <= cols` and `w` holds `2 * cols` bytes (checked above), so the
                // two 16-byte loads lie inside `w`; `x` was checked.
                unsafe {
                    let p = w.as_ptr().add(2 * c);
                    let [a, b] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p)));
                    let [d, e] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p.add(16))));
                    fold(&mut acc, [a, b, d, e], x.as_ptr(), cols, c);
                }
            }
        }
        Row::Mxfp4 { .. } => unreachable!("dense body called on an MXFP4 row"),
    }
    if full < cols {
        let tail = Tail::<N>::new(row, cols, full, x);
        // SAFETY: `tail.w` is 16 f32 and `tail.x` is `N` contiguous rows of 16 f32.
        unsafe {
            let wv = [0, 1, 2, 3].map(|q| vld1q_f32(tail.w.as_ptr().add(4 * q)));
            fold(&mut acc, wv, tail.x.as_ptr().cast(), 16, 0);
        }
    }
    finish(&acc)
}

/// Sixteen nibbles (one per byte, values 0–15) → E2M1 × scale in four registers.
#[target_feature(enable = "neon")]
#[inline]
fn decode16(
    nibbles: uint8x16_t,
    lo: uint8x16_t,
    hi: uint8x16_t,
    scale: float32x4_t,
) -> [float32x4_t; 4] {
    let l = vqtbl1q_u8(lo, nibbles);
    let h = vqtbl1q_u8(hi, nibbles);
    // Interleaving low and high bytes gives little-endian bf16 patterns, columns 0–7 and 8–15.
    let [a, b] = widen_bf16(vreinterpretq_u16_u8(vzip1q_u8(l, h)));
    let [c, d] = widen_bf16(vreinterpretq_u16_u8(vzip2q_u8(l, h)));
    [a, b, c, d].map(|v| vmulq_f32(v, scale))
}

/// MXFP4 weights: one 16-byte load per 32-column block.
#[target_feature(enable = "neon")]
fn mxfp4<const N: usize>(packed: &[u8], scales: &[u8], cols: usize, x: &[f32]) -> [f32; N] {
    assert!(cols.is_multiple_of(32) && packed.len() == cols / 2 && scales.len() == cols / 32);
    assert!(x.len() == N * cols);
    // SAFETY: both tables are 16 bytes.
    let (lo, hi) = unsafe { (vld1q_u8(E2M1_BF16_LO.as_ptr()), vld1q_u8(E2M1_BF16_HI.as_ptr())) };
    let mask = vdupq_n_u8(0x0F);
    let mut acc = [[vdupq_n_f32(0.0); 4]; N];
    for (b, &s) in scales.iter().enumerate() {
        let scale = vdupq_n_f32(e8m0_to_f32(s));
        // SAFETY: block `b < cols / 32` owns bytes `16 * b..16 * b + 16` of `packed`.
        let bytes = unsafe { vld1q_u8(packed.as_ptr().add(16 * b)) };
        // Byte i holds columns 2i (low nibble) and 2i + 1 (high nibble); zipping the two nibble
        // vectors puts column c's nibble in byte c (columns 0–15, then 16–31).
        let (l, h) = (vandq_u8(bytes, mask), vshrq_n_u8::<4>(bytes));
        for (half, nibbles) in [vzip1q_u8(l, h), vzip2q_u8(l, h)].into_iter().enumerate() {
            let wv = decode16(nibbles, lo, hi, scale);
            // SAFETY: `32 * b + 16 * half + 16 <= cols` and `x` was checked.
            unsafe { fold(&mut acc, wv, x.as_ptr(), cols, 32 * b + 16 * half) };
        }
    }
    finish(&acc)
}
