//! AVX-512F pieces of the matmul loop nest: a 16-lane accumulator is one register, so the
//! several-row fold takes tiles of up to 4 weight rows × 6 activation rows (24 accumulators,
//! the tile's 4 weight registers loaded once per step, 1 activation register) and never
//! spills.
//!
//! **Decoding.** bf16 widens by a 16-bit left shift into the high half of each f32 lane; int8
//! by sign-extension to i32 and conversion to f32 (exact; the row scale multiplies the reduced
//! sum, see [`crate::matmul`]); MXFP4 by `vpermps` over the 16 E2M1 values (it reads index
//! bits 0–3 of each lane) and one multiplication by `e8m0_to_f32(s)`. Each is the reference's
//! own expression, so the widened weights equal the folded values bit for bit, −0.0 and NaN
//! scales included. Spans that
//! are not a multiple of 16 finish element by element.
//!
//! One activation row (`fold_one`) widens each row's 16 columns in registers and folds them at
//! once, four rows per pass, with no buffer.
//!
//! Only AVX-512F instructions are used (no byte-granular masks, which need BW), so F alone
//! is required. All loads and stores are unaligned.

use super::{prefetch_line, same, tile_ahead, Row};
use crate::matmul::{e8m0_to_f32, E2M1};
use crate::tiled::{Kernel, Lanes};
use core::arch::x86_64::*;

/// The AVX-512F tier.
pub(crate) struct Avx512;

impl Kernel for Avx512 {
    const WIDE: bool = true;

