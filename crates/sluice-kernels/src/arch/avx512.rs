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
//! at once, moving the accumulators with [`load1`] / [`store1`].
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
    #[target_feature(enable = "avx512f")]
    unsafe fn fold_wide<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: &[f32],
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
        ahead: *const f32,
        stage: [*mut f32; N],
    ) {
        // SAFETY: the caller guarantees AVX-512F and the stage rows' length.
        unsafe { fold_wide::<R, N, AHEAD, STAGE>(w, x, acc, ahead, stage) }
    }
}

/// [`Kernel::fold_wide`]'s loop: the 4 × 6 tile's fold two 16-column steps per iteration
/// (the loop's own instructions and its exit paid half as often), naming two lines of
/// `ahead` to the prefetcher per iteration when `AHEAD`, and storing each activation vector
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
    ahead: *const f32,
    stage: [*mut f32; N],
) {
    let len = crate::tiled::span_len(&w, &x);
    let mut a = [[_mm512_setzero_ps(); N]; R];
    for (ar, lanes_r) in a.iter_mut().zip(acc.iter()) {
        for (aj, lanes) in ar.iter_mut().zip(lanes_r.iter()) {
            // SAFETY: `lanes` holds 16 f32.
            *aj = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
        }
    }
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
        if AHEAD {
            // The two lines of `ahead` at the same offset as this iteration's 32 columns.
            crate::arch::prefetch_line(ahead.wrapping_add(c).cast());
            crate::arch::prefetch_line(ahead.wrapping_add(c + 16).cast());
        }
        step(&mut a, c);
        step(&mut a, c + 16);
        c += 32;
    }
    if c < len {
        if AHEAD {
            crate::arch::prefetch_line(ahead.wrapping_add(c).cast());
        }
        step(&mut a, c);
    }
    for (ar, lanes_r) in a.iter().zip(acc) {
        for (v, lanes) in ar.iter().zip(lanes_r) {
            // SAFETY: `lanes` holds 16 f32.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
        }
    }
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
