//! AVX2+FMA pieces of the matmul loop nest ([`crate::tiled`]) that every weight format shares:
//! a 16-lane accumulator is two 8-lane registers (lanes 0–7, 8–15); a 2 × 3 tile's twelve
//! accumulator registers leave four of the sixteen for operands (`fold`), unless the tile
//! folds one half at a time (`fold_half`, below).
//!
//! **One activation row** (`fold_one`, the decode path) is each format's hook
//! (`Format::avx2_fold_one`, in `crate::formats`): the formats keep widened weights in
//! registers and fold them at once, with [`load2`] / [`store2`] moving the accumulators.
//!
//! **Several activation rows** (`decode` + `fold`) widen a chunk into a buffer once through
//! the format's `avx2_decode` and fold it here in register tiles. The prefill nest
//! (`crate::wide`) folds in halves (`fold_half`): lanes 0–7 over the whole span, then lanes
//! 8–15, so that an accumulator is one register and a tile of 3 weight rows × 4 activation
//! rows fits (12 accumulators, 3 weights, 1 activation: 7 loads per 12 FMAs, where the 2 × 3
//! tile of whole accumulators needs 10). Its weight panel is stored half-split (every step's
//! low 8 lanes, then every step's high 8), so each pass reads its weights contiguously: a
//! pass over column-ordered weights pulled every cache line of the tile's rows from L2 for
//! half its bytes. In the prefill nest (`fold_half_wide`) the low half's pass also names one
//! line of the next token group's activations to the prefetcher per step.
//!
//! **A few activation rows** (2 to [`crate::stored::STORED_ROWS`], a verification pass or an
//! expert's share of a prefill) fold bf16, int8 and f32 rows straight from their stored
//! bytes in `stored`'s tile ([`fold_stored_tile`]), with no widened copy.
//!
//! [`NibbleDecoder`] is the 4-bit decode MXFP4 and INT4 share: a `vpshufb` lookup of each
//! nibble in a 16-entry signed-byte table, interleaved into column order and spread into the
//! top byte of each dword.
//!
//! All loads and stores are unaligned: safetensors offsets carry no alignment. Each function
//! asserts the lengths its pointer arithmetic relies on before its loop.

mod stored;

pub(crate) use stored::{fold_nibble_tile, fold_stored_tile, NibbleBlocks, Widen8};

use crate::arch::{fold_wide_with, WideLoop};
use crate::formats::Format;
use crate::tiled::{Kernel, Lanes};
use core::arch::x86_64::*;

/// The AVX2+FMA tier.
pub(crate) struct Avx2;

