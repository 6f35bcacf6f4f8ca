//! The x86 kernels of FP8 block rows ([`super`]): the decode of 8 (AVX2 with F16C) or 16
//! (AVX-512) codes through IEEE halves, the one-row folds that decode in registers, and the
//! tiles of the few-row nest ([`crate::stored`]) that fold a few activation rows straight from
//! the stored codes. See the parent module for why codes widen through halves.
//!
//! **NaN codes, masked only where there are any.** A NaN code (`0x7F`, `0xFF`) widens to
//! ±1.875, a finite value, so a decode that honours them compares every vector against it and
//! masks those lanes: two or three of a decode's eight to eleven instructions. Published
//! checkpoints hold no NaN code, so the register kernels fold a span **unmasked** when it holds
//! none, and masked only when it does; either way the bits are the masked decode's (a mask
//! that selects no lane changes nothing). How a span is known to be clean differs by tier, as
//! measured (`batch_cpu`, session 40):
//! - **AVX-512** folds the span unmasked while noting, 32 codes a row at a time, whether any
//!   code it read is a NaN code ([`Seen`]: one OR and one byte maximum), and folds it again,
//!   masked, from the accumulators it started with when one was (nothing is stored until
//!   then). A scan before the fold gained half as much: it took the span's first read from
//!   memory, and the fold waited for it.
//! - **AVX2** scans the span first ([`nan_free`]): with 16 registers the running check in the
//!   fold's loop spilled the tile's accumulators (3 rows 0.9× the masked fold).
//!
//! The AVX2 kernels widen 16 codes with one sign extension, shift and mask ([`widen8x2`]).

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
    fields16: __m256i,
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
            fields16: _mm256_set1_epi16(HALF_FIELDS),
            abs: _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)),
            nan_half: _mm256_set1_ps(NAN_HALF),
            two_8: _mm256_set1_ps(TWO_8),
            nan: _mm256_set1_ps(f32::from_bits(0x7FC0_0000)),
        }
    }
}

/// Eight codes at `p` → `e4m3 · 2^-8` each (a NaN code → ±1.875).
///
/// # Safety
/// `p` points to 8 readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen8(k: &Consts, p: *const u8) -> __m256 {
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { _mm_loadl_epi64(p.cast()) };
    _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16::<7>(_mm_cvtepi8_epi16(raw)), k.fields))
}

/// Sixteen codes at `p` → `e4m3 · 2^-8` each, as two vectors of eight (one sign extension,
/// shift and mask for all sixteen).
///
/// # Safety
/// `p` points to 16 readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen8x2(k: &Consts, p: *const u8) -> (__m256, __m256) {
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { _mm_loadu_si128(p.cast()) };
    let half = _mm256_and_si256(_mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(raw)), k.fields16);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(half)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(half)),
    )
}

/// `v` (eight widened codes) times `f`: with `MASKED`, the lanes that held a NaN code then set
/// to the canonical NaN; without it, the product alone (see the module docs).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn times8<const MASKED: bool>(k: &Consts, v: __m256, f: __m256) -> __m256 {
    if MASKED {
        let is_nan = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(v, k.abs), k.nan_half);
        _mm256_blendv_ps(_mm256_mul_ps(v, f), k.nan, is_nan)
    } else {
        _mm256_mul_ps(v, f)
    }
}

/// Eight codes → their values times `scale` (see the module docs), NaN codes honoured.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn decode8(k: &Consts, codes: &[u8], scale: f32) -> __m256 {
    assert!(codes.len() == 8);
    // SAFETY: `codes` is 8 bytes (asserted).
    let v = unsafe { widen8(k, codes.as_ptr()) };
    _mm256_mul_ps(times8::<true>(k, v, k.two_8), _mm256_set1_ps(scale))
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

