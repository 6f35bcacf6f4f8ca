//! Per-tier pieces of the matmul loop nest ([`crate::tiled`]): decoding a span of a weight row
//! to f32 and folding widened weights into register tiles of accumulators.
//!
//! This module holds the row view every tier decodes from, the portable tier (the `Scalar`
//! [`Isa`], also the fallback on any architecture), and the dispatch from an [`Isa`] to its
//! kernel. The SIMD tiers live in `avx2`, `avx512` (x86-64) and `aarch64` (NEON).

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod peak;

use std::ops::Range;

use crate::isa::Isa;
use crate::matmul::{e8m0_to_f32, Matrix, E2M1};
use crate::tiled::{self, Kernel, Lanes};
use sluice_core::bf16_to_f32;

/// One weight row in its stored format.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Row<'a> {
    /// `4 * cols` bytes of little-endian f32.
    F32(&'a [u8]),
    /// `2 * cols` bytes of little-endian bf16.
    Bf16(&'a [u8]),
    /// `cols / 2` bytes of E2M1 nibbles (low nibble first) and `cols / 32` E8M0 scales.
    Mxfp4 {
        /// Packed nibbles.
        packed: &'a [u8],
        /// One scale byte per 32-column block.
        scales: &'a [u8],
    },
    /// `cols` signed bytes and the row's scale, already widened from f16.
    Int8 {
        /// One signed byte per column.
        values: &'a [u8],
        /// The row scale.
        scale: f32,
    },
}

impl Row<'_> {
    /// Widens elements `c0 .. c0 + out.len()` to f32 exactly as [`crate::Matrix::get`] does.
    pub(crate) fn widen(&self, c0: usize, out: &mut [f32]) {
        let n = out.len();
        match *self {
            Self::F32(w) => {
                for (o, b) in out.iter_mut().zip(w[4 * c0..4 * (c0 + n)].chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Self::Bf16(w) => {
                for (o, b) in out.iter_mut().zip(w[2 * c0..2 * (c0 + n)].chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Self::Mxfp4 { packed, scales } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let c = c0 + i;
                    let b = packed[c / 2];
                    let nib = if c.is_multiple_of(2) { b & 0x0F } else { b >> 4 };
                    *o = E2M1[usize::from(nib)] * e8m0_to_f32(scales[c / 32]);
                }
            }
            Self::Int8 { values, scale } => {
                for (o, &q) in out.iter_mut().zip(&values[c0..c0 + n]) {
                    *o = f32::from(i8::from_le_bytes([q])) * scale;
                }
            }
        }
    }

    /// Widens elements `c0 .. c0 + out.len()` to the values the matmul folds: [`Self::widen`]'s,
    /// except that an int8 row gives its integers, its scale being applied once to the reduced
    /// sum ([`Self::finish`]; see [`crate::matmul`]).
    pub(crate) fn fold_values(&self, c0: usize, out: &mut [f32]) {
        match *self {
            Self::Int8 { values, .. } => {
                let n = out.len();
                for (o, &q) in out.iter_mut().zip(&values[c0..c0 + n]) {
                    *o = f32::from(i8::from_le_bytes([q]));
                }
            }
            _ => self.widen(c0, out),
        }
    }

    /// The row's dot product from its reduced sum of folded values: the sum times the row
    /// scale for int8, the sum itself otherwise.
    #[inline]
    pub(crate) fn finish(&self, sum: f32) -> f32 {
        match *self {
            Self::Int8 { scale, .. } => sum * scale,
            _ => sum,
        }
    }
}

/// The per-format parts of `R` rows of one matrix (which share a format).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn same<'a, T, const R: usize>(
    rows: [Row<'a>; R],
    part: impl Fn(Row<'a>) -> Option<T>,
) -> [T; R] {
    std::array::from_fn(|i| {
        part(rows[i]).expect("invariant: the rows of one matrix share a format")
    })
}

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
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: a prefetch never faults and has no architectural effect (SSE, which provides
    // it, is part of x86-64).
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) };
}

/// Bytes from an element of a tile of `R` rows of a dense matrix to the same column `R` rows
/// further on: the rows of a matrix are contiguous, so this is where the next tile's bytes
/// lie. The one-row kernels prefetch there as they go, one cache line per line consumed, so
/// the next tile streams in while this one is computed (prefetching whole blocks at once
/// left the loads waiting on memory; measured in `sluice probe --kernels`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn tile_ahead<const R: usize>(row: Row<'_>) -> usize {
    R * match row {
        Row::F32(w) | Row::Bf16(w) => w.len(),
        Row::Int8 { values, .. } => values.len(),
        Row::Mxfp4 { packed, .. } => packed.len(),
    }
}

/// The portable tier: element-by-element widening and lane-by-lane fused multiply-adds.
pub(crate) struct Portable;

impl Kernel for Portable {
    unsafe fn decode(row: Row<'_>, c0: usize, out: &mut [f32]) {
        row.fold_values(c0, out);
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

/// Runs the loop nest of [`crate::tiled::run`] on `isa`'s kernel.
///
/// # Safety
/// The running CPU supports `isa` ([`Isa::is_available`]).
pub(crate) unsafe fn run(
    isa: Isa,
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    emit: impl FnMut(usize, usize, f32),
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees the CPU supports AVX-512F.
        Isa::Avx512 => unsafe { tiled::run::<avx512::Avx512>(m, x, t, rows, emit) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees the CPU supports AVX2 and FMA.
        Isa::Avx2 => unsafe { tiled::run::<avx2::Avx2>(m, x, t, rows, emit) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the caller guarantees the CPU supports Advanced SIMD.
        Isa::Neon => unsafe { tiled::run::<aarch64::Neon>(m, x, t, rows, emit) },
        // SAFETY: the portable kernel runs on any CPU.
        _ => unsafe { tiled::run::<Portable>(m, x, t, rows, emit) },
    }
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
        // SAFETY: the portable kernel runs on any CPU.
        unsafe { run(Isa::Scalar, &m, &x, t, 0..rows, |j, r, v| got[j * rows + r] = v) };
        for r in 0..rows {
            for j in 0..t {
                let want = dot_row_scalar(&m, r, &x[j * cols..(j + 1) * cols]);
                assert_eq!(got[j * rows + r].to_bits(), want.to_bits(), "({j}, {r})");
            }
        }
    }
}
