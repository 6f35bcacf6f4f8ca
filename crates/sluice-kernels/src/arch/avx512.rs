//! AVX-512F pieces of the matmul loop nest that every weight format shares: a 16-lane
//! accumulator is one register, so the several-row fold takes tiles of up to 4 weight rows ×
//! 6 activation rows (24 accumulators, the tile's 4 weight registers loaded once per step, 1
//! activation register) and never spills. The prefill nest's tiles (`fold_wide`) run the
//! same fold two steps per loop iteration, name the next token group's activations to the
//! prefetcher as they go, and the first tile of a group can copy the activations it loads
//! into an aligned stage for the others (see `crate::sweep`).
//!
//! Decoding is each format's `avx512_decode` hook and the one-activation-row fold its
//! `avx512_fold_one` (in `crate::formats`), which widen 16 columns per register and fold them
//! at once, moving the accumulators with [`load1`] / [`store1`] (a tile's with [`load_tile`] /
//! [`store_tile`]).
//!
//! Only AVX-512F instructions are used (no byte-granular masks, which need BW), so F alone
//! is required. All loads and stores are unaligned.

use crate::arch::{fold_wide_with, WideLoop};
use crate::formats::Format;
use crate::tiled::{Kernel, Lanes};
use core::arch::x86_64::*;

/// The AVX-512F tier.
pub(crate) struct Avx512;

impl Kernel for Avx512 {
    const WIDE: bool = true;

