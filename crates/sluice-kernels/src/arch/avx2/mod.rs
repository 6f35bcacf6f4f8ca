//! AVX2+FMA pieces of the matmul loop nest ([`crate::tiled`]): a 16-lane accumulator is two
//! 8-lane registers (lanes 0–7, 8–15); a 2 × 3 tile's twelve accumulator registers leave four
//! of the sixteen for operands.
//!
//! **One activation row** (`fold_one`, the decode path) keeps widened weights in registers and
//! folds them at once, four rows per pass (two for MXFP4, see `mxfp4`). bf16 loads 16
//! bytes broadcast to both 128-bit lanes and widen with one in-lane byte shuffle per eight
//! values (cheaper than the cross-lane `vpmovzx` family): bf16 patterns go to the high half
//! of each f32 lane. int8 sign-extends eight values per load (`vpmovsxbd`, no shuffle table)
//! and converts them exactly; the row scale is applied to the reduced sum by the loop nest
//! (see [`crate::matmul`]), so a weight costs no multiplication.
//!
//! **Several activation rows** (`decode` + `fold`) widen a chunk into a buffer once and fold
//! it in register tiles; `decode` uses `vpmovzxwd`/`vpmovsxbd` and the reference's
//! expressions, and MXFP4's block decode (module `mxfp4`).
//!
//! The MXFP4 decode maps code 8 (−0.0) to +0.0. That never reaches a result: the fold computes
//! `fma(w, x, acc)`, which for `w = ±0` is `acc` when `acc ≠ 0`, +0.0 when `acc = ±0` (the
//! accumulator is never −0.0, see [`crate::tiled`]), and the same NaN when `x` is infinite or
//! NaN; the tests fold −0 weights against ±0, ±∞ and NaN.
//!
//! All loads and stores are unaligned: safetensors offsets carry no alignment. Each function
//! asserts the lengths its pointer arithmetic relies on before its loop.

mod mxfp4;

use super::{prefetch_line, same, tile_ahead, Row};
use crate::tiled::{fold_one_buffered, Kernel, Lanes};
use core::arch::x86_64::*;
use mxfp4::{all_fast, mxfp4_one, mxfp4s};
use sluice_core::bf16_to_f32;

/// The AVX2+FMA tier.
pub(crate) struct Avx2;