    #[target_feature(enable = "avx512f")]
    unsafe fn decode(row: Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        let full = n - n % 16;
        match row {
            Row::F32(w) => {
                let w = &w[4 * c0..4 * (c0 + n)];
                for i in (0..full).step_by(16) {
                    // SAFETY: `i + 16 <= n`, and `w` holds `4 * n` bytes.
                    unsafe {
                        let v = _mm512_loadu_ps(w.as_ptr().add(4 * i).cast());
                        _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
                    }
                }
            }
            Row::Bf16(w) => {
                let w = &w[2 * c0..2 * (c0 + n)];
                for i in (0..full).step_by(16) {
                    // SAFETY: `i + 16 <= n`, and `w` holds `2 * n` bytes.
                    unsafe {
                        let raw = _mm256_loadu_si256(w.as_ptr().add(2 * i).cast());
                        _mm512_storeu_ps(out.as_mut_ptr().add(i), widen_bf16_512(raw));
                    }
                }
            }
            Row::Int8 { values, .. } => {
                let q = &values[c0..c0 + n];
                for i in (0..full).step_by(16) {
                    // SAFETY: `i + 16 <= n = q.len()`.
                    unsafe {
                        let raw = _mm_loadu_si128(q.as_ptr().add(i).cast());
                        let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
                        _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
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

    #[target_feature(enable = "avx512f")]
    unsafe fn fold_one<const R: usize>(
        rows: [Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        assert!(n.is_multiple_of(16), "fold_one span");
        let mut a = [_mm512_setzero_ps(); R];
        for (ar, lanes) in a.iter_mut().zip(acc.iter()) {
            // SAFETY: `lanes` holds 16 f32.
            *ar = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
        }
        let ahead = tile_ahead::<R>(rows[0]);
        match rows[0] {
            Row::F32(_) => {
                let w = same(rows, |r| match r {
                    Row::F32(w) => Some(&w[4 * c0..4 * (c0 + n)]),
                    _ => None,
                });
                f32_one(w, x, &mut a, ahead);
            }
            Row::Bf16(_) => {
                let w = same(rows, |r| match r {
                    Row::Bf16(w) => Some(&w[2 * c0..2 * (c0 + n)]),
                    _ => None,
                });
                bf16_one(w, x, &mut a, ahead);
            }
            Row::Int8 { .. } => {
                let w = same(rows, |r| match r {
                    Row::Int8 { values, .. } => Some(&values[c0..c0 + n]),
                    _ => None,
                });
                int8_one(w, x, &mut a, ahead);
            }
            Row::Mxfp4 { .. } => {
                assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
                let w = same(rows, |r| match r {
                    Row::Mxfp4 { packed, scales } => {
                        Some((&packed[c0 / 2..(c0 + n) / 2], &scales[c0 / 32..(c0 + n) / 32]))
                    }
                    _ => None,
                });
                mxfp4_one(w, x, &mut a, ahead);
            }
        }
        for (v, lanes) in a.iter().zip(acc) {
            // SAFETY: `lanes` holds 16 f32.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = w.first().map_or(0, |s| s.len());
        assert!(len.is_multiple_of(16), "fold span");
        assert!(w.iter().all(|s| s.len() == len) && x.iter().all(|s| s.len() == len));
        let mut a = [[_mm512_setzero_ps(); N]; R];
        for (ar, lanes_r) in a.iter_mut().zip(acc.iter()) {
            for (aj, lanes) in ar.iter_mut().zip(lanes_r.iter()) {
                // SAFETY: `lanes` holds 16 f32.
                *aj = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
            }
        }
        for c in (0..len).step_by(16) {
            // The tile's weights once per step (R registers), then each activation row against
            // all of them: R + N loads per R · N FMAs.
            let mut wv = [_mm512_setzero_ps(); R];
            for (v, wr) in wv.iter_mut().zip(&w) {
                // SAFETY: `c + 16 <= len` and every slice is `len` long (asserted above).
                *v = unsafe { _mm512_loadu_ps(wr.as_ptr().add(c)) };
            }
            for (xj, j) in x.iter().zip(0..N) {
                // SAFETY: as for the weights.
                let xv = unsafe { _mm512_loadu_ps(xj.as_ptr().add(c)) };
                for (v, ar) in wv.iter().zip(a.iter_mut()) {
                    ar[j] = _mm512_fmadd_ps(*v, xv, ar[j]);
                }
            }
        }
        for (ar, lanes_r) in a.iter().zip(acc) {
            for (v, lanes) in ar.iter().zip(lanes_r) {
                // SAFETY: `lanes` holds 16 f32.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
            }
        }
    }
}

/// f32 rows against one activation row.
#[target_feature(enable = "avx512f")]
fn f32_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut [__m512; R], ahead: usize) {
    assert!(w.iter().all(|w| w.len() == 4 * x.len()) && x.len().is_multiple_of(16));
    for c in (0..x.len()).step_by(16) {
        if (4 * c).is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(4 * c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`, and each row holds `4 * x.len()` bytes (asserted).
        let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
        for (wr, ar) in w.iter().zip(a.iter_mut()) {
            // SAFETY: as above.
            let wv = unsafe { _mm512_loadu_ps(wr.as_ptr().add(4 * c).cast()) };
            *ar = _mm512_fmadd_ps(wv, xv, *ar);
        }
    }
}

/// Sixteen bf16 → f32 by zero-extending to 32 bits and shifting into the high half.
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_bf16_512(v: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
}

/// bf16 rows against one activation row.
#[target_feature(enable = "avx512f")]
fn bf16_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut [__m512; R], ahead: usize) {
    assert!(w.iter().all(|w| w.len() == 2 * x.len()) && x.len().is_multiple_of(16));
    for c in (0..x.len()).step_by(16) {
        if (2 * c).is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(2 * c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`, and each row holds `2 * x.len()` bytes (asserted).
        let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
        for (wr, ar) in w.iter().zip(a.iter_mut()) {
            // SAFETY: as above.
            let raw = unsafe { _mm256_loadu_si256(wr.as_ptr().add(2 * c).cast()) };
            *ar = _mm512_fmadd_ps(widen_bf16_512(raw), xv, *ar);
        }
    }
}

/// int8 rows against one activation row: `f32(q)` folded (the row scale multiplies the
/// reduced sum, see [`crate::matmul`]).
#[target_feature(enable = "avx512f")]
fn int8_one<const R: usize>(w: [&[u8]; R], x: &[f32], a: &mut [__m512; R], ahead: usize) {
    assert!(w.iter().all(|q| q.len() == x.len()) && x.len().is_multiple_of(16));
    for c in (0..x.len()).step_by(16) {
        if c.is_multiple_of(64) {
            for wr in &w {
                prefetch_line(wr.as_ptr().wrapping_add(c + ahead));
            }
        }
        // SAFETY: `c + 16 <= x.len()`, and each row holds `x.len()` bytes (asserted).
        let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
        for (q, ar) in w.iter().zip(a.iter_mut()) {
            // SAFETY: as above.
            let raw = unsafe { _mm_loadu_si128(q.as_ptr().add(c).cast()) };
            let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
            *ar = _mm512_fmadd_ps(v, xv, *ar);
        }
    }
}

/// MXFP4 rows against one activation row, a block at a time, decoded as [`mxfp4s`] decodes.
#[target_feature(enable = "avx512f")]
fn mxfp4_one<const R: usize>(w: [(&[u8], &[u8]); R], x: &[f32], a: &mut [__m512; R], ahead: usize) {
    let blocks = x.len() / 32;
    assert!(x.len().is_multiple_of(32));
    assert!(w.iter().all(|(p, s)| p.len() == 16 * blocks && s.len() == blocks));
    // SAFETY: `E2M1` holds 16 f32.
    let lut = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
    for b in 0..blocks {
        if b.is_multiple_of(4) {
            for (packed, _) in &w {
                prefetch_line(packed.as_ptr().wrapping_add(16 * b + ahead));
            }
        }
        // SAFETY: `32 * b + 32 <= x.len()`.
        let xv = unsafe {
            [_mm512_loadu_ps(x.as_ptr().add(32 * b)), _mm512_loadu_ps(x.as_ptr().add(32 * b + 16))]
        };
        for ((packed, scales), ar) in w.iter().zip(a.iter_mut()) {
            let wv = decode_block(lut, &packed[16 * b..16 * b + 16], scales[b]);
            *ar = _mm512_fmadd_ps(wv[0], xv[0], *ar);
            *ar = _mm512_fmadd_ps(wv[1], xv[1], *ar);
        }
    }
}

/// One MXFP4 block (16 packed bytes, scale byte `s`) → columns 0–15 and 16–31.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_block(lut: __m512, packed: &[u8], s: u8) -> [__m512; 2] {
    assert_eq!(packed.len(), 16);
    let scale = _mm512_set1_ps(e8m0_to_f32(s));
    // SAFETY: `packed` is 16 bytes (asserted).
    let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().cast()) };
    // Byte i holds columns 2i (low nibble) and 2i + 1 (high nibble). Interleaving the bytes with
    // themselves shifted right by 4 puts column c's nibble in the low 4 bits of byte c; the high
    // 4 bits are junk that `vpermps` ignores (it reads index bits 0–3).
    let shifted = _mm_srli_epi16::<4>(bytes);
    let halves = [_mm_unpacklo_epi8(bytes, shifted), _mm_unpackhi_epi8(bytes, shifted)];
    halves.map(|h| _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(h), lut), scale))
}

/// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each.
#[target_feature(enable = "avx512f")]
fn mxfp4s(packed: &[u8], scales: &[u8], out: &mut [f32]) {
    assert!(packed.len() == 16 * scales.len() && out.len() == 32 * scales.len());
    // SAFETY: `E2M1` holds 16 f32.
    let lut = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
    for (b, &s) in scales.iter().enumerate() {
        let [lo, hi] = decode_block(lut, &packed[16 * b..16 * b + 16], s);
        // SAFETY: `32 * b + 32 <= out.len()`.
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr().add(32 * b), lo);
            _mm512_storeu_ps(out.as_mut_ptr().add(32 * b + 16), hi);
        }
    }
}