/// The span of `rows` over columns `c0..c0 + n` checked: 16-column aligned, inside every row.
fn check_span(rows: &[Fp8Row<'_>], c0: usize, n: usize) {
    assert!(c0.is_multiple_of(16) && n.is_multiple_of(16), "fp8 span");
    assert!(rows.iter().all(|r| c0 + n <= r.codes.len()));
}

/// The fused factors ([`fused_scale`]) of `rows`' scale block `b`, or `None` if one does not
/// fuse: the register kernels then give the span to the buffered decode, before storing
/// anything (they check each block as they reach it, not the span first: a pass over the
/// span's scales before each call was 6% of a DeepSeek-V3 slice's decode step).
#[inline]
fn block_factors<const R: usize>(rows: &[Fp8Row<'_>; R], b: usize) -> Option<[f32; R]> {
    let mut f = [0.0; R];
    for (o, r) in f.iter_mut().zip(rows) {
        *o = fused_scale(r.scale(b))?;
    }
    Some(f)
}

/// Whether `rows`' codes over columns `c0..c0 + n` hold no NaN code: the AVX2 kernels' check,
/// a pass over the span before the fold (see the module docs), 128 codes a step.
#[target_feature(enable = "avx2")]
fn nan_free(rows: &[Fp8Row<'_>], c0: usize, n: usize) -> bool {
    let sign = _mm256_set1_epi8(i8::MIN);
    let mut top = [_mm256_setzero_si256(); 4];
    for r in rows {
        let mut chunks = r.codes[c0..c0 + n].chunks_exact(128);
        for ch in &mut chunks {
            for (i, t) in top.iter_mut().enumerate() {
                // SAFETY: `ch` is 128 readable bytes.
                let v = unsafe { _mm256_loadu_si256(ch.as_ptr().add(32 * i).cast()) };
                *t = _mm256_max_epu8(*t, _mm256_or_si256(v, sign));
            }
        }
        if chunks.remainder().iter().any(|&b| b | 0x80 == 0xFF) {
            return false;
        }
    }
    let top = _mm256_max_epu8(_mm256_max_epu8(top[0], top[1]), _mm256_max_epu8(top[2], top[3]));
    Seen(top).clean()
}

/// Whether an unmasked fold met a NaN code (see the module docs): the byte-wise maximum of
/// every code noted with its sign bit set, 0xFF in a byte once a NaN code passed.
#[derive(Clone, Copy)]
struct Seen(__m256i);

impl Seen {
    #[target_feature(enable = "avx2")]
    #[inline]
    fn new() -> Self {
        Self(_mm256_set1_epi8(i8::MIN))
    }

    /// Each row's codes from column `col` noted when `c`, the offset of a 16-column step in
    /// a span of `n` columns, is an even step: 32 codes, or 16 at the span's last step.
    ///
    /// # Safety
    /// `col + 16 <= r.codes.len()` for every row, and `col + 32` when `c + 32 <= n`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn note(self, rows: &[Fp8Row<'_>], col: usize, c: usize, n: usize) -> Self {
        if !c.is_multiple_of(32) {
            return self;
        }
        let sign = _mm256_set1_epi8(i8::MIN);
        let mut top = self.0;
        for r in rows {
            let p = r.codes.as_ptr().wrapping_add(col);
            // SAFETY: guaranteed by the caller.
            let v = unsafe {
                if c + 32 <= n {
                    _mm256_loadu_si256(p.cast())
                } else {
                    _mm256_zextsi128_si256(_mm_loadu_si128(p.cast()))
                }
            };
            top = _mm256_max_epu8(top, _mm256_or_si256(v, sign));
        }
        Self(top)
    }

    /// Whether no NaN code was noted.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn clean(self) -> bool {
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(self.0, _mm256_set1_epi8(-1))) == 0
    }
}

/// FP8 rows against one activation row: 16 columns of each row decoded in registers and
/// folded at once, a 128-column scale block at a time; each 64 bytes of a row consumed
/// prefetch a line of the next tile. NaN lanes masked only in a span that holds a NaN code
/// ([`nan_free`], see the module docs).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fold_one_avx2<const R: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: [&mut Lanes; R],
) {
    check_span(&rows, c0, x.len());
    let acc = if nan_free(&rows, c0, x.len()) {
        fold_one_avx2_on::<R, false>(&rows, c0, x, &lanes)
    } else {
        fold_one_avx2_on::<R, true>(&rows, c0, x, &lanes)
    };
    match acc {
        Some(acc) => store2(&acc, lanes),
        // SAFETY: AVX2 and FMA are enabled here; the span suits `fold_one`.
        None => unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx2::Avx2, super::Fp8Block, R>(
                rows, c0, x, lanes,
            );
        },
    }
}