impl Kernel for Avx2 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode(row: Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        match row {
            Row::F32(w) => f32s(&w[4 * c0..4 * (c0 + n)], out),
            Row::Bf16(w) => bf16s(&w[2 * c0..2 * (c0 + n)], out),
            Row::Int8 { values, .. } => int8s(&values[c0..c0 + n], out),
            Row::Mxfp4 { packed, scales } => {
                assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
                mxfp4s(&packed[c0 / 2..(c0 + n) / 2], &scales[c0 / 32..(c0 + n) / 32], out);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = w.first().map_or(0, |s| s.len());
        assert!(len.is_multiple_of(16), "fold span");
        assert!(w.iter().all(|s| s.len() == len) && x.iter().all(|s| s.len() == len));
        let mut a = [[[_mm256_setzero_ps(); 2]; N]; R];
        for (ar, lanes_r) in a.iter_mut().zip(acc.iter()) {
            for (aj, lanes) in ar.iter_mut().zip(lanes_r.iter()) {
                // SAFETY: `lanes` holds 16 f32.
                *aj = unsafe {
                    [_mm256_loadu_ps(lanes.as_ptr()), _mm256_loadu_ps(lanes.as_ptr().add(8))]
                };
            }
        }
        for c in (0..len).step_by(16) {
            // One 8-lane half at a time: the tile's weights once (R registers), then each
            // activation row against all of them, so a 2 × 3 tile needs 12 accumulators + 2
            // weights + 1 activation = 15 registers and 5 loads per 6 FMAs.
            for h in 0..2 {
                let mut wv = [_mm256_setzero_ps(); R];
                for (v, wr) in wv.iter_mut().zip(&w) {
                    // SAFETY: `c + 16 <= len` and every slice is `len` long (asserted above).
                    *v = unsafe { _mm256_loadu_ps(wr.as_ptr().add(c + 8 * h)) };
                }
                for (xj, j) in x.iter().zip(0..N) {
                    // SAFETY: as for the weights.
                    let xv = unsafe { _mm256_loadu_ps(xj.as_ptr().add(c + 8 * h)) };
                    for (v, ar) in wv.iter().zip(a.iter_mut()) {
                        ar[j][h] = _mm256_fmadd_ps(*v, xv, ar[j][h]);
                    }
                }
            }
        }
        for (ar, lanes_r) in a.iter().zip(acc) {
            for ([lo, hi], lanes) in ar.iter().zip(lanes_r) {
                // SAFETY: `lanes` holds 16 f32.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *lo);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), *hi);
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_one<const R: usize>(
        rows: [Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        assert!(n.is_multiple_of(16), "fold_one span");
        if let Row::Mxfp4 { .. } = rows[0] {
            assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
            let slow = rows.iter().any(|r| match r {
                Row::Mxfp4 { scales, .. } => !all_fast(&scales[c0 / 32..(c0 + n) / 32]),
                _ => false,
            });
            if slow {
                // SAFETY: the caller guarantees AVX2 and FMA and the span.
                unsafe { fold_one_buffered::<Self, R>(rows, c0, x, acc) };
                return;
            }
        }
        let mut a = [[_mm256_setzero_ps(); 2]; R];
        for (ar, lanes) in a.iter_mut().zip(acc.iter()) {
            // SAFETY: `lanes` holds 16 f32.
            *ar = unsafe {
                [_mm256_loadu_ps(lanes.as_ptr()), _mm256_loadu_ps(lanes.as_ptr().add(8))]
            };
        }
        let ahead = tile_ahead::<R>(rows[0]);
        match rows[0] {
            Row::F32(_) => f32_one(
                same(rows, |r| match r {
                    Row::F32(w) => Some(&w[4 * c0..4 * (c0 + n)]),
                    _ => None,
                }),
                x,
                &mut a,
                ahead,
            ),
            Row::Bf16(_) => bf16_one(
                same(rows, |r| match r {
                    Row::Bf16(w) => Some(&w[2 * c0..2 * (c0 + n)]),
                    _ => None,
                }),
                x,
                &mut a,
                ahead,
            ),
            Row::Int8 { .. } => int8_one(
                same(rows, |r| match r {
                    Row::Int8 { values, .. } => Some(&values[c0..c0 + n]),
                    _ => None,
                }),
                x,
                &mut a,
                ahead,
            ),
            Row::Mxfp4 { .. } => {
                mxfp4_one(
                    same(rows, |r| match r {
                        Row::Mxfp4 { packed, scales } => {
                            Some((&packed[c0 / 2..(c0 + n) / 2], &scales[c0 / 32..(c0 + n) / 32]))
                        }
                        _ => None,
                    }),
                    x,
                    &mut a,
                    ahead,
                );
            }
        }
        for ([lo, hi], lanes) in a.iter().zip(acc) {
            // SAFETY: `lanes` holds 16 f32.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), *lo);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), *hi);
            }
        }
    }
}

/// Accumulator registers of a one-activation-row tile: lanes 0–7 and 8–15 per row.
pub(super) type Acc2<const R: usize> = [[__m256; 2]; R];

/// Byte-shuffle indices that turn eight bf16 (the same 16 bytes in both lanes) into eight f32:
/// dword `d` takes bytes `2d`, `2d + 1` in its high half and zeros in its low half.
const BF16_SPREAD: [u8; 32] = {
    let mut t = [0x80u8; 32];
    let mut d: u8 = 0;
    while d < 8 {
        t[4 * d as usize + 2] = 2 * d;
        t[4 * d as usize + 3] = 2 * d + 1;
        d += 1;
    }
    t
};

/// f32 rows against one activation row.
#[target_feature(enable = "avx2,fma")]
fn f32_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut Acc2<R>, ahead: usize) {
    assert!(w.iter().all(|w| w.len() == 4 * x.len()) && x.len().is_multiple_of(16));
    // A local copy: through `a` the compiler stores every accumulator on each step.
    let mut acc = *a;
    for c in (0..x.len()).step_by(16) {
        if (4 * c).is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(4 * c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`.
        let (xl, xh) =
            unsafe { (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8))) };
        for (wr, ar) in w.iter().zip(acc.iter_mut()) {
            // SAFETY: each row holds `4 * x.len()` bytes (asserted).
            let (wl, wh) = unsafe {
                let p = wr.as_ptr().add(4 * c).cast::<f32>();
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            };
            ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
            ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
        }
    }
    *a = acc;
}

/// bf16 rows against one activation row: each eight weights are one 16-byte broadcast load
/// and one in-lane byte shuffle that places every pattern in the high half of its f32 lane.
#[target_feature(enable = "avx2,fma")]
fn bf16_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut Acc2<R>, ahead: usize) {
    assert!(w.iter().all(|w| w.len() == 2 * x.len()) && x.len().is_multiple_of(16));
    // SAFETY: the table is 32 bytes.
    let spread = unsafe { _mm256_loadu_si256(BF16_SPREAD.as_ptr().cast()) };
    // A local copy: through `a` the compiler stores every accumulator on each step.
    let mut acc = *a;
    for c in (0..x.len()).step_by(16) {
        if (2 * c).is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(2 * c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`.
        let (xl, xh) =
            unsafe { (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8))) };
        for (wr, ar) in w.iter().zip(acc.iter_mut()) {
            // SAFETY: each row holds `2 * x.len()` bytes (asserted), so both 16-byte loads at
            // `2 * c` lie inside it.
            let (lo, hi) = unsafe {
                let p = wr.as_ptr().add(2 * c).cast::<__m128i>();
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(p)),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(1))),
                )
            };
            let wl = _mm256_castsi256_ps(_mm256_shuffle_epi8(lo, spread));
            let wh = _mm256_castsi256_ps(_mm256_shuffle_epi8(hi, spread));
            ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
            ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
        }
    }
    *a = acc;
}

