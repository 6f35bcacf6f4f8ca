//! Per-tier pieces of the matmul loop nest ([`crate::tiled`]): folding widened weights into
//! register tiles of accumulators, shared by every weight format (each format's decode and
//! one-row hooks live in its own file under `crate::formats`).
//!
//! This module holds the portable tier (the `Scalar` [`Isa`], also the fallback on any
//! architecture), the prefetch helpers, the x86-64 tiers' shared dispatch of the prefill
//! fold to its prefetching and staging instances (`fold_wide_with`), and the dispatch from
//! an [`Isa`] and a [`crate::WeightFormat`] to the loop nest monomorphised for both. The SIMD
//! tiers live in `avx2`, `avx512` (x86-64) and `aarch64` (NEON).

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod peak;

use std::ops::Range;

use crate::formats::{Format, Visit};
use crate::isa::Isa;
use crate::matmul::Matrix;
use crate::packed::Packed;
use crate::tiled::{self, Kernel, Lanes};

/// Asks the CPU to start loading `bytes` into its L2 cache; changes no result. Weights are
/// read a chunk of several rows at a time (see [`crate::tiled`]), an access pattern hardware
/// prefetchers follow poorly, so the loop nest names the bytes it will need next.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        for i in (0..bytes.len()).step_by(64) {
            // SAFETY: a prefetch never faults and has no architectural effect; the address is
            // inside `bytes` anyway (SSE, which provides it, is part of x86-64).
            unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.as_ptr().add(i).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Asks the CPU to start loading the cache line holding `p` into its L2 cache; changes no
/// result. Any address will do: a prefetch never faults, and callers form `p` with
/// `wrapping_add`, so it may point past the matrix.
///
/// The one-row kernels call it one cache line of the next tile per line consumed, at `ahead`
/// bytes on: `R` times a row's weight bytes ([`Format::row_bytes`]), where the next tile's
/// bytes lie since the rows of a matrix are contiguous (prefetching whole blocks at once left
/// the loads waiting on memory; measured in `sluice probe --kernels`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: a prefetch never faults and has no architectural effect (SSE, which provides
    // it, is part of x86-64).
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) };
}

/// A SIMD tier's prefill fold loop ([`Kernel::fold_wide`] on AVX-512,
/// [`Kernel::fold_half_wide`] on AVX2) with its two extras as const generics, so that a tile
/// that prefetches nothing or stages nothing carries no test for it in its loop:
/// [`fold_wide_with`] turns a call's arguments into the one of four instances it needs.
#[cfg(target_arch = "x86_64")]
pub(crate) trait WideLoop {
    /// The fold loop of `w` (`R` weight rows) against `x` (`N` activation rows) into `acc`;
    /// when `AHEAD`, naming one line of `ahead` per 16-column step to the prefetcher while the
    /// step's offset in bytes (4 per column) is below `ahead_len`; when
    /// `STAGE`, storing every activation value it loads at the same place of `stage[j]`.
    ///
    /// # Safety
    /// The running CPU supports the tier; when `STAGE`, each `stage[j]` holds the span's
    /// length. (`ahead` may be any address: a prefetch never faults.)
    ///
    /// # Panics
    /// If the slices' lengths differ or are not a multiple of 16.
    unsafe fn fold_loop<const R: usize, const N: usize, const AHEAD: bool, const STAGE: bool>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: *const u8,
        ahead_len: usize,
        stage: [*mut f32; N],
    );
}

/// [`Kernel::fold_wide`] (or [`Kernel::fold_half_wide`]) through `L`'s loop: prefetches only
/// when `ahead` is not empty, stages only into `stage`'s rows, checked to be as long as the
/// span.
///
/// # Safety
/// The running CPU supports `L`'s tier.
///
/// # Panics
/// If the slices' lengths differ or are not a multiple of 16, or a stage row is not as long
/// as the span.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn fold_wide_with<L: WideLoop, const R: usize, const N: usize>(
    w: [&[f32]; R],
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: &[u8],
    stage: Option<[&mut [f32]; N]>,
) {
    let len = tiled::span_len(&w, &x);
    let pf = !ahead.is_empty();
    let (ahead, al) = (ahead.as_ptr(), ahead.len());
    // SAFETY: the caller guarantees the tier (every arm); the stage rows are `len` long
    // (checked); with no stage, none is written.
    unsafe {
        match stage {
            Some(s) => {
                assert!(s.iter().all(|s| s.len() == len), "fold_wide: stage rows");
                let s = s.map(|s| s.as_mut_ptr());
                if pf {
                    L::fold_loop::<R, N, true, true>(w, x, acc, ahead, al, s);
                } else {
                    L::fold_loop::<R, N, false, true>(w, x, acc, ahead, al, s);
                }
            }
            None => {
                let s = [std::ptr::null_mut(); N];
                if pf {
                    L::fold_loop::<R, N, true, false>(w, x, acc, ahead, al, s);
                } else {
                    L::fold_loop::<R, N, false, false>(w, x, acc, ahead, al, s);
                }
            }
        }
    }
}

/// The portable tier: element-by-element widening and lane-by-lane fused multiply-adds.
pub(crate) struct Portable;

