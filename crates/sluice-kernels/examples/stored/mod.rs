//! Random stored matrices in every weight format for the kernels' examples (`layer_batch`,
//! `neighbours`, `pack_buffers`; each names it as `mod stored;`), and their argument reader.

use sluice_kernels::probe::random_bytes;
use sluice_kernels::Matrix;

/// The examples' error: `Send` and `Sync`, so that threads can return it.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The `i`-th command-line argument as a number, or `default` where it is not given.
pub fn arg(i: usize, default: usize) -> Result<usize, Error> {
    std::env::args().nth(i).map_or(Ok(default), |a| Ok(a.parse()?))
}

/// Random bytes and scales of a `rows × cols` matrix in `format` (bf16 and f32 with a finite,
/// moderate exponent; the scales as `sluice_kernels::probe` makes them).
pub fn stored(format: &str, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let n = rows * cols;
    let masked = |len: usize| {
        let mut w = random_bytes(len, seed);
        for hi in w.iter_mut().skip(1).step_by(2) {
            *hi = (*hi & 0x83) | 0x3C;
        }
        w
    };
    let side = |len: usize| random_bytes(len, (seed << 20) + 1);
    match format {
        "f32" => (masked(4 * n), Vec::new()),
        "int8" => (random_bytes(n, seed), [0x00, 0x20].repeat(rows)),
        "mxfp4" => {
            (random_bytes(n / 2, seed), side(n / 32).into_iter().map(|s| 119 + s % 8).collect())
        }
        "fp8" => {
            // No NaN codes (0x7F, 0xFF).
            let codes = random_bytes(n, seed)
                .into_iter()
                .map(|b| if b & 0x7F == 0x7F { b - 1 } else { b })
                .collect();
            let scales = side(rows.div_ceil(128) * cols.div_ceil(128) * 4)
                .chunks_exact(4)
                .flat_map(|b| {
                    let m = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x007F_FFFF;
                    f32::from_bits(m | (115 + u32::from(b[3] % 4)) << 23).to_le_bytes()
                })
                .collect();
            (codes, scales)
        }
        "int4" => {
            let scales = side(n / 16)
                .chunks_exact(2)
                .flat_map(|b| {
                    (u16::from(b[0] & 0x7F) | u16::from(118 + b[1] % 4) << 7).to_le_bytes()
                })
                .collect();
            (random_bytes(n / 2, seed), scales)
        }
        _ => (masked(2 * n), Vec::new()),
    }
}

/// The matrix in `format` over [`stored`]'s bytes.
pub fn matrix<'a>(
    format: &str,
    rows: usize,
    cols: usize,
    d: &'a [u8],
    s: &'a [u8],
) -> Result<Matrix<'a>, Error> {
    Ok(match format {
        "bf16" => Matrix::bf16(rows, cols, d)?,
        "f32" => Matrix::f32(rows, cols, d)?,
        "int8" => Matrix::int8_row(rows, cols, d, s)?,
        "mxfp4" => Matrix::mxfp4(rows, cols, d, s)?,
        "fp8" => Matrix::fp8_block(rows, cols, d, s)?,
        "int4" => Matrix::int4_group(rows, cols, d, s)?,
        other => return Err(format!("unknown format {other}").into()),
    })
}