impl Kernel for Avx2 {
    const HALVES: bool = true;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_one_rows<F: Format, const TB: usize>(
        rows: &[F::Row<'_>],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        assert!(x.len().is_multiple_of(16) && acc.len() >= rows.len(), "fold_one_rows span");
        // SAFETY: the caller guarantees AVX2 and FMA and the span.
        unsafe { F::avx2_fold_rows::<TB>(rows, x, acc) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn zero(acc: &mut [Lanes]) {
        for l in acc {
            // SAFETY: `l` holds 16 f32.
            unsafe {
                _mm256_storeu_ps(l.as_mut_ptr(), _mm256_setzero_ps());
                _mm256_storeu_ps(l.as_mut_ptr().add(8), _mm256_setzero_ps());
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce16x16(acc: [&Lanes; 16]) -> [f32; 16] {
        reduce16x16(acc)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode<F: Format>(row: F::Row<'_>, c0: usize, out: &mut [f32]) {
        // SAFETY: the caller guarantees AVX2 and FMA.
        unsafe { F::avx2_decode(row, c0, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = crate::tiled::span_len(&w, &x);
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
    unsafe fn fold_half<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        // SAFETY: the caller guarantees AVX2 and FMA; nothing is prefetched.
        unsafe {
            fold_half::<R, N, false, false>(
                w,
                x,
                acc,
                std::ptr::null(),
                0,
                [std::ptr::null_mut(); N],
            )
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_half_wide<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: &[u8],
        stage: Option<[&mut [f32]; N]>,
    ) {
        // SAFETY: the caller guarantees AVX2 and FMA.
        unsafe { fold_wide_with::<Self, R, N>(w, x, acc, ahead, stage) }
    }

    fn stored_rows<F: Format>() -> usize {
        F::AVX2_TILE_ROWS
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_stored<F: Format, const R: usize, const N: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        // SAFETY: the caller guarantees AVX2, FMA and the span.
        unsafe { F::avx2_tile(rows, c0, x, acc, ahead) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_one<F: Format, const R: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        assert!(x.len().is_multiple_of(16), "fold_one span");
        // SAFETY: the caller guarantees AVX2 and FMA and the span.
        unsafe { F::avx2_fold_one(rows, c0, x, acc) }
    }
}

impl WideLoop for Avx2 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_loop<const R: usize, const N: usize, const AHEAD: bool, const STAGE: bool>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: *const u8,
        ahead_len: usize,
        stage: [*mut f32; N],
    ) {
        // SAFETY: the caller guarantees AVX2, FMA and the stage rows' length.
        unsafe { fold_half::<R, N, AHEAD, STAGE>(w, x, acc, ahead, ahead_len, stage) }
    }
}

/// [`Kernel::fold_half`]'s loop; when `AHEAD`, the low half's pass names one line of `ahead`
/// per 16-column step to the prefetcher (at four times the step's first column, while that
/// is below `ahead_len`), and when
/// `STAGE`, each pass stores every activation half it loads at the same place of `stage[j]`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; with `STAGE`, each `stage[j]` holds the span's length.
///
/// # Panics
/// If the slices' lengths differ or are not a multiple of 16.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fold_half<const R: usize, const N: usize, const AHEAD: bool, const STAGE: bool>(
    w: [&[f32]; R],
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: *const u8,
    ahead_len: usize,
    stage: [*mut f32; N],
) {
    let len = crate::tiled::span_len(&w, &x);
    let wp: [*const f32; R] = std::array::from_fn(|r| w[r].as_ptr());
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    let mut acc = acc;
    // Half `h` (lanes `h .. h + 8`) of step `k`: activations at `16k + h`, weights (in the
    // split order) at `8k`, or `len / 2 + 8k` for the high half.
    for (h, wh) in [(0, 0), (8, len / 2)] {
        let mut a = [[_mm256_setzero_ps(); N]; R];
        for (ar, lanes_r) in a.iter_mut().zip(acc.iter()) {
            for (aj, lanes) in ar.iter_mut().zip(lanes_r.iter()) {
                // SAFETY: `lanes` holds 16 f32 and `h` is 0 or 8.
                *aj = unsafe { _mm256_loadu_ps(lanes.as_ptr().add(h)) };
            }
        }
        let (mut c, mut cw) = (h, wh);
        while c < len {
            if AHEAD && h == 0 && 4 * c < ahead_len {
                crate::arch::prefetch_line(ahead.wrapping_add(4 * c));
            }
            // SAFETY: `c + 8 <= len` (`c % 16` is `h`, `len` a multiple of 16) and every
            // slice is `len` long (asserted above); `cw = wh + (c - h) / 2`, so
            // `cw + 8 <= wh + len / 2 <= len`.
            let wv: [__m256; R] =
                std::array::from_fn(|r| unsafe { _mm256_loadu_ps(wp[r].add(cw)) });
            for (j, (&xj, &sj)) in xp.iter().zip(&stage).enumerate() {
                // SAFETY: as for the weights.
                let xv = unsafe { _mm256_loadu_ps(xj.add(c)) };
                if STAGE {
                    // SAFETY: `stage[j]` holds the span's length (the caller's contract).
                    unsafe { _mm256_storeu_ps(sj.add(c), xv) };
                }
                for (v, ar) in wv.iter().zip(a.iter_mut()) {
                    ar[j] = _mm256_fmadd_ps(*v, xv, ar[j]);
                }
            }
            c += 16;
            cw += 8;
        }
        for (ar, lanes_r) in a.iter().zip(acc.iter_mut()) {
            for (v, lanes) in ar.iter().zip(lanes_r.iter_mut()) {
                // SAFETY: `lanes` holds 16 f32 and `h` is 0 or 8.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(h), *v) };
            }
        }
    }
}

/// Accumulator registers of a one-activation-row tile: lanes 0–7 and 8–15 per row.
pub(crate) type Acc2<const R: usize> = [[__m256; 2]; R];

/// [`crate::matmul::reduce16`] of 16 accumulators at once (see [`crate::reduce`]), each
/// level adding every cell's lower lanes (first operand) to the lanes the scalar tree pairs
/// them with: `s1 = lo + hi` per cell, `s2` across 128-bit halves of two cells, `s3` and
/// `s4` within halves of two registers. The last two registers hold cell `8r + h + 2k` in
/// lane `4h + k` of register `r`, put back in cell order by one permute each.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce16x16(acc: [&Lanes; 16]) -> [f32; 16] {
    // SAFETY: each `acc[c]` holds 16 f32.
    let s: [__m256; 16] = std::array::from_fn(|c| unsafe {
        _mm256_add_ps(_mm256_loadu_ps(acc[c].as_ptr()), _mm256_loadu_ps(acc[c].as_ptr().add(8)))
    });
    // Halves [x.lo, y.lo] + [x.hi, y.hi]: half h holds cell 2p + h's s2.
    let t: [__m256; 8] = std::array::from_fn(|p| {
        let (x, y) = (s[2 * p], s[2 * p + 1]);
        _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x, y), _mm256_permute2f128_ps::<0x31>(x, y))
    });
    // Within halves [x0, x1, y0, y1] + [x2, x3, y2, y3]: half h holds s3 of cells 4q + h
    // (lanes 0, 1) and 4q + 2 + h (lanes 2, 3).
    let u: [__m256; 4] = std::array::from_fn(|q| {
        let (x, y) = (t[2 * q], t[2 * q + 1]);
        _mm256_add_ps(_mm256_shuffle_ps::<0x44>(x, y), _mm256_shuffle_ps::<0xEE>(x, y))
    });
    // Within halves [x0, x2, y0, y2] + [x1, x3, y1, y3]: lane 4h + k holds cell 8r + h + 2k.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut out = [0.0f32; 16];
    for (r, o) in out.chunks_exact_mut(8).enumerate() {
        let (x, y) = (u[2 * r], u[2 * r + 1]);
        let v = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(x, y), _mm256_shuffle_ps::<0xDD>(x, y));
        // SAFETY: `o` holds 8 f32.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_permutevar8x32_ps(v, order)) };
    }
    out
}

/// Loads `R` 16-lane accumulators into registers.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn load2<const R: usize>(lanes: &[&mut Lanes; R]) -> Acc2<R> {
    // SAFETY: each `lanes` holds 16 f32.
    std::array::from_fn(|r| unsafe {
        [_mm256_loadu_ps(lanes[r].as_ptr()), _mm256_loadu_ps(lanes[r].as_ptr().add(8))]
    })
}

/// Stores registers back into `R` 16-lane accumulators.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn store2<const R: usize>(a: &Acc2<R>, lanes: [&mut Lanes; R]) {
    for ([lo, hi], l) in a.iter().zip(lanes) {
        // SAFETY: `l` holds 16 f32.
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), *lo);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), *hi);
        }
    }
}

