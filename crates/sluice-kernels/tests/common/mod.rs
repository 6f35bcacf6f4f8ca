//! Test-data generation shared by the matmul tests: proptest picks the shape, a seed and the
//! kind of values; a small deterministic generator then fills matrices of up to a million
//! elements quickly (a proptest `vec` strategy of that size would be far too slow). Also the
//! owned matrix of any format ([`Weights`]), the tiers under test ([`tiers`]), which every
//! matmul test file shares, and a layer batch's pair and plain stages checked against one call
//! per job ([`pair_and_plain_stages_equal_one_call_per_job`]).

use proptest::prelude::*;
use sluice_kernels::matmul::Matrix;
use sluice_kernels::{matmul, matmul_many, matmul_pair, matmul_pair_many, Isa, Job, PairJob, Pool};

/// splitmix64: tiny, fast and good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("n fits u64");
        usize::try_from(self.next_u64() % n).expect("below n")
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        // 53 random bits → [0, 1) exactly.
        let u = f64::from_bits(0x3FF0_0000_0000_0000 | (self.next_u64() >> 12)) - 1.0;
        #[allow(clippy::cast_possible_truncation)] // test data: rounding to f32 is the point
        let v = (lo + (hi - lo) * u) as f32;
        v
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64().to_le_bytes()[0]
    }
}

/// The kind of values a matrix or activation is filled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Uniform in [−4, 4).
    Normal,
    /// +0.0 and −0.0 only.
    Zeros,
    /// Magnitudes 1e12–1e15: large products, no overflow at 4097 columns.
    Large,
    /// Magnitudes around 1e-20: products are f32 subnormals.
    Tiny,
    /// Each element drawn from any of the above, plus exact ±1 and −0.
    Mixed,
}

/// Every [`Mode`] as a proptest strategy.
pub fn mode() -> impl Strategy<Value = Mode> {
    prop::sample::select(vec![Mode::Normal, Mode::Zeros, Mode::Large, Mode::Tiny, Mode::Mixed])
}

/// One value of the given mode.
pub fn value(rng: &mut Rng, mode: Mode) -> f32 {
    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    match mode {
        Mode::Normal => rng.uniform(-4.0, 4.0),
        Mode::Zeros => sign * 0.0,
        Mode::Large => sign * rng.uniform(1e12, 1e15),
        Mode::Tiny => sign * rng.uniform(1e-21, 1e-19),
        Mode::Mixed => match rng.below(7) {
            0 => value(rng, Mode::Normal),
            1 => value(rng, Mode::Zeros),
            2 => value(rng, Mode::Large),
            3 => value(rng, Mode::Tiny),
            4 => sign,
            5 => -0.0,
            _ => rng.uniform(-1e3, 1e3),
        },
    }
}

/// `n` values of the given mode.
pub fn values(rng: &mut Rng, mode: Mode, n: usize) -> Vec<f32> {
    (0..n).map(|_| value(rng, mode)).collect()
}

/// Little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bf16 bytes (truncation of the f32 pattern: keeps every mode's character).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()[2..4].to_vec()).collect()
}

/// The E8M0 scales the MXFP4 tests draw from: s = 0 is the subnormal 2^-127; 0, 1 and 25 take
/// the AVX2 tier's exact slow path, 2 and 26 are the edges of its fast path.
pub const SCALES: [u8; 14] = [0, 1, 2, 25, 26, 120, 121, 122, 123, 124, 125, 126, 127, 130];

/// MXFP4 packed nibbles and scales for `[rows, cols]`.
pub fn mxfp4_data(rng: &mut Rng, mode: Mode, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let packed = (0..rows * cols / 2)
        .map(|_| match mode {
            // +0 and −0 (code 8) in both nibbles.
            Mode::Zeros => [0x00, 0x08, 0x80, 0x88][rng.below(4)],
            _ => rng.byte(),
        })
        .collect();
    let scales = (0..rows * cols / 32)
        .map(|_| match mode {
            Mode::Mixed => u8::try_from(100 + rng.below(50)).expect("scale fits u8"),
            _ => SCALES[rng.below(SCALES.len())],
        })
        .collect();
    (packed, scales)
}

/// Bit patterns, for exact comparison (`-0.0 != 0.0` and NaN == NaN as bits).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Row-int8 values and little-endian f16 row scales for `[rows, cols]`. Scales span the f16
/// range (subnormals and the largest finite value included) in `Mixed` mode.
pub fn int8_data(rng: &mut Rng, mode: Mode, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let values = (0..rows * cols)
        .map(|_| match mode {
            Mode::Zeros => 0,
            _ => rng.byte(),
        })
        .collect();
    let scales = (0..rows)
        .flat_map(|_| {
            let bits: u16 = match mode {
                Mode::Mixed => {
                    [0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x8001, 0xBC00][rng.below(7)]
                }
                Mode::Large => 0x7000 + u16::from(rng.byte()),
                Mode::Tiny => 0x0001 + u16::from(rng.byte()),
                // Finite positive f16 around 2^-7 .. 2^0.
                _ => 0x2000 + (u16::from(rng.byte()) << 4),
            };
            bits.to_le_bytes()
        })
        .collect();
    (values, scales)
}