/// [`fold_one_avx2`]'s fold of a span from `lanes`, returning the accumulators, or `None` at
/// the first block whose scale does not fuse ([`block_factors`]); `MASKED` as [`times8`].
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_one_avx2_on<const R: usize, const MASKED: bool>(
    rows: &[Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: &[&mut Lanes; R],
) -> Option<Acc2<R>> {
    let n = x.len();
    let ahead = R * rows[0].codes.len();
    let k = Consts::new();
    let mut acc = load2(lanes);
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales = block_factors(rows, b)?;
        while c < end {
            let col = c0 + c;
            if col.is_multiple_of(64) {
                for r in rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            // SAFETY: `c + 16 <= n = x.len()`.
            let (xl, xh) = unsafe {
                (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)))
            };
            for ((r, ar), s) in rows.iter().zip(acc.iter_mut()).zip(&scales) {
                let s = _mm256_broadcast_ss(s);
                // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted in `check_span`).
                let (wl, wh) = unsafe { widen8x2(&k, r.codes.as_ptr().add(col)) };
                let (wl, wh) = (times8::<MASKED>(&k, wl, s), times8::<MASKED>(&k, wh, s));
                ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
                ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
            }
            c += 16;
        }
    }
    Some(acc)
}

/// FP8 rows against `N` activation rows (AVX2 with F16C, [`crate::stored`]'s tile), folded
/// from the stored codes one 8-lane half of each 16-column step at a time, as
/// `arch::avx2::stored`'s tile folds bf16: each row's 16 codes widened in registers once
/// ([`widen8x2`]), each half scaled ([`times8`]) and folded into its N accumulators' half, in
/// the order the panel's fold takes them, so the bits are the buffered decode's. NaN lanes
/// masked only in a span that holds a NaN code ([`nan_free`]); a span whose scales do not fuse
/// takes the buffered decode. When `ahead` is not 0, each row's codes `ahead` on from its span
/// are named to the prefetcher, a line per 64 columns read.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tile_avx2<const R: usize, const N: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: [&[f32]; N],
    mut lanes: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    assert!(x.iter().all(|s| s.len() == n));
    check_span(&rows, c0, n);
    let a = if nan_free(&rows, c0, n) {
        tile_avx2_on::<R, N, false>(&rows, c0, &x, &mut lanes, ahead)
    } else {
        tile_avx2_on::<R, N, true>(&rows, c0, &x, &mut lanes, ahead)
    };
    let Some(a) = a else {
        // SAFETY: AVX2 and FMA are enabled here; the span suits `fold_stored`.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx2::Avx2, super::Fp8Block, R, N>(
                rows, c0, x, lanes,
            );
        }
        return;
    };
    for (ar, lanes_r) in a.iter().zip(lanes.iter_mut()) {
        store2(ar, lanes_r.each_mut());
    }
}

