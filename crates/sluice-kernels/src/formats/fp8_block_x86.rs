//! The x86 kernels of FP8 block rows ([`super`]): the decode of 8 (AVX2 with F16C) or 16
//! (AVX-512) codes through IEEE halves, the one-row folds that decode in registers, and the
//! tiles of the few-row nest ([`crate::stored`]) that fold a few activation rows straight from
//! the stored codes. See the parent module for why codes widen through halves.

use super::{Fp8Row, BLOCK_EDGE};
use crate::arch::avx2::{load2, store2, Acc2};
use crate::arch::avx512::{load1, load_tile, store1, store_tile};
use crate::arch::prefetch_line;
use crate::tiled::Lanes;
use core::arch::x86_64::*;

/// A code sign-extended to 16 bits and shifted left by 7, with bit 14 (a copy of the sign)
/// cleared: the half with the code's sign, exponent and mantissa bits.
const HALF_FIELDS: i16 = 0xBFFF_u16.cast_signed();
/// What a NaN code (`0x7F`, `0xFF`) widens to, in magnitude: `480 · 2^-8`. No other code
/// widens to it (the largest finite code is `448`).
const NAN_HALF: f32 = 1.875;
/// 2^8, which turns a widened code into its value.
const TWO_8: f32 = 256.0;

/// The AVX2 decode's constants.
pub(super) struct Consts {
    fields: __m128i,
    abs: __m256,
    nan_half: __m256,
    two_8: __m256,
    nan: __m256,
}

impl Consts {
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn new() -> Self {
        Self {
            fields: _mm_set1_epi16(HALF_FIELDS),
            abs: _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)),
            nan_half: _mm256_set1_ps(NAN_HALF),
            two_8: _mm256_set1_ps(TWO_8),
            nan: _mm256_set1_ps(f32::from_bits(0x7FC0_0000)),
        }
    }
}

/// Eight codes at `p` → `e4m3 · 2^-8` each, and the lanes holding a NaN code.
///
/// # Safety
/// `p` points to 8 readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen8(k: &Consts, p: *const u8) -> (__m256, __m256) {
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { _mm_loadl_epi64(p.cast()) };
    let half = _mm_and_si128(_mm_slli_epi16::<7>(_mm_cvtepi8_epi16(raw)), k.fields);
    let v = _mm256_cvtph_ps(half);
    let is_nan = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(v, k.abs), k.nan_half);
    (v, is_nan)
}

/// Eight codes → their values times `scale` (see the module docs).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn decode8(k: &Consts, codes: &[u8], scale: f32) -> __m256 {
    assert!(codes.len() == 8);
    // SAFETY: `codes` is 8 bytes (asserted).
    let (v, is_nan) = unsafe { widen8(k, codes.as_ptr()) };
    let v = _mm256_blendv_ps(_mm256_mul_ps(v, k.two_8), k.nan, is_nan);
    _mm256_mul_ps(v, _mm256_set1_ps(scale))
}

/// A block scale times 2^8, the factor the one-row kernels multiply a widened code by (one
/// multiplication instead of two: the real product is the same, so it rounds the same), or
/// `None` when that product overflows though the scale is finite (|s| ≥ 2^120, never in a
/// published checkpoint), where the buffered two-multiplication decode runs.
#[inline]
pub(super) fn fused_scale(s: f32) -> Option<f32> {
    let f = s * TWO_8;
    (f.is_finite() || !s.is_finite()).then_some(f)
}

/// Whether every block scale `rows` use over columns `c0..c0 + n` fuses ([`fused_scale`]),
/// so a one-row kernel may run them; otherwise the buffered decode runs.
fn scales_fuse(rows: &[Fp8Row<'_>], c0: usize, n: usize) -> bool {
    let blocks = c0 / BLOCK_EDGE..(c0 + n).div_ceil(BLOCK_EDGE);
    rows.iter().all(|r| blocks.clone().all(|b| fused_scale(r.scale(b)).is_some()))
}

/// Eight codes at `p` → their values times the block scale, given as `scale · 2^8`.
///
/// # Safety
/// `p` points to 8 readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode8_fused(k: &Consts, p: *const u8, scale: __m256) -> __m256 {
    // SAFETY: guaranteed by the caller.
    let (v, is_nan) = unsafe { widen8(k, p) };
    _mm256_blendv_ps(_mm256_mul_ps(v, scale), k.nan, is_nan)
}

