//! A quick self-test of the kernels on this CPU, for `sluice doctor`: every tier the CPU can
//! run computes a small pseudo-random matrix product in each weight format, and must match
//! the scalar reference bit for bit (every tier uses the same reduction order).

use crate::isa::Isa;
use crate::matmul::{matmul_scalar, matmul_with, Matrix};

/// The result of one tier on one weight format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierCheck {
    /// The tier.
    pub isa: Isa,
    /// The weight format (`f32`, `bf16`, `mxfp4`, `int8-row`).
    pub format: &'static str,
    /// True when every output is bit-identical to the scalar reference.
    pub ok: bool,
    /// Largest absolute difference from the reference (0 when `ok`).
    pub max_abs_diff: f32,
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes()[7]
        })
        .collect()
}

/// Runs every available tier against the scalar reference on a 33 × 96 matrix, 3 rows of
/// input (awkward sizes, so tails and partial tiles are exercised).
pub fn self_test() -> Vec<TierCheck> {
    const ROWS: usize = 33;
    const COLS: usize = 96;
    const T: usize = 3;
    let x: Vec<f32> = bytes(T * COLS, 7).iter().map(|&b| f32::from(b) / 64.0 - 2.0).collect();
    // f32 weights in [-1, 1); bf16 as the upper halves of those.
    let f32w: Vec<u8> = bytes(ROWS * COLS, 11)
        .iter()
        .flat_map(|&b| (f32::from(b) / 128.0 - 1.0).to_le_bytes())
        .collect();
    let bf16w: Vec<u8> = f32w.chunks_exact(4).flat_map(|c| [c[2], c[3]]).collect();
    let packed = bytes(ROWS * COLS / 2, 13);
    // E8M0 scales near 1.0 (2^-4 .. 2^3).
    let e8m0: Vec<u8> = bytes(ROWS * COLS / 32, 17).iter().map(|b| 123 + b % 8).collect();
    let int8 = bytes(ROWS * COLS, 19);
    // f16 scales 1/64 .. 1/8 (exponent 9..12, random mantissa).
    let f16s: Vec<u8> = bytes(ROWS, 23)
        .iter()
        .flat_map(|&b| (u16::from(9 + b % 4) << 10 | u16::from(b)).to_le_bytes())
        .collect();
    let matrices = [
        ("f32", Matrix::f32(ROWS, COLS, &f32w)),
        ("bf16", Matrix::bf16(ROWS, COLS, &bf16w)),
        ("mxfp4", Matrix::mxfp4(ROWS, COLS, &packed, &e8m0)),
        ("int8-row", Matrix::int8_row(ROWS, COLS, &int8, &f16s)),
    ];
    let mut out = Vec::new();
    for (format, m) in matrices {
        let Ok(m) = m else { continue };
        let mut want = vec![0f32; T * ROWS];
        matmul_scalar(&m, &x, T, &mut want);
        for isa in Isa::available() {
            let mut got = vec![0f32; T * ROWS];
            matmul_with(isa, &m, &x, T, &mut got);
            let ok = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            let max_abs_diff =
                got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            out.push(TierCheck { isa, format, ok, max_abs_diff });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_tier_matches_the_reference_in_every_format() {
        let checks = self_test();
        assert_eq!(checks.len(), 4 * Isa::available().len());
        for c in checks {
            assert!(c.ok, "{c:?}");
        }
    }
}