/// [`tile_avx2`]'s fold of a span from `lanes`, as [`fold_one_avx2_on`].
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_avx2_on<const R: usize, const N: usize, const MASKED: bool>(
    rows: &[Fp8Row<'_>; R],
    c0: usize,
    x: &[&[f32]; N],
    lanes: &mut [&mut [Lanes; N]; R],
    ahead: usize,
) -> Option<[Acc2<N>; R]> {
    let n = x.first().map_or(0, |s| s.len());
    let k = Consts::new();
    let mut a: [Acc2<N>; R] = std::array::from_fn(|r| load2(&lanes[r].each_mut()));
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales = block_factors(rows, b)?.map(|f| _mm256_set1_ps(f));
        while c < end {
            let col = c0 + c;
            if ahead != 0 && col.is_multiple_of(64) {
                for r in rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted in `check_span`).
            let halves: [(__m256, __m256); R] =
                std::array::from_fn(|r| unsafe { widen8x2(&k, rows[r].codes.as_ptr().add(col)) });
            for h in 0..2 {
                let wv: [__m256; R] = std::array::from_fn(|r| {
                    let v = if h == 0 { halves[r].0 } else { halves[r].1 };
                    times8::<MASKED>(&k, v, scales[r])
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
    Some(a)
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

/// Sixteen codes at `p` → `e4m3 · 2^-8` each (a NaN code → ±1.875).
///
/// # Safety
/// `p` points to 16 readable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen16(k: &Consts512, p: *const u8) -> __m512 {
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { _mm_loadu_si128(p.cast()) };
    _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(raw)), k.fields))
}

/// `v` (16 widened codes) times `f`: with `MASKED`, the lanes that held a NaN code take the
/// canonical NaN in the masked multiplication itself (a widened code is never NaN itself, so
/// "not equal" is "not a NaN code"); without it, the product alone (see the module docs).
#[target_feature(enable = "avx512f")]
#[inline]
fn times16<const MASKED: bool>(k: &Consts512, v: __m512, f: __m512) -> __m512 {
    if MASKED {
        let finite = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(_mm512_abs_ps(v), k.nan_half);
        _mm512_mask_mul_ps(k.nan, finite, v, f)
    } else {
        _mm512_mul_ps(v, f)
    }
}

/// Sixteen codes → their values times `scale`, NaN codes honoured.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn decode16(k: &Consts512, codes: &[u8], scale: f32) -> __m512 {
    assert!(codes.len() == 16);
    // SAFETY: `codes` is 16 bytes (asserted).
    let v = unsafe { widen16(k, codes.as_ptr()) };
    _mm512_mul_ps(times16::<true>(k, v, k.two_8), _mm512_set1_ps(scale))
}

/// Sixteen codes at `p` → their values times the block scale, given as `scale · 2^8`;
/// `MASKED` as [`times16`].
///
/// # Safety
/// `p` points to 16 readable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn decode16_fused<const MASKED: bool>(k: &Consts512, p: *const u8, f: __m512) -> __m512 {
    // SAFETY: guaranteed by the caller.
    let v = unsafe { widen16(k, p) };
    times16::<MASKED>(k, v, f)
}

/// FP8 rows against one activation row (AVX-512), as [`fold_one_avx2`], but folded unmasked
/// first and again, masked, only where a NaN code was met (see the module docs).
#[target_feature(enable = "avx512f")]
pub(super) fn fold_one_avx512<const R: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: [&mut Lanes; R],
) {
    check_span(&rows, c0, x.len());
    let acc = match fold_one_avx512_on::<R, false>(&rows, c0, x, &lanes) {
        Some((acc, true)) => Some(acc),
        Some((_, false)) => fold_one_avx512_on::<R, true>(&rows, c0, x, &lanes).map(|a| a.0),
        None => None,
    };
    match acc {
        Some(acc) => store1(&acc, lanes),
        // SAFETY: AVX-512F is enabled here; the span suits `fold_one`.
        None => unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx512::Avx512, super::Fp8Block, R>(
                rows, c0, x, lanes,
            );
        },
    }
}