/// Bit patterns with every NaN mapped to one pattern: for tests whose inputs make NaNs, where
/// IEEE 754 leaves the payload and sign of a NaN result open.
pub fn bits_nan_as_one(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| if x.is_nan() { 0x7FC0_0000 } else { x.to_bits() }).collect()
}

/// FP8 e4m3 codes (NaN codes 0x7F/0xFF left out: they have their own test) and f32
/// `weight_scale_inv` bytes `[ceil(rows/128), ceil(cols/128)]` for `[rows, cols]`.
pub fn fp8_data(rng: &mut Rng, mode: Mode, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let codes = (0..rows * cols)
        .map(|_| match mode {
            Mode::Zeros => [0x00, 0x80][rng.below(2)],
            _ => match rng.byte() {
                0x7F => 0x7E,
                0xFF => 0xFE,
                b => b,
            },
        })
        .collect();
    let n = rows.div_ceil(128) * cols.div_ceil(128);
    let scales: Vec<f32> = (0..n)
        .map(|_| match mode {
            Mode::Tiny => rng.uniform(1e-41, 1e-38),
            Mode::Large => rng.uniform(1e20, 1e30),
            Mode::Mixed => [1.0, 2e-40, -0.5, rng.uniform(1e-4, 1e-2)][rng.below(4)],
            _ => rng.uniform(1e-4, 1e-2),
        })
        .collect();
    (codes, f32_bytes(&scales))
}

/// INT4 pack-quantized bytes (`weight_packed`'s little-endian words) and bf16 group scales
/// `[rows, cols/32]` for `[rows, cols]`.
pub fn int4_data(rng: &mut Rng, mode: Mode, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let packed = (0..rows * cols / 2)
        .map(|_| match mode {
            // Stored 8 is q = 0.
            Mode::Zeros => 0x88,
            _ => rng.byte(),
        })
        .collect();
    let scales: Vec<f32> = (0..rows * cols / 32)
        .map(|_| match mode {
            Mode::Tiny => rng.uniform(1e-40, 1e-38),
            Mode::Large => rng.uniform(1e30, 1e35),
            Mode::Mixed => [0.0, -0.0, 1.0, 1e-39, -rng.uniform(1e-3, 1e-1)][rng.below(5)],
            _ => rng.uniform(1e-3, 1e-1),
        })
        .collect();
    (packed, bf16_bytes(&scales))
}

/// Owned bytes of one matrix of a named format (`f32`, `bf16`, `int8`, `mxfp4`, `fp8`, `int4`)
/// and the values [`Mode`] asks for.
pub struct Weights {
    /// The format's name in the tests.
    pub format: &'static str,
    /// Output rows.
    pub rows: usize,
    /// Columns (the activation width).
    pub cols: usize,
    /// The weight bytes.
    pub data: Vec<u8>,
    /// The scale bytes (empty for f32 and bf16).
    pub scales: Vec<u8>,
}

impl Weights {
    /// A `rows × cols` matrix of `format` drawn from `rng`.
    pub fn gen(format: &'static str, rows: usize, cols: usize, rng: &mut Rng, mode: Mode) -> Self {
        let (data, scales) = match format {
            "f32" => (f32_bytes(&values(rng, mode, rows * cols)), Vec::new()),
            "bf16" => (bf16_bytes(&values(rng, mode, rows * cols)), Vec::new()),
            "int8" => int8_data(rng, mode, rows, cols),
            "mxfp4" => mxfp4_data(rng, mode, rows, cols),
            "fp8" => fp8_data(rng, mode, rows, cols),
            "int4" => int4_data(rng, mode, rows, cols),
            other => panic!("no test format {other}"),
        };
        Self { format, rows, cols, data, scales }
    }

    /// The matrix over these bytes.
    pub fn matrix(&self) -> Matrix<'_> {
        let (r, c, d, s) = (self.rows, self.cols, &self.data[..], &self.scales[..]);
        match self.format {
            "f32" => Matrix::f32(r, c, d),
            "bf16" => Matrix::bf16(r, c, d),
            "int8" => Matrix::int8_row(r, c, d, s),
            "mxfp4" => Matrix::mxfp4(r, c, d, s),
            "fp8" => Matrix::fp8_block(r, c, d, s),
            "int4" => Matrix::int4_group(r, c, d, s),
            other => panic!("no test format {other}"),
        }
        .expect("generated buffers match the shape")
    }
}