impl Kernel for Portable {
    unsafe fn decode<F: Format>(row: F::Row<'_>, c0: usize, out: &mut [f32]) {
        F::fold_values(row, c0, out);
    }

    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        for (wr, ar) in w.iter().zip(acc) {
            for (xj, lanes) in x.iter().zip(ar.iter_mut()) {
                assert!(wr.len() == xj.len() && wr.len().is_multiple_of(16), "fold lengths");
                for (wc, xc) in wr.chunks_exact(16).zip(xj.chunks_exact(16)) {
                    for ((a, &wl), &xl) in lanes.iter_mut().zip(wc).zip(xc) {
                        *a = wl.mul_add(xl, *a);
                    }
                }
            }
        }
    }
}

/// One call of the loop nest, waiting for its format ([`Visit`]).
struct Run<'m, 'a, 'x, 'p, E> {
    isa: Isa,
    m: &'m Matrix<'a>,
    x: &'x [f32],
    t: usize,
    rows: Range<usize>,
    pack: Option<(&'p Packed<'p>, usize)>,
    emit: E,
}

impl<E: FnMut(usize, usize, f32)> Visit for Run<'_, '_, '_, '_, E> {
    type Out = ();

    fn visit<F: Format>(self) {
        let Self { isa, m, x, t, rows, pack, emit } = self;
        assert!(isa.is_available(), "matmul: the {isa} tier is not supported by this CPU");
        #[cfg(target_arch = "x86_64")]
        if let (Isa::Avx512 | Isa::Avx2, Some((p, j0))) = (isa, pack) {
            // SAFETY: the CPU supports the tier (asserted above), AVX-512 or AVX2.
            unsafe { crate::wide::run_outer::<F>(isa, m, p, j0..j0 + t, rows, emit) };
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = pack;
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX-512F (asserted above).
            Isa::Avx512 => unsafe { tiled::run::<avx512::Avx512, F>(m, x, t, rows, emit) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX2 and FMA (asserted above).
            Isa::Avx2 => unsafe { tiled::run::<avx2::Avx2, F>(m, x, t, rows, emit) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the CPU supports Advanced SIMD (asserted above).
            Isa::Neon => unsafe { tiled::run::<aarch64::Neon, F>(m, x, t, rows, emit) },
            // SAFETY: the portable kernel runs on any CPU.
            _ => unsafe { tiled::run::<Portable, F>(m, x, t, rows, emit) },
        }
    }
}

/// Runs the loop nest of [`crate::tiled::run`] on `isa`'s kernel and `m`'s format, or, given
/// the call's packed activations and where `x`'s rows start in them, the outer-product nest
/// ([`crate::outer`] on AVX-512, `crate::outer_avx2` on AVX2, the tiers that pack).
///
/// # Panics
/// If the running CPU does not support `isa` ([`Isa::is_available`]).
pub(crate) fn run(
    isa: Isa,
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    pack: Option<(&Packed<'_>, usize)>,
    emit: impl FnMut(usize, usize, f32),
) {
    m.format().visit(Run { isa, m, x, t, rows, pack, emit });
}

/// A whole row's widening on a tier, waiting for its format ([`widen_row`]).
struct WidenRow<'m, 'a, 'o> {
    isa: Isa,
    m: &'m Matrix<'a>,
    r: usize,
    out: &'o mut [f32],
}

impl Visit for WidenRow<'_, '_, '_> {
    type Out = bool;

    fn visit<F: Format>(self) -> bool {
        let Self { isa, m, r, out } = self;
        assert!(isa.is_available(), "row_to_f32: the {isa} tier is not supported by this CPU");
        assert_eq!(out.len(), m.cols(), "widen_row: a whole row");
        if !F::TIER_WIDENS {
            return false;
        }
        let row = F::row(m, r);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX-512F (asserted above); the span is the whole row.
            Isa::Avx512 => unsafe { avx512::Avx512::decode::<F>(row, 0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX2 and FMA (asserted above); the span is the row.
            Isa::Avx2 => unsafe { avx2::Avx2::decode::<F>(row, 0, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the CPU supports Advanced SIMD (asserted above); the span is the row.
            Isa::Neon => unsafe { aarch64::Neon::decode::<F>(row, 0, out) },
            _ => return false,
        }
        true
    }
}

/// Widens row `r` of `m`, whole, into `out` (`m.cols()` values) with `isa`'s decode; false,
/// with `out` untouched, for the portable tier and for a format whose decodes are not its
/// widening bit for bit ([`Format::TIER_WIDENS`]), which the caller widens with the scalar
/// reference.
///
/// # Panics
/// If the running CPU does not support `isa`, `out` is not `m.cols()` long, or `r` is not a row.
pub(crate) fn widen_row(isa: Isa, m: &Matrix<'_>, r: usize, out: &mut [f32]) -> bool {
    m.format().visit(WidenRow { isa, m, r, out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{dot_row_scalar, Matrix};

    #[test]
    fn portable_tiles_match_reference() {
        let (rows, cols, t) = (11, 37, 5);
        let w: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (f32::from(u16::try_from(i).unwrap_or(0)) * 0.37 - 9.0).to_le_bytes())
            .collect();
        let m = Matrix::f32(rows, cols, &w).expect("shape");
        let x: Vec<f32> =
            (0..t * cols).map(|i| f32::from(u16::try_from(i).unwrap_or(0)).sin()).collect();
        let mut got = vec![f32::NAN; t * rows];
        run(Isa::Scalar, &m, &x, t, 0..rows, None, |j, r, v| got[j * rows + r] = v);
        for r in 0..rows {
            for j in 0..t {
                let want = dot_row_scalar(&m, r, &x[j * cols..(j + 1) * cols]);
                assert_eq!(got[j * rows + r].to_bits(), want.to_bits(), "({j}, {r})");
            }
        }
    }
}