/// [`fold_one_avx512`]'s fold of a span from `lanes`; `MASKED` as [`times16`]. Returns the
/// accumulators and, unmasked, whether no NaN code was met ([`Seen`]; masked: true), or `None`
/// at the first block whose scale does not fuse ([`block_factors`]).
#[target_feature(enable = "avx512f")]
fn fold_one_avx512_on<const R: usize, const MASKED: bool>(
    rows: &[Fp8Row<'_>; R],
    c0: usize,
    x: &[f32],
    lanes: &[&mut Lanes; R],
) -> Option<([__m512; R], bool)> {
    let n = x.len();
    let ahead = R * rows[0].codes.len();
    let k = Consts512::new();
    let mut acc = load1(lanes);
    let mut seen = Seen::new();
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales = block_factors(rows, b)?.map(|f| _mm512_set1_ps(f));
        while c < end {
            let col = c0 + c;
            if col.is_multiple_of(64) {
                for r in rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            if !MASKED {
                // SAFETY: `col + 16 <= c0 + n`, and `col + 32` when `c + 32 <= n`.
                seen = unsafe { seen.note(rows, col, c, n) };
            }
            // SAFETY: `c + 16 <= n = x.len()`.
            let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for ((r, ar), &s) in rows.iter().zip(acc.iter_mut()).zip(&scales) {
                // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted in `check_span`).
                let w = unsafe { decode16_fused::<MASKED>(&k, r.codes.as_ptr().add(col), s) };
                *ar = _mm512_fmadd_ps(w, xv, *ar);
            }
            c += 16;
        }
    }
    Some((acc, MASKED || seen.clean()))
}

/// FP8 rows against `N` activation rows (AVX-512, [`crate::stored`]'s tile), folded from
/// the stored codes: per 16-column step each row's codes are decoded in registers once
/// ([`decode16_fused`]) and folded into its N accumulators, in the order the panel's fold
/// takes them, so the bits are the buffered decode's. Unmasked first, masked again only where
/// a NaN code was met; a span whose scales do not fuse takes the buffered decode. When
/// `ahead` is not 0, each row's codes `ahead` on from its span are named to the prefetcher, a
/// line per 64 columns read.
#[target_feature(enable = "avx512f")]
pub(super) fn tile_avx512<const R: usize, const N: usize>(
    rows: [Fp8Row<'_>; R],
    c0: usize,
    x: [&[f32]; N],
    lanes: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    assert!(x.iter().all(|s| s.len() == n));
    check_span(&rows, c0, n);
    let a = match tile_avx512_on::<R, N, false>(&rows, c0, &x, &lanes, ahead) {
        Some((a, true)) => Some(a),
        Some((_, false)) => tile_avx512_on::<R, N, true>(&rows, c0, &x, &lanes, 0).map(|a| a.0),
        None => None,
    };
    match a {
        Some(a) => store_tile(&a, lanes),
        // SAFETY: AVX-512F is enabled here; the span suits `fold_stored`.
        None => unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx512::Avx512, super::Fp8Block, R, N>(
                rows, c0, x, lanes,
            );
        },
    }
}

/// [`tile_avx512`]'s fold of a span from `lanes`; returns as [`fold_one_avx512_on`].
#[target_feature(enable = "avx512f")]
fn tile_avx512_on<const R: usize, const N: usize, const MASKED: bool>(
    rows: &[Fp8Row<'_>; R],
    c0: usize,
    x: &[&[f32]; N],
    lanes: &[&mut [Lanes; N]; R],
    ahead: usize,
) -> Option<([[__m512; N]; R], bool)> {
    let n = x.first().map_or(0, |s| s.len());
    let k = Consts512::new();
    let mut a = load_tile(lanes);
    let mut seen = Seen::new();
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    let mut c = 0;
    while c < n {
        let b = (c0 + c) / BLOCK_EDGE;
        let end = ((b + 1) * BLOCK_EDGE - c0).min(n);
        let scales = block_factors(rows, b)?.map(|f| _mm512_set1_ps(f));
        while c < end {
            let col = c0 + c;
            if ahead != 0 && col.is_multiple_of(64) {
                for r in rows {
                    prefetch_line(r.codes.as_ptr().wrapping_add(col + ahead));
                }
            }
            if !MASKED {
                // SAFETY: `col + 16 <= c0 + n`, and `col + 32` when `c + 32 <= n`.
                seen = unsafe { seen.note(rows, col, c, n) };
            }
            // SAFETY: `col + 16 <= c0 + n <= r.codes.len()` (asserted in `check_span`).
            let wv: [__m512; R] = std::array::from_fn(|r| unsafe {
                decode16_fused::<MASKED>(&k, rows[r].codes.as_ptr().add(col), scales[r])
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
    Some((a, MASKED || seen.clean()))
}