/// FP8 rows against one activation row: 16 columns of each row decoded in registers and
/// folded at once, a 128-column scale block at a time; each 64 bytes of a row consumed
/// prefetch a line of the next tile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fold_one_avx2<const R: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: [&mut Lanes; R],
) {
    let n = x.len();
    assert!(c0.is_multiple_of(16) && n.is_multiple_of(16), "fp8 span");
    assert!(rows.iter().all(|r| c0 + n <= r.codes.len()));
    if !scales_fuse(&rows, c0, n) {
        // SAFETY: AVX2 and FMA are enabled here; the span suits `fold_one`.
        unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx2::Avx2, super::Fp8Block, R>(
                rows, c0, x, lanes,
            );
        }
        return;
    }
    let ahead = R * rows[0].codes.len();
    let k = Consts::new();
    let mut acc = load2(&lanes);
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales: [f32; R] =
            std::array::from_fn(|i| fused_scale(rows[i].scale(b)).unwrap_or(f32::NAN));
        while c < end {
            let col = c0 + c;
            if col.is_multiple_of(64) {
                for r in &rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            // SAFETY: `c + 16 <= n = x.len()`.
            let (xl, xh) = unsafe {
                (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)))
            };
            for ((r, ar), s) in rows.iter().zip(acc.iter_mut()).zip(&scales) {
                let s = _mm256_broadcast_ss(s);
                // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted above).
                let (wl, wh) = unsafe {
                    let p = r.codes.as_ptr().add(col);
                    (decode8_fused(&k, p, s), decode8_fused(&k, p.add(8), s))
                };
                ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
                ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
            }
            c += 16;
        }
    }
    store2(&acc, lanes);
}

/// FP8 rows against `N` activation rows (AVX2 with F16C, [`crate::stored`]'s tile), folded
/// from the stored codes one 8-lane half of each 16-column step at a time, as
/// `arch::avx2::stored`'s tile folds bf16: each row's 8 codes decoded in a register once
/// ([`decode8_fused`]) and folded into its N accumulators' half, in the order the panel's
/// fold takes them, so the bits are the buffered decode's. A span whose scales do not fuse
/// takes the buffered decode. When `ahead` is not 0, each row's codes `ahead` on from its
/// span are named to the prefetcher, a line per 64 columns read.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tile_avx2<const R: usize, const N: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: [&[f32]; N],
    mut lanes: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    assert!(c0.is_multiple_of(16) && n.is_multiple_of(16), "fp8 span");
    assert!(x.iter().all(|s| s.len() == n));
    assert!(rows.iter().all(|r| c0 + n <= r.codes.len()));
    if !scales_fuse(&rows, c0, n) {
        // SAFETY: AVX2 and FMA are enabled here; the span suits `fold_stored`.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx2::Avx2, super::Fp8Block, R, N>(
                rows, c0, x, lanes,
            );
        }
        return;
    }
    let k = Consts::new();
    let mut a: [Acc2<N>; R] = std::array::from_fn(|r| load2(&lanes[r].each_mut()));
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales: [__m256; R] = std::array::from_fn(|i| {
            _mm256_set1_ps(fused_scale(rows[i].scale(b)).unwrap_or(f32::NAN))
        });
        while c < end {
            let col = c0 + c;
            if ahead != 0 && col.is_multiple_of(64) {
                for r in &rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            for h in 0..2 {
                // SAFETY: `col + 8h + 8 <= c0 + n <= r.codes.len()` (asserted above).
                let wv: [__m256; R] = std::array::from_fn(|r| unsafe {
                    decode8_fused(&k, rows[r].codes.as_ptr().add(col + 8 * h), scales[r])
                });
                for (j, &xj) in xp.iter().enumerate() {
                    // SAFETY: `c + 8h + 8 <= n`, each `x[j]`'s length (asserted).
                    let xv = unsafe { _mm256_loadu_ps(xj.add(c + 8 * h)) };
                    for (v, ar) in wv.iter().zip(a.iter_mut()) {
                        ar[j][h] = _mm256_fmadd_ps(*v, xv, ar[j][h]);
                    }
                }
            }
            c += 16;
        }
    }
    for (ar, lanes_r) in a.iter().zip(lanes.iter_mut()) {
        store2(ar, lanes_r.each_mut());
    }
}

/// The AVX-512 decode's constants.
pub(super) struct Consts512 {
    fields: __m256i,
    nan_half: __m512,
    two_8: __m512,
    nan: __m512,
}

impl Consts512 {
    #[target_feature(enable = "avx512f")]
    pub(super) fn new() -> Self {
        Self {
            fields: _mm256_set1_epi16(HALF_FIELDS),
            nan_half: _mm512_set1_ps(NAN_HALF),
            two_8: _mm512_set1_ps(TWO_8),
            nan: _mm512_set1_ps(f32::from_bits(0x7FC0_0000)),
        }
    }
}

/// Sixteen codes at `p` → `e4m3 · 2^-8` each, and the lanes holding a finite code (a
/// widened code is never NaN itself, so "not equal" is "not a NaN code").
///
/// # Safety
/// `p` points to 16 readable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen16(k: &Consts512, p: *const u8) -> (__m512, __mmask16) {
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { _mm_loadu_si128(p.cast()) };
    let half = _mm256_and_si256(_mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(raw)), k.fields);
    let v = _mm512_cvtph_ps(half);
    let finite = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(_mm512_abs_ps(v), k.nan_half);
    (v, finite)
}