    #[target_feature(enable = "avx512f")]
    unsafe fn fold_one_rows<F: Format, const TB: usize>(
        rows: &[F::Row<'_>],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        assert!(x.len().is_multiple_of(16) && acc.len() >= rows.len(), "fold_one_rows span");
        // SAFETY: the caller guarantees AVX-512F and the span.
        unsafe { F::avx512_fold_rows::<TB>(rows, x, acc) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn decode<F: Format>(row: F::Row<'_>, c0: usize, out: &mut [f32]) {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { F::avx512_decode(row, c0, out) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold_one<F: Format, const R: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        assert!(x.len().is_multiple_of(16), "fold_one span");
        // SAFETY: the caller guarantees AVX-512F and the span.
        unsafe { F::avx512_fold_one(rows, c0, x, acc) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        let len = crate::tiled::span_len(&w, &x);
        let mut a = load_tile(&acc);
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
        store_tile(&a, acc);
    }
    fn stored_rows<F: Format>() -> usize {
        F::AVX512_TILE_ROWS
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold_stored<F: Format, const R: usize, const N: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        // SAFETY: the caller guarantees AVX-512F and the span.
        unsafe { F::avx512_tile(rows, c0, x, acc, ahead) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn zero(acc: &mut [Lanes]) {
        for l in acc {
            // SAFETY: `l` holds 16 f32.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), _mm512_setzero_ps()) };
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn reduce16x16(acc: [&Lanes; 16]) -> [f32; 16] {
        reduce16x16(acc)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold_wide<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: &[u8],
        stage: Option<[&mut [f32]; N]>,
    ) {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { fold_wide_with::<Self, R, N>(w, x, acc, ahead, stage) }
    }
}

impl WideLoop for Avx512 {
    #[target_feature(enable = "avx512f")]
    unsafe fn fold_loop<const R: usize, const N: usize, const AHEAD: bool, const STAGE: bool>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: *const u8,
        ahead_len: usize,
        stage: [*mut f32; N],
    ) {
        // SAFETY: the caller guarantees AVX-512F and the stage rows' length.
        unsafe { fold_wide::<R, N, AHEAD, STAGE>(w, x, acc, ahead, ahead_len, stage) }
    }
}

/// [`Kernel::fold_wide`]'s loop: the 4 × 6 tile's fold two 16-column steps per iteration
/// (the loop's own instructions and its exit paid half as often), naming two lines of
/// `ahead` to the prefetcher per iteration when `AHEAD` (while the iteration's offset in bytes,
/// 4 per column, is below `ahead_len`), and storing each activation vector
/// into `stage` when `STAGE`.
///
/// # Safety
/// The CPU supports AVX-512F; when `STAGE`, each `stage[j]` holds the span's length.
///
/// # Panics
/// If the slices' lengths differ or are not a multiple of 16.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold_wide<const R: usize, const N: usize, const AHEAD: bool, const STAGE: bool>(
    w: [&[f32]; R],
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: *const u8,
    ahead_len: usize,
    stage: [*mut f32; N],
) {
    let len = crate::tiled::span_len(&w, &x);
    let mut a = load_tile(&acc);
    let wp: [*const f32; R] = std::array::from_fn(|r| w[r].as_ptr());
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    // One 16-column step at `c`: the tile's weights once (R registers), then each activation
    // row against all of them: R + N loads per R · N FMAs.
    let step = |a: &mut [[__m512; N]; R], c: usize| {
        // SAFETY: `c + 16 <= len` and every slice is `len` long (asserted above).
        let wv: [__m512; R] = std::array::from_fn(|r| unsafe { _mm512_loadu_ps(wp[r].add(c)) });
        for (j, (&xj, &sj)) in xp.iter().zip(&stage).enumerate() {
            // SAFETY: as for the weights.
            let xv = unsafe { _mm512_loadu_ps(xj.add(c)) };
            if STAGE {
                // SAFETY: `stage[j]` holds the span's length (the caller's contract).
                unsafe { _mm512_storeu_ps(sj.add(c), xv) };
            }
            for (v, ar) in wv.iter().zip(a.iter_mut()) {
                ar[j] = _mm512_fmadd_ps(*v, xv, ar[j]);
            }
        }
    };
    let mut c = 0;
    while c + 32 <= len {
        if AHEAD && 4 * c < ahead_len {
            // Two lines of `ahead`, at four times this iteration's first column.
            crate::arch::prefetch_line(ahead.wrapping_add(4 * c));
            crate::arch::prefetch_line(ahead.wrapping_add(4 * c + 64));
        }
        step(&mut a, c);
        step(&mut a, c + 16);
        c += 32;
    }
    if c < len {
        if AHEAD && 4 * c < ahead_len {
            crate::arch::prefetch_line(ahead.wrapping_add(4 * c));
        }
        step(&mut a, c);
    }
    store_tile(&a, acc);
}

/// Loads `R` 16-lane accumulators into registers.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load1<const R: usize>(lanes: &[&mut Lanes; R]) -> [__m512; R] {
    // SAFETY: each `lanes` holds 16 f32.
    std::array::from_fn(|r| unsafe { _mm512_loadu_ps(lanes[r].as_ptr()) })
}

/// Stores registers back into `R` 16-lane accumulators.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store1<const R: usize>(a: &[__m512; R], lanes: [&mut Lanes; R]) {
    for (v, l) in a.iter().zip(lanes) {
        // SAFETY: `l` holds 16 f32.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *v) };
    }
}

/// A format stored as one fixed-size value per column that AVX-512F widens 16 columns at a
/// time (bf16, int8 rows, f32): what [`fold_stored_tile`] needs of it.
pub(crate) trait Widen16 {
    /// Stored bytes per column.
    const BYTES: usize;

    /// The 16 columns whose stored bytes start at `p`, as the format's `fold_values` widens
    /// them (the values its panel would hold).
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `p` points at `16 * BYTES` readable bytes.
    unsafe fn widen16(p: *const u8) -> __m512;
}

/// [`crate::formats::Format::avx512_tile`] of a format stored as `W`: `R` rows (each the
/// whole row's bytes) against `N` activation rows, folded from the stored bytes of the span
/// from column `c0` (as long as every `x[j]`): per 16-column step, R loads widened in
/// registers, N activation loads and R · N FMAs, in the order the panel's fold takes them.
/// When `ahead` is not 0, each row's bytes `ahead` on from its span are named to the
/// prefetcher, a line per 64 bytes read.
///
/// # Panics
/// If the span does not lie inside a row, the `x[j]` differ in length, or their length is not
/// a multiple of 16.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn fold_stored_tile<W: Widen16, const R: usize, const N: usize>(
    rows: [&[u8]; R],
    c0: usize,
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    let w = rows.map(|w| &w[W::BYTES * c0..W::BYTES * (c0 + n)]);
    if ahead == 0 {
        stored_tile::<W, R, N, false>(w, x, acc, 0);
    } else {
        stored_tile::<W, R, N, true>(w, x, acc, ahead);
    }
}

/// [`fold_stored_tile`]'s loop, naming `ahead` to the prefetcher when `PF`.
#[target_feature(enable = "avx512f")]
#[inline]
fn stored_tile<W: Widen16, const R: usize, const N: usize, const PF: bool>(
    w: [&[u8]; R],
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let len = x.first().map_or(0, |s| s.len());
    assert!(len.is_multiple_of(16), "stored tile span");
    assert!(w.iter().all(|w| w.len() == W::BYTES * len) && x.iter().all(|x| x.len() == len));
    let mut a = load_tile(&acc);
    let wp: [*const u8; R] = std::array::from_fn(|r| w[r].as_ptr());
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    for c in (0..len).step_by(16) {
        if PF && (W::BYTES * c).is_multiple_of(64) {
            for p in wp {
                crate::arch::prefetch_line(p.wrapping_add(W::BYTES * c + ahead));
            }
        }
        // SAFETY: the CPU has AVX-512F (this function's feature); `c + 16 <= len` and each
        // row holds `BYTES * len` bytes (asserted), so the 16 columns at `c` lie inside it.
        let wv: [__m512; R] =
            std::array::from_fn(|r| unsafe { W::widen16(wp[r].add(W::BYTES * c)) });
        for (j, &xj) in xp.iter().enumerate() {
            // SAFETY: `c + 16 <= len`, each `x[j]`'s length (asserted).
            let xv = unsafe { _mm512_loadu_ps(xj.add(c)) };
            for (v, ar) in wv.iter().zip(a.iter_mut()) {
                ar[j] = _mm512_fmadd_ps(*v, xv, ar[j]);
            }
        }
    }
    store_tile(&a, acc);
}

/// Loads an `R` × `N` tile of 16-lane accumulators into registers.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load_tile<const R: usize, const N: usize>(
    lanes: &[&mut [Lanes; N]; R],
) -> [[__m512; N]; R] {
    std::array::from_fn(|r| {
        // SAFETY: each `lanes[r][j]` holds 16 f32.
        std::array::from_fn(|j| unsafe { _mm512_loadu_ps(lanes[r][j].as_ptr()) })
    })
}

/// Stores an `R` × `N` tile of registers back into its 16-lane accumulators.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store_tile<const R: usize, const N: usize>(
    a: &[[__m512; N]; R],
    lanes: [&mut [Lanes; N]; R],
) {
    for (ar, lanes_r) in a.iter().zip(lanes) {
        for (v, l) in ar.iter().zip(lanes_r) {
            // SAFETY: `l` holds 16 f32.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *v) };
        }
    }
}

/// [`crate::matmul::reduce16`] of 16 accumulators at once (see [`crate::reduce`]): each level
/// adds, for every cell, its lower lanes (first operand) to the lanes the scalar tree pairs
/// them with, with shuffles that only move whole partial sums between registers.
///
/// Level by level: `s1[l] = a[l] + a[l + 8]` (cells in pairs: 128-bit quarters 0–1 of both
/// cells against quarters 2–3), `s2[l] = s1[l] + s1[l + 4]` (fours of cells: quarters 0, 2
/// against 1, 3), `s3[l] = s2[l] + s2[l + 2]` and `s4 = s3[0] + s3[1]` (within quarters);
/// the last register holds cell `4k + i` in lane `4i + k`, put back in cell order by one
/// permute.
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce16x16(acc: [&Lanes; 16]) -> [f32; 16] {
    // SAFETY: each `acc[c]` holds 16 f32.
    let a: [__m512; 16] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(acc[c].as_ptr()) });
    // Quarters [a.0, a.1, b.0, b.1] + [a.2, a.3, b.2, b.3]: cell 2p's s1 in lanes 0–7, 2p + 1's in 8–15.
    let b: [__m512; 8] = std::array::from_fn(|p| {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
    });
    // Quarters [x.0, x.2, y.0, y.2] + [x.1, x.3, y.1, y.3]: quarter i holds cell 4q + i's s2.
    let c: [__m512; 4] = std::array::from_fn(|q| {
        let (x, y) = (b[2 * q], b[2 * q + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
    });
    // Within quarters [x0, x1, y0, y1] + [x2, x3, y2, y3]: quarter i holds s3 of cells 8r + i
    // (lanes 0, 1) and 8r + 4 + i (lanes 2, 3).
    let d: [__m512; 2] = std::array::from_fn(|r| {
        let (x, y) = (c[2 * r], c[2 * r + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y))
    });
    // Within quarters [x0, x2, y0, y2] + [x1, x3, y1, y3]: lane 4i + k holds cell 4k + i.
    let e =
        _mm512_add_ps(_mm512_shuffle_ps::<0x88>(d[0], d[1]), _mm512_shuffle_ps::<0xDD>(d[0], d[1]));
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut out = [0.0f32; 16];
    // SAFETY: `out` holds 16 f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_permutexvar_ps(order, e)) };
    out
}
