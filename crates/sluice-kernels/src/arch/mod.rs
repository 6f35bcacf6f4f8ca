//! Per-tier bodies of the matmul inner loop: one weight row against a group of up to
//! [`GROUP`] activation rows.
//!
//! Every body keeps one 16-lane accumulator per activation row, folds column `c` into lane
//! `c % 16` with a fused multiply-add in increasing `c`, and finishes with
//! [`reduce16`](crate::matmul::reduce16), which is the canonical order of
//! [`crate::matmul`]. The weight row is widened once per 16-column chunk and reused for every
//! activation row of the group, so a T-row call reads each weight byte `ceil(T / GROUP)` times
//! from cache but only once from memory, while each activation row's result is computed
//! exactly as in a one-row call.

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;

use crate::isa::Isa;
use crate::matmul::{e8m0_to_f32, reduce16, E2M1};
use sluice_core::bf16_to_f32;

/// Activation rows processed per pass over a weight row.
pub(crate) const GROUP: usize = 4;

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
}

impl Row<'_> {
    /// Checks the byte lengths against `cols`; every SIMD body relies on this.
    pub(crate) fn assert_cols(&self, cols: usize) {
        match *self {
            Self::F32(w) => assert_eq!(w.len(), 4 * cols, "f32 row length"),
            Self::Bf16(w) => assert_eq!(w.len(), 2 * cols, "bf16 row length"),
            Self::Mxfp4 { packed, scales } => {
                assert_eq!(cols % 32, 0, "mxfp4 width");
                assert_eq!(packed.len(), cols / 2, "mxfp4 packed row length");
                assert_eq!(scales.len(), cols / 32, "mxfp4 scale row length");
            }
        }
    }

    /// Widens elements `c0 .. c0 + out.len()` to f32 exactly as [`crate::Matrix::get`] does.
    pub(crate) fn widen(&self, c0: usize, out: &mut [f32]) {
        match *self {
            Self::F32(w) => {
                let bytes = &w[4 * c0..4 * (c0 + out.len())];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Self::Bf16(w) => {
                let bytes = &w[2 * c0..2 * (c0 + out.len())];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
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
        }
    }
}

/// Dispatches on the number of activation rows in a group to a body monomorphised for it,
/// so each body's accumulators are a fixed-size array the compiler keeps in registers.
macro_rules! by_group_size {
    ($out:expr, $body:ident ( $($arg:expr),* $(,)? )) => {
        match $out.len() {
            1 => $out.copy_from_slice(&$body::<1>($($arg),*)),
            2 => $out.copy_from_slice(&$body::<2>($($arg),*)),
            3 => $out.copy_from_slice(&$body::<3>($($arg),*)),
            4 => $out.copy_from_slice(&$body::<4>($($arg),*)),
            n => panic!("activation group of {n} rows (at most {})", $crate::arch::GROUP),
        }
    };
}
pub(crate) use by_group_size;

/// `out[j] = Σ_c row[c] · x[j * cols + c]` for `j < out.len()` (at most [`GROUP`]) on `isa`.
///
/// # Safety
/// The running CPU supports `isa` ([`Isa::is_available`]). Lengths are checked here.
pub(crate) unsafe fn dot_group(isa: Isa, row: Row<'_>, cols: usize, x: &[f32], out: &mut [f32]) {
    row.assert_cols(cols);
    assert!(out.len() <= GROUP, "activation group too large");
    assert_eq!(x.len(), out.len() * cols, "activation group length");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees the CPU supports AVX-512F.
        Isa::Avx512 => unsafe { x86_64::avx512_group(row, cols, x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees the CPU supports AVX2 and FMA.
        Isa::Avx2 => unsafe { x86_64::avx2_group(row, cols, x, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the caller guarantees the CPU supports Advanced SIMD.
        Isa::Neon => unsafe { aarch64::neon_group(row, cols, x, out) },
        _ => scalar_group(row, cols, x, out),
    }
}

/// Portable body: widens 16 weights at a time, then folds them into each row's lanes.
pub(crate) fn scalar_group(row: Row<'_>, cols: usize, x: &[f32], out: &mut [f32]) {
    let mut acc = [[0.0f32; 16]; GROUP];
    let mut w = [0.0f32; 16];
    for c0 in (0..cols).step_by(16) {
        let len = 16.min(cols - c0);
        row.widen(c0, &mut w[..len]);
        for (j, lanes) in acc.iter_mut().enumerate().take(out.len()) {
            let xs = &x[j * cols + c0..j * cols + c0 + len];
            for ((a, &wl), &xl) in lanes.iter_mut().zip(&w[..len]).zip(xs) {
                *a = wl.mul_add(xl, *a);
            }
        }
    }
    for (o, lanes) in out.iter_mut().zip(acc) {
        *o = reduce16(lanes);
    }
}

/// A zero-padded copy of the final partial chunk (`cols % 16` columns) of a weight row and of
/// each activation row, so a SIMD body can fold it with its full-chunk code.
///
/// Padded lanes compute `fma(0, 0, acc)`, which returns `acc` unchanged: an accumulator that
/// starts at +0.0 can never become −0.0 (an exact-zero sum rounds to +0.0 unless both addends
/// are −0.0), and `0 · 0 + acc` is exact for every other `acc`, infinities and NaN included.
pub(crate) struct Tail<const N: usize> {
    /// Widened weights, zero past the end of the row.
    pub w: [f32; 16],
    /// Activations per row of the group, zero past the end of the row.
    pub x: [[f32; 16]; N],
}

impl<const N: usize> Tail<N> {
    /// The padded tail starting at column `c0` (`cols − c0 < 16`).
    pub(crate) fn new(row: Row<'_>, cols: usize, c0: usize, x: &[f32]) -> Self {
        let len = cols - c0;
        let mut t = Self { w: [0.0; 16], x: [[0.0; 16]; N] };
        row.widen(c0, &mut t.w[..len]);
        for (j, xt) in t.x.iter_mut().enumerate() {
            xt[..len].copy_from_slice(&x[j * cols + c0..j * cols + cols]);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{dot_row_scalar, Matrix};

    #[test]
    fn scalar_group_matches_reference() {
        let (rows, cols) = (3, 37);
        let w: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (f32::from(u16::try_from(i).unwrap_or(0)) * 0.37 - 9.0).to_le_bytes())
            .collect();
        let m = Matrix::f32(rows, cols, &w).expect("shape");
        let x: Vec<f32> =
            (0..3 * cols).map(|i| f32::from(u16::try_from(i).unwrap_or(0)).sin()).collect();
        for r in 0..rows {
            let mut out = [0.0f32; 3];
            scalar_group(m.row(r), cols, &x, &mut out);
            for (j, o) in out.iter().enumerate() {
                let want = dot_row_scalar(&m, r, &x[j * cols..(j + 1) * cols]);
                assert_eq!(o.to_bits(), want.to_bits());
            }
        }
    }
}