/// Byte-shuffle indices that place byte `8k + i` of a 16-byte lane (the same 16 bytes in
/// both lanes) in the top byte of dword `i` and zero the other bytes: index `k` spreads
/// columns `8k .. 8k + 8` of a 16-column half, four per 128-bit lane.
const SPREAD: [[u8; 32]; 2] = [spread(0), spread(8)];

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

/// The 4-bit decode MXFP4 and INT4 share. With both 128-bit lanes holding a block's 16 packed
/// bytes (byte `i` holds column `2i` in its low nibble, `2i + 1` in its high one), in-lane byte
/// shuffles do all the work: look up each nibble's signed byte in `table`, interleave low and
/// high into column order, then spread each value into the top byte of a dword.
pub(crate) struct NibbleDecoder {
    /// The 16-entry lookup table in both lanes.
    pub(crate) table: __m256i,
    /// `0x0F` in every byte.
    pub(crate) low: __m256i,
    spread: [__m256i; 2],
}

impl NibbleDecoder {
    /// A decoder over `table` (nibble → signed byte).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn new(table: &[i8; 16]) -> Self {
        // SAFETY: the tables are 16 and 32 bytes.
        unsafe {
            Self {
                table: _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast())),
                low: _mm256_set1_epi8(0x0F),
                spread: SPREAD.map(|t| _mm256_loadu_si256(t.as_ptr().cast())),
            }
        }
    }

    /// One block of 16 packed bytes → the table values of columns 0–7, 8–15, 16–23, 24–31,
    /// each as `value · 2^24` in an i32 lane (the value in the top byte).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn top_bytes(&self, packed: &[u8]) -> [__m256i; 4] {
        assert!(packed.len() == 16);
        // SAFETY: `packed` is 16 bytes (asserted).
        let bytes = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(packed.as_ptr().cast())) };
        let lo = _mm256_shuffle_epi8(self.table, _mm256_and_si256(bytes, self.low));
        let hi = _mm256_shuffle_epi8(
            self.table,
            _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), self.low),
        );
        let halves = [_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)];
        let v = |h: usize, k: usize| _mm256_shuffle_epi8(halves[h], self.spread[k]);
        [v(0, 0), v(0, 1), v(1, 0), v(1, 1)]
    }
}