/// Sixteen codes → their values times `scale`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn decode16(k: &Consts512, codes: &[u8], scale: f32) -> __m512 {
    assert!(codes.len() == 16);
    // SAFETY: `codes` is 16 bytes (asserted).
    let (v, finite) = unsafe { widen16(k, codes.as_ptr()) };
    let v = _mm512_mask_mul_ps(k.nan, finite, v, k.two_8);
    _mm512_mul_ps(v, _mm512_set1_ps(scale))
}

/// Sixteen codes at `p` → their values times the block scale, given as `scale · 2^8`: the
/// NaN codes' lanes take the canonical NaN in the masked multiplication itself (a blend
/// after it was one more instruction per 16 weights).
///
/// # Safety
/// `p` points to 16 readable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn decode16_fused(k: &Consts512, p: *const u8, scale: __m512) -> __m512 {
    // SAFETY: guaranteed by the caller.
    let (v, finite) = unsafe { widen16(k, p) };
    _mm512_mask_mul_ps(k.nan, finite, v, scale)
}

/// FP8 rows against one activation row (AVX-512), as [`fold_one_avx2`].
#[target_feature(enable = "avx512f")]
pub(super) fn fold_one_avx512<const R: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: [&mut Lanes; R],
) {
    let n = x.len();
    assert!(c0.is_multiple_of(16) && n.is_multiple_of(16), "fp8 span");
    assert!(rows.iter().all(|r| c0 + n <= r.codes.len()));
    if !scales_fuse(&rows, c0, n) {
        // SAFETY: AVX-512F is enabled here; the span suits `fold_one`.
        unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx512::Avx512, super::Fp8Block, R>(
                rows, c0, x, lanes,
            );
        }
        return;
    }
    let ahead = R * rows[0].codes.len();
    let k = Consts512::new();
    let mut acc = load1(&lanes);
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales: [__m512; R] = std::array::from_fn(|i| {
            _mm512_set1_ps(fused_scale(rows[i].scale(b)).unwrap_or(f32::NAN))
        });
        while c < end {
            let col = c0 + c;
            if col.is_multiple_of(64) {
                for r in &rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            // SAFETY: `c + 16 <= n = x.len()`.
            let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for ((r, ar), &s) in rows.iter().zip(acc.iter_mut()).zip(&scales) {
                // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted above).
                let w = unsafe { decode16_fused(&k, r.codes.as_ptr().add(col), s) };
                *ar = _mm512_fmadd_ps(w, xv, *ar);
            }
            c += 16;
        }
    }
    store1(&acc, lanes);
}

/// FP8 rows against `N` activation rows (AVX-512, [`crate::stored`]'s tile), folded from
/// the stored codes: per 16-column step each row's codes are decoded in registers once
/// ([`decode16_fused`]) and folded into its N accumulators, in the order the panel's fold
/// takes them, so the bits are the buffered decode's. A span whose scales do not fuse
/// takes the buffered decode. When `ahead` is not 0, each row's codes `ahead` on from its
/// span are named to the prefetcher, a line per 64 columns read.
#[target_feature(enable = "avx512f")]
pub(super) fn tile_avx512<const R: usize, const N: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: [&[f32]; N],
    lanes: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    assert!(c0.is_multiple_of(16) && n.is_multiple_of(16), "fp8 span");
    assert!(x.iter().all(|s| s.len() == n));
    assert!(rows.iter().all(|r| c0 + n <= r.codes.len()));
    if !scales_fuse(&rows, c0, n) {
        // SAFETY: AVX-512F is enabled here; the span suits `fold_stored`.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx512::Avx512, super::Fp8Block, R, N>(
                rows, c0, x, lanes,
            );
        }
        return;
    }
    let k = Consts512::new();
    let mut a = load_tile(&lanes);
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales: [__m512; R] = std::array::from_fn(|i| {
            _mm512_set1_ps(fused_scale(rows[i].scale(b)).unwrap_or(f32::NAN))
        });
        while c < end {
            let col = c0 + c;
            if ahead != 0 && col.is_multiple_of(64) {
                for r in &rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted above).
            let wv: [__m512; R] = std::array::from_fn(|r| unsafe {
                decode16_fused(&k, rows[r].codes.as_ptr().add(col), scales[r])
            });
            for (j, &xj) in xp.iter().enumerate() {
                // SAFETY: `c + 16 <= n`, each `x[j]`'s length (asserted).
                let xv = unsafe { _mm512_loadu_ps(xj.add(c)) };
                for (v, ar) in wv.iter().zip(a.iter_mut()) {
                    ar[j] = _mm512_fmadd_ps(*v, xv, ar[j]);
                }
            }
            c += 16;
        }
    }
    store_tile(&a, lanes);
}
