//! Advanced SIMD (NEON) pieces of the matmul loop nest ([`crate::tiled`]).
//!
//! A 16-lane accumulator is four 4-lane registers (lanes 0–3, 4–7, 8–11, 12–15), so a 2 × 3
//! tile's accumulators take 24 of the 32 vector registers. Weights are loaded as bytes (no
//! alignment) and widened exactly: bf16 by a widening shift left of 16; int8 by two widening
//! moves to i32 and conversion to f32 (exact; the row scale multiplies the reduced sum, see
//! [`crate::matmul`]); MXFP4 by
//! looking each nibble up in two byte tables that hold the low and high byte of the E2M1
//! value's bf16 pattern (every E2M1 value is exactly a bf16, its low 16 f32 bits are zero),
//! then widening that bf16 and multiplying by `e8m0_to_f32(s)`. Each is the reference's own
//! expression, so the widened weights equal the folded values bit for bit. Spans that
//! are not a multiple of 16 finish element by element.

use super::Row;
use crate::matmul::{e8m0_to_f32, E2M1};
use crate::tiled::{Kernel, Lanes};
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

/// The Advanced SIMD tier.
pub(crate) struct Neon;

impl Kernel for Neon {
    #[target_feature(enable = "neon")]
    unsafe fn decode(row: Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        let full = n - n % 16;
        match row {
            Row::F32(_) => {
                row.widen(c0, out);
                return;
            }
            Row::Bf16(w) => {
                let w = &w[2 * c0..2 * (c0 + n)];
                for i in (0..full).step_by(16) {
                    // SAFETY: `i + 16 <= n`, so the 32 bytes at `2 * i` lie inside `w` and the
                    // 16 f32 at `i` inside `out`.
                    unsafe {
                        let p = w.as_ptr().add(2 * i);
                        let [a, b] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p)));
                        let [c, d] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p.add(16))));
                        store4(out.as_mut_ptr().add(i), [a, b, c, d]);
                    }
                }
            }
            Row::Int8 { values, .. } => {
                let q = &values[c0..c0 + n];
                for i in (0..full).step_by(16) {
                    // SAFETY: `i + 16 <= n = q.len()` and `out` holds `n` f32.
                    unsafe {
                        let v = vreinterpretq_s8_u8(vld1q_u8(q.as_ptr().add(i)));
                        let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
                        let f = [
                            vmovl_s16(vget_low_s16(lo)),
                            vmovl_high_s16(lo),
                            vmovl_s16(vget_low_s16(hi)),
                            vmovl_high_s16(hi),
                        ]
                        .map(|w| vcvtq_f32_s32(w));
                        store4(out.as_mut_ptr().add(i), f);
                    }
                }
            }
            Row::Mxfp4 { packed, scales } => {
                assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
                mxfp4s(&packed[c0 / 2..(c0 + n) / 2], &scales[c0 / 32..(c0 + n) / 32], out);
                return;
            }
        }
        row.fold_values(c0 + full, &mut out[full..]);
    }

    #[target_feature(enable = "neon")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = w.first().map_or(0, |s| s.len());
        assert!(len.is_multiple_of(16), "fold span");
        assert!(w.iter().all(|s| s.len() == len) && x.iter().all(|s| s.len() == len));
        let mut a = [[[vdupq_n_f32(0.0); 4]; N]; R];
        for (ar, lanes_r) in a.iter_mut().zip(acc.iter()) {
            for (aj, lanes) in ar.iter_mut().zip(lanes_r.iter()) {
                // SAFETY: `lanes` holds 16 f32 and `4 * q + 4 <= 16`.
                *aj = [0, 1, 2, 3].map(|q| unsafe { vld1q_f32(lanes.as_ptr().add(4 * q)) });
            }
        }
        for c in (0..len).step_by(16) {
            for (xj, j) in x.iter().zip(0..N) {
                // SAFETY: `c + 16 <= len` and every slice is `len` long (asserted above).
                let xv = [0, 1, 2, 3].map(|q| unsafe { vld1q_f32(xj.as_ptr().add(c + 4 * q)) });
                for (wr, ar) in w.iter().zip(a.iter_mut()) {
                    for (q, (acc_q, xq)) in ar[j].iter_mut().zip(xv).enumerate() {
                        // SAFETY: as for the activations.
                        let wv = unsafe { vld1q_f32(wr.as_ptr().add(c + 4 * q)) };
                        *acc_q = vfmaq_f32(*acc_q, wv, xq);
                    }
                }
            }
        }
        for (ar, lanes_r) in a.iter().zip(acc) {
            for (regs, lanes) in ar.iter().zip(lanes_r.iter_mut()) {
                // SAFETY: `lanes` holds 16 f32.
                unsafe { store4(lanes.as_mut_ptr(), *regs) };
            }
        }
    }
}

/// Stores four registers to 16 consecutive f32.
///
/// # Safety
/// `p` points to 16 writable f32.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store4(p: *mut f32, v: [float32x4_t; 4]) {
    for (q, r) in v.into_iter().enumerate() {
        // SAFETY: guaranteed by the caller; `4 * q + 4 <= 16`.
        unsafe { vst1q_f32(p.add(4 * q), r) };
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

/// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each.
#[target_feature(enable = "neon")]
fn mxfp4s(packed: &[u8], scales: &[u8], out: &mut [f32]) {
    assert!(packed.len() == 16 * scales.len() && out.len() == 32 * scales.len());
    // SAFETY: both tables are 16 bytes.
    let (lo, hi) = unsafe { (vld1q_u8(E2M1_BF16_LO.as_ptr()), vld1q_u8(E2M1_BF16_HI.as_ptr())) };
    let mask = vdupq_n_u8(0x0F);
    for (b, &s) in scales.iter().enumerate() {
        let scale = vdupq_n_f32(e8m0_to_f32(s));
        // SAFETY: block `b < scales.len()` owns bytes `16 * b..16 * b + 16` of `packed`.
        let bytes = unsafe { vld1q_u8(packed.as_ptr().add(16 * b)) };
        // Byte i holds columns 2i (low nibble) and 2i + 1 (high nibble); zipping the two nibble
        // vectors puts column c's nibble in byte c (columns 0–15, then 16–31).
        let (l, h) = (vandq_u8(bytes, mask), vshrq_n_u8::<4>(bytes));
        for (half, nibbles) in [vzip1q_u8(l, h), vzip2q_u8(l, h)].into_iter().enumerate() {
            let v = decode16(nibbles, lo, hi, scale);
            // SAFETY: `32 * b + 16 * half + 16 <= out.len()`.
            unsafe { store4(out.as_mut_ptr().add(32 * b + 16 * half), v) };
        }
    }
}