/// int8 rows against one activation row: eight values are one sign-extending load
/// (`vpmovsxbd`) and an exact conversion; the integers are folded (the row scale multiplies
/// the reduced sum, see [`crate::matmul`]).
#[target_feature(enable = "avx2,fma")]
fn int8_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut Acc2<R>, ahead: usize) {
    assert!(w.iter().all(|q| q.len() == x.len()) && x.len().is_multiple_of(16));
    // A local copy: through `a` the compiler stores every accumulator on each step.
    let mut acc = *a;
    for c in (0..x.len()).step_by(16) {
        if c.is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`.
        let (xl, xh) =
            unsafe { (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8))) };
        for (q, ar) in w.iter().zip(acc.iter_mut()) {
            // SAFETY: each row holds `x.len()` bytes (asserted) and `c + 16 <= x.len()`, so
            // both 8-byte loads lie inside it.
            let (lo, hi) = unsafe {
                let p = q.as_ptr().add(c);
                (_mm_loadl_epi64(p.cast()), _mm_loadl_epi64(p.add(8).cast()))
            };
            let wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
            let wh = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
            ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
            ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
        }
    }
    *a = acc;
}

/// f32 weights: a copy, eight lanes at a time.
#[target_feature(enable = "avx2,fma")]
fn f32s(w: &[u8], out: &mut [f32]) {
    assert_eq!(w.len(), 4 * out.len());
    let full = out.len() - out.len() % 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= out.len()`, and `w` holds `4 * out.len()` bytes.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_loadu_ps(w.as_ptr().add(4 * i).cast()))
        };
    }
    for (o, b) in out[full..].iter_mut().zip(w[4 * full..].chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// bf16 weights: zero-extend each pattern to 32 bits and shift it into the high half.
#[target_feature(enable = "avx2,fma")]
fn bf16s(w: &[u8], out: &mut [f32]) {
    assert_eq!(w.len(), 2 * out.len());
    let full = out.len() - out.len() % 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= out.len()`, and `w` holds `2 * out.len()` bytes.
        unsafe {
            let raw = _mm_loadu_si128(w.as_ptr().add(2 * i).cast());
            let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_castsi256_ps(v));
        }
    }
    for (o, b) in out[full..].iter_mut().zip(w[2 * full..].chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// int8 weights: `f32(q)`, the folded values (the row scale is applied to the reduced sum).
#[target_feature(enable = "avx2,fma")]
fn int8s(q: &[u8], out: &mut [f32]) {
    assert_eq!(q.len(), out.len());
    let full = out.len() - out.len() % 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= out.len() = q.len()`.
        unsafe {
            let raw = _mm_loadl_epi64(q.as_ptr().add(i).cast());
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
    }
    for (o, &b) in out[full..].iter_mut().zip(&q[full..]) {
        *o = f32::from(i8::from_le_bytes([b]));
    }
}

/// Byte-shuffle indices that place byte `8k + i` of a 16-byte lane (the same 16 bytes in
/// both lanes) in the top byte of dword `i` and zero the other bytes: index `k` spreads
/// columns `8k .. 8k + 8` of a 16-column half, four per 128-bit lane.
pub(super) const SPREAD: [[u8; 32]; 2] = [spread(0), spread(8)];

/// Dword `d` (four per lane) takes byte `first + d` in its top byte; index 0x80 zeroes a byte.
const fn spread(first: u8) -> [u8; 32] {
    let mut t = [0x80u8; 32];
    let mut d: u8 = 0;
    while d < 8 {
        t[4 * d as usize + 3] = first + d;
        d += 1;
    }
    t
}
