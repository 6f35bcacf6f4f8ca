//! Advanced SIMD (NEON) pieces of the matmul loop nest ([`crate::tiled`]) that every weight
//! format shares.
//!
//! A 16-lane accumulator is four 4-lane registers (lanes 0–3, 4–7, 8–11, 12–15), so a 2 × 3
//! tile's accumulators take 24 of the 32 vector registers. Decoding is each format's
//! `neon_decode` hook (in `crate::formats`); [`widen_bf16`] and [`store4`] are the pieces they
//! share. The one-activation-row case takes the buffered default (decode a chunk, then fold).

use crate::formats::Format;
use crate::tiled::{Kernel, Lanes};
use core::arch::aarch64::*;

/// The Advanced SIMD tier.
pub(crate) struct Neon;

impl Kernel for Neon {
    #[target_feature(enable = "neon")]
    unsafe fn decode<F: Format>(row: F::Row<'_>, c0: usize, out: &mut [f32]) {
        // SAFETY: the caller guarantees Advanced SIMD.
        unsafe { F::neon_decode(row, c0, out) }
    }

    #[target_feature(enable = "neon")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = crate::tiled::span_len(&w, &x);
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
pub(crate) unsafe fn store4(p: *mut f32, v: [float32x4_t; 4]) {
    for (q, r) in v.into_iter().enumerate() {
        // SAFETY: guaranteed by the caller; `4 * q + 4 <= 16`.
        unsafe { vst1q_f32(p.add(4 * q), r) };
    }
}

/// Eight bf16 → two registers of four f32 (shift each 16-bit pattern into the high half).
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn widen_bf16(v: uint16x8_t) -> [float32x4_t; 2] {
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
    ]
}