/// The tiers under test: the one `SLUICE_ISA` forces (none, with a note, if this CPU lacks
/// it), else every tier this CPU supports (with a note naming the others).
pub fn tiers() -> Vec<Isa> {
    use std::sync::Once;
    static NOTE: Once = Once::new();
    let forced = std::env::var(sluice_kernels::isa::ISA_ENV).ok().filter(|v| !v.trim().is_empty());
    let (run, note) = match forced.map(|v| v.parse::<Isa>()) {
        Some(Ok(isa)) if isa.is_available() => (vec![isa], None),
        Some(Ok(isa)) => {
            (Vec::new(), Some(format!("{isa} forced but not supported here: skipped")))
        }
        Some(Err(e)) => panic!("{e}"),
        None => {
            let missing: Vec<&str> =
                Isa::ALL.iter().filter(|i| !i.is_available()).map(|i| i.name()).collect();
            (Isa::available(), Some(format!("tiers this CPU lacks, skipped: {missing:?}")))
        }
    };
    if let Some(n) = note {
        NOTE.call_once(|| eprintln!("note: {n}"));
    }
    run
}

/// `matmul_with` on every tier under test equals `matmul_scalar` over `m`, `x` (`t` rows), NaNs
/// compared as NaN ([`bits_nan_as_one`]: IEEE 754 leaves a NaN's sign and payload open); a
/// failure names the tier and `what`.
pub fn assert_tiers_equal_scalar_nan_as_one(m: &Matrix<'_>, x: &[f32], t: usize, what: &str) {
    let mut want = vec![0.0f32; t * m.rows()];
    sluice_kernels::matmul::matmul_scalar(m, x, t, &mut want);
    for isa in tiers() {
        let mut got = vec![0.0f32; t * m.rows()];
        sluice_kernels::matmul_with(isa, m, x, t, &mut got);
        assert_eq!(bits_nan_as_one(&got), bits_nan_as_one(&want), "{isa} {what}");
    }
}

/// The cells of one job's three stages: gate, up and plain.
pub type Stages = [Vec<f32>; 3];

/// A layer batch's first two stages on `pool`, [`matmul_pair_many`] of every job's pair
/// (`ws[j]`, finished by `act`) and [`matmul_many`] of every job's `plain(&ws[j])`, equal one
/// call per job ([`matmul_pair`], [`matmul`]) bit for bit, for job `j` on `xs[j]` (`ts[j]`
/// activation rows). Returns the per-job cells, for stages that build on them.
pub fn pair_and_plain_stages_equal_one_call_per_job(
    pool: &Pool,
    ws: &[(Weights, Weights)],
    xs: &[Vec<f32>],
    ts: &[usize],
    act: &(dyn Fn(&mut [f32], &mut [f32]) + Sync),
    plain: fn(&(Weights, Weights)) -> &Weights,
    what: &str,
) -> Vec<Stages> {
    let z = |n: usize| vec![f32::NAN; n];
    let mut want: Vec<Stages> = ws
        .iter()
        .zip(ts)
        .map(|((wa, _), &t)| [z(t * wa.rows), z(t * wa.rows), z(t * wa.rows)])
        .collect();
    let mut got = want.clone();
    pool.install(|| {
        for ((w, x), (&t, [ga, gb, y])) in ws.iter().zip(xs).zip(ts.iter().zip(&mut want)) {
            matmul_pair(&w.0.matrix(), &w.1.matrix(), x, t, ga, gb, act);
            matmul(&plain(w).matrix(), x, t, y);
        }
        let mut pairs: Vec<PairJob<'_>> = ws
            .iter()
            .zip(xs)
            .zip(ts.iter().zip(&mut got))
            .map(|(((wa, wb), x), (&t, [ga, gb, _]))| PairJob {
                a: wa.matrix(),
                b: wb.matrix(),
                x,
                t,
                out_a: ga,
                out_b: gb,
            })
            .collect();
        matmul_pair_many(&mut pairs, act);
        drop(pairs);
        let mut jobs: Vec<Job<'_>> = ws
            .iter()
            .zip(xs)
            .zip(ts.iter().zip(&mut got))
            .map(|((w, x), (&t, [_, _, y]))| Job { m: plain(w).matrix(), x, t, out: y })
            .collect();
        matmul_many(&mut jobs);
    });
    for (j, (w, g)) in want.iter().zip(&got).enumerate() {
        for (stage, (w, g)) in ["gate", "up", "plain"].iter().zip(w.iter().zip(g)) {
            assert_eq!(bits(g), bits(w), "{what}: job {j} ({} rows), {stage} cells", ts[j]);
        }
    }
    want
}
