//! The FP8 (128 × 128 block scales) and INT4 (pack-quantized, group 32) formats, and the
//! layouts the formats promise: every tier equals the scalar reference bit for bit at awkward
//! widths (1, 3, 17 and 4097 columns for FP8; 1, 3, 17 and 129 groups of 32 for INT4, whose
//! width is a whole number of groups) and row counts (partial 128-row scale blocks); a T-row
//! call equals T one-row calls for T up to 64 in pools of 1 to 4 threads, in every format;
//! e4m3 decodes as an independent table says; GPT-OSS's MXFP4 tensors and compressed-tensors'
//! INT4 words are read as published; a scale tensor whose shape contradicts its weight's is
//! refused by name.
//!
//! Tiers as in `tests/matmul.rs`: every tier the CPU supports, or the one `SLUICE_ISA` forces.

// Not every helper of the shared test module is used here.
#[allow(dead_code)]
mod common;

use common::{
    assert_tiers_equal_scalar_nan_as_one, bf16_bytes, bits, bits_nan_as_one, f32_bytes, fp8_data,
    mode, tiers, values, Mode, Rng, Weights,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_kernels::matmul::{matmul_scalar, Matrix, E2M1, E4M3};
use sluice_kernels::{matmul_with, KernelError, Pool, WeightFormat};

/// FP8 widths: the brief's 1, 3, 17, 4097, and a partial last 128-column block (200).
const FP8_COLS: [usize; 5] = [1, 3, 17, 200, 4097];
/// INT4 widths: 1, 3, 17 and 129 groups of 32.
const INT4_COLS: [usize; 4] = [32, 96, 544, 4128];
/// Row counts: 1, a few, one past a 128-row scale block, several blocks with a partial one.
const ROWS: [usize; 4] = [1, 5, 129, 300];

/// `matmul_with` on every tier equals `matmul_scalar` bit for bit.
fn check(w: &Weights, t: usize, rng: &mut Rng, xm: Mode) -> Result<(), TestCaseError> {
    let m = w.matrix();
    let x = values(rng, xm, t * w.cols);
    let mut want = vec![0.0f32; t * w.rows];
    matmul_scalar(&m, &x, t, &mut want);
    for isa in tiers() {
        // Poisoned, so an unwritten cell cannot pass.
        let mut got = vec![f32::from_bits(0x7FA5_5A5A); t * w.rows];
        matmul_with(isa, &m, &x, t, &mut got);
        if let Some(i) = bits(&got).iter().zip(bits(&want)).position(|(g, w)| *g != w) {
            return Err(TestCaseError::fail(format!(
                "{isa} {} {}x{} t={t}: cell (t={}, r={}) got {:#010x} want {:#010x}",
                w.format,
                w.rows,
                w.cols,
                i / w.rows,
                i % w.rows,
                got[i].to_bits(),
                want[i].to_bits()
            )));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn fp8_tiers_bit_exact(
        cols in prop::sample::select(FP8_COLS.to_vec()),
        rows in prop::sample::select(ROWS.to_vec()),
        t in prop::sample::select(vec![1usize, 2, 3, 8, 9, 70]),
        seed in any::<u64>(), wm in mode(), xm in mode(),
    ) {
        let mut rng = Rng::new(seed);
        let w = Weights::gen("fp8", rows, cols, &mut rng, wm);
        check(&w, t, &mut rng, xm)?;
    }

    #[test]
    fn int4_tiers_bit_exact(
        cols in prop::sample::select(INT4_COLS.to_vec()),
        rows in prop::sample::select(ROWS.to_vec()),
        t in prop::sample::select(vec![1usize, 2, 3, 8, 9, 70]),
        seed in any::<u64>(), wm in mode(), xm in mode(),
    ) {
        let mut rng = Rng::new(seed);
        let w = Weights::gen("int4", rows, cols, &mut rng, wm);
        check(&w, t, &mut rng, xm)?;
    }
}

/// Every FP8 and INT4 width once at T = 1, 3 and 9, deterministically, so a tail bug cannot
/// hide behind proptest's sampling.
#[test]
fn every_fp8_and_int4_width() {
    for (format, widths) in [("fp8", &FP8_COLS[..]), ("int4", &INT4_COLS[..])] {
        for (i, &cols) in widths.iter().enumerate() {
            for t in [1, 3, 9] {
                let mut rng = Rng::new(u64::try_from(i * 100 + t).expect("small"));
                let w = Weights::gen(format, 130, cols, &mut rng, Mode::Normal);
                if let Err(e) = check(&w, t, &mut rng, Mode::Normal) {
                    panic!("{e}");
                }
            }
        }
    }
}

/// In every format, row `t` of a T-row call equals the one-row call on `x[t]`, for T up to
/// 64, in pools of 1 to 4 threads, on every tier.
#[test]
fn t_rows_equal_single_rows_in_every_format() {
    let shapes = [
        ("f32", 70, 300),
        ("bf16", 70, 300),
        ("int8", 70, 529),
        ("mxfp4", 70, 1056),
        ("fp8", 150, 1100),
        ("int4", 150, 1056),
    ];
    let pools: Vec<Pool> = (1..=4).map(|n| Pool::new(n).expect("kernel pool")).collect();
    let t_max = 64;
    for (k, &(format, rows, cols)) in shapes.iter().enumerate() {
        let mut rng = Rng::new(0xF0_0000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
        let m = w.matrix();
        let x = values(&mut rng, Mode::Normal, t_max * cols);
        for isa in tiers() {
            let mut single = vec![f32::NAN; t_max * rows];
            pools[0].install(|| {
                for (xr, o) in x.chunks_exact(cols).zip(single.chunks_exact_mut(rows)) {
                    matmul_with(isa, &m, xr, 1, o);
                }
            });
            let single = bits(&single);
            for (threads, pool) in (1..=4).zip(&pools) {
                for t in [2, 3, 7, 8, 9, 17, 33, 64] {
                    let mut got = vec![f32::NAN; t * rows];
                    pool.install(|| matmul_with(isa, &m, &x[..t * cols], t, &mut got));
                    assert_eq!(
                        bits(&got),
                        single[..t * rows],
                        "{isa} {format} t={t} threads={threads}"
                    );
                }
            }
        }
    }
}

/// Every e4m3fn code against a table built independently from the format's definition (sign,
/// 4-bit exponent with bias 7, 3-bit mantissa, subnormals at exponent 0, NaN at S.1111.111,
/// no infinities), in f64; and the two NaN codes decode to the canonical quiet NaN.
#[test]
fn e4m3_decode_matches_an_independent_table() {
    for code in 0..=255u8 {
        let sign = if code & 0x80 == 0 { 1.0f64 } else { -1.0 };
        let e = i32::from((code >> 3) & 0xF);
        let m = f64::from(code & 7);
        let got = E4M3[usize::from(code)];
        if code & 0x7F == 0x7F {
            assert_eq!(got.to_bits(), 0x7FC0_0000, "code {code:#04x} is NaN");
            continue;
        }
        let want = if e == 0 {
            sign * m / 8.0 * 2f64.powi(-6)
        } else {
            sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        assert_eq!(f64::from(got), want, "code {code:#04x}");
        assert_eq!(got.is_sign_negative(), sign < 0.0, "code {code:#04x}: sign");
    }
    // Spot values from the OCP FP8 specification.
    assert_eq!(E4M3[0x7E], 448.0);
    assert_eq!(E4M3[0x01], 2f32.powi(-9));
    assert_eq!(E4M3[0x08], 2f32.powi(-6));
    assert_eq!(E4M3[0x38], 1.0);
    assert_eq!(E4M3[0xC0], -2.0);
}

/// A NaN code gives a NaN output on every tier (compared as NaN), and its row's other outputs
/// are unaffected.
#[test]
fn fp8_nan_codes_give_nan() {
    let (rows, cols) = (3, 160);
    let mut codes = vec![0x38u8; rows * cols]; // 1.0
    codes[5] = 0x7F;
    codes[cols + 150] = 0xFF;
    let scales = f32_bytes(&[0.5, 0.25]);
    let m = Matrix::fp8_block(rows, cols, &codes, &scales).expect("shape");
    let x = vec![1.0f32; 5 * cols];
    for isa in tiers() {
        for t in [1, 2, 5] {
            let mut got = vec![0.0f32; t * rows];
            matmul_with(isa, &m, &x[..t * cols], t, &mut got);
            for ti in 0..t {
                assert!(got[ti * rows].is_nan() && got[ti * rows + 1].is_nan(), "{isa}");
                // Row 2: 128 × 0.5 + 32 × 0.25 = 72.
                assert_eq!(got[ti * rows + 2], 72.0, "{isa}");
            }
        }
    }
}

/// The FP8 register kernels fold a span without the NaN mask when it holds no NaN code, and
/// masked only when it does (AVX-512: the span folded again after a running check; AVX2: a
/// scan first). A few NaN codes among clean spans — in the first 32 codes of a span, in the
/// second 16 of a 32-code check, in a span's last 16 codes after an odd number of 16-column
/// steps, one of each sign — must make exactly their rows NaN and leave every other output the
/// scalar reference's bits, one to 14 activation rows (the one-row fold, the tiles, the
/// buffered nest), in pools of one and three threads.
#[test]
fn fp8_nan_codes_among_clean_spans_make_only_their_rows_nan() {
    let (rows, cols) = (40, 1072);
    let mut rng = Rng::new(0x000F_8AA7);
    let (mut codes, scales) = fp8_data(&mut rng, Mode::Normal, rows, cols);
    let nan_at = [(3, 1060, 0x7F), (17, 5, 0xFF), (22, 20, 0x7F), (30, 700, 0xFF)];
    for &(r, c, code) in &nan_at {
        codes[r * cols + c] = code;
    }
    let m = Matrix::fp8_block(rows, cols, &codes, &scales).expect("shape");
    let x = values(&mut rng, Mode::Normal, 14 * cols);
    let pools = [Pool::new(1).expect("kernel pool"), Pool::new(3).expect("kernel pool")];
    for t in 1..=14 {
        let mut want = vec![0.0f32; t * rows];
        matmul_scalar(&m, &x[..t * cols], t, &mut want);
        for (ti, row) in want.chunks_exact(rows).enumerate() {
            for (r, v) in row.iter().enumerate() {
                let nan_row = nan_at.iter().any(|&(nr, _, _)| nr == r);
                assert_eq!(v.is_nan(), nan_row, "reference: token {ti}, row {r}");
            }
        }
        for isa in tiers() {
            for (pool, threads) in pools.iter().zip([1, 3]) {
                let mut got = vec![0.0f32; t * rows];
                pool.install(|| matmul_with(isa, &m, &x[..t * cols], t, &mut got));
                assert_eq!(
                    bits_nan_as_one(&got),
                    bits_nan_as_one(&want),
                    "{isa} t={t} threads={threads}"
                );
            }
        }
    }
}

/// Element `(r, c)` of an FP8 matrix is `f32(e4m3) · s[r/128][c/128]` with partial blocks
/// along both rows and columns.
#[test]
fn fp8_partial_blocks_on_both_axes() {
    let (rows, cols) = (130, 200);
    let mut rng = Rng::new(0xF8);
    let (codes, scale_bytes) = fp8_data(&mut rng, Mode::Normal, rows, cols);
    assert_eq!(scale_bytes.len(), 2 * 2 * 4);
    let s: Vec<f32> =
        scale_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let m = Matrix::fp8_block(rows, cols, &codes, &scale_bytes).expect("shape");
    for r in 0..rows {
        for c in 0..cols {
            let want = E4M3[usize::from(codes[r * cols + c])] * s[(r / 128) * 2 + c / 128];
            assert_eq!(m.get(r, c).to_bits(), want.to_bits(), "({r}, {c})");
        }
    }
}

/// `row_to_f32` (how a DeepSeek-V3 pass widens `kv_b_proj`) read a block's scale for every
/// value; it now takes each block of columns at once, a partial block last, and must give
/// `f32(e4m3) · s[r/128][c/128]` for every element.
#[test]
fn fp8_rows_widened_reading_the_scale_per_value_now_per_block_give_each_blocks_values() {
    let (rows, cols) = (3, 300);
    let mut rng = Rng::new(0xF9);
    let (codes, scale_bytes) = fp8_data(&mut rng, Mode::Normal, rows, cols);
    let s: Vec<f32> =
        scale_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let m = Matrix::fp8_block(rows, cols, &codes, &scale_bytes).expect("shape");
    for r in 0..rows {
        let mut got = vec![f32::NAN; cols];
        m.row_to_f32(r, &mut got);
        for (c, g) in got.iter().enumerate() {
            let want = E4M3[usize::from(codes[r * cols + c])] * s[c / 128];
            assert_eq!(g.to_bits(), want.to_bits(), "({r}, {c})");
        }
    }
}

/// `row_to_f32` widened every row with the scalar reference decode (10% of a DeepSeek-V3
/// slice's decode step, which widens `kv_b_proj` rows every pass); a whole row now takes the
/// tier's decode where the format's decodes give its widened bits, and must give `get`'s value
/// for every element, every format and tier (int8 and MXFP4 keep the reference: int8's tiers
/// decode the values before the row scale, MXFP4's AVX2 decode drops a zero's sign).
#[test]
fn rows_widened_by_the_scalar_decode_now_take_the_tiers_decode_same_values() {
    let mut rng = Rng::new(0x0F32);
    for format in ["f32", "bf16", "int8", "mxfp4", "fp8", "int4"] {
        // Widths past a 16-value step where the format allows them (not MXFP4's and INT4's
        // 32-value blocks).
        let odd: &[(usize, usize)] =
            if matches!(format, "mxfp4" | "int4") { &[] } else { &[(2, 40), (1, 7)] };
        for &(rows, cols) in [(3, 320), (2, 96)].iter().chain(odd) {
            let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
            let m = w.matrix();
            for isa in tiers() {
                for r in 0..rows {
                    let mut got = vec![f32::NAN; cols];
                    m.row_to_f32_with(isa, r, &mut got);
                    let want: Vec<f32> = (0..cols).map(|c| m.get(r, c)).collect();
                    assert_eq!(
                        bits_nan_as_one(&got),
                        bits_nan_as_one(&want),
                        "{format} {rows}x{cols} {isa} row {r}"
                    );
                }
            }
        }
    }
}

/// compressed-tensors' definition, word by word: element `e` of a row in word `e/8` at bits
/// `4·(e % 8)`, stored as `q + 8`; the matrix over the words' little-endian bytes gives
/// `q · scale[r][c/32]`.
#[test]
fn int4_words_are_read_as_compressed_tensors_packs_them() {
    let (rows, cols) = (3, 64);
    let mut rng = Rng::new(0x14);
    let q: Vec<i32> =
        (0..rows * cols).map(|_| i32::try_from(rng.below(16)).expect("small") - 8).collect();
    let words: Vec<i32> = q
        .chunks_exact(8)
        .map(|e| {
            e.iter()
                .enumerate()
                .fold(0u32, |w, (i, &v)| w | (u32::try_from(v + 8).expect("0..16") << (4 * i)))
        })
        .map(u32::cast_signed)
        .collect();
    let packed: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let scales = [0.5f32, -0.25, 2.0, 1.0, 0.125, 3.0];
    let scale_bytes = bf16_bytes(&scales);
    let m = Matrix::int4_group(rows, cols, &packed, &scale_bytes).expect("shape");
    for r in 0..rows {
        for c in 0..cols {
            #[allow(clippy::cast_precision_loss)] // |q| <= 8
            let want = q[r * cols + c] as f32 * scales[r * 2 + c / 32];
            assert_eq!(m.get(r, c), want, "({r}, {c})");
        }
    }
}

/// GPT-OSS's MXFP4 expert tensors, built in their published shape — `*_blocks`
/// `[E, out, in/32, 16]` and `*_scales` `[E, out, in/32]`, byte `k` of a block holding elements
/// `2k` (low nibble) and `2k + 1` (high nibble) — are, for one expert, exactly
/// `Matrix::mxfp4`'s layout: the matrix over expert `e`'s bytes returns
/// `E2M1[nibble] · 2^(s − 127)` for every element, and multiplies as the f64 reference does.
#[test]
fn gpt_oss_blocks_are_the_mxfp4_layout() {
    let (experts, out, inp) = (3, 5, 96);
    let nb = inp / 32;
    let mut rng = Rng::new(0x6057);
    // Nested as published: blocks[e][r][b][k], scales[e][r][b].
    let blocks: Vec<Vec<Vec<[u8; 16]>>> = (0..experts)
        .map(|_| {
            (0..out)
                .map(|_| (0..nb).map(|_| std::array::from_fn(|_| rng.byte())).collect())
                .collect()
        })
        .collect();
    let scales: Vec<Vec<Vec<u8>>> = (0..experts)
        .map(|_| {
            (0..out)
                .map(|_| {
                    (0..nb).map(|_| 120 + u8::try_from(rng.below(10)).expect("small")).collect()
                })
                .collect()
        })
        .collect();
    // The safetensors bytes: row-major flattening of both tensors.
    let blocks_flat: Vec<u8> = blocks.iter().flatten().flatten().flatten().copied().collect();
    let scales_flat: Vec<u8> = scales.iter().flatten().flatten().copied().collect();
    let (pb, ps) = (out * inp / 2, out * inp / 32);
    let x: Vec<f32> =
        (0..inp).map(|i| (f32::from(u8::try_from(i).expect("small")) * 0.37).sin()).collect();
    for e in 0..experts {
        let m = Matrix::mxfp4(
            out,
            inp,
            &blocks_flat[e * pb..(e + 1) * pb],
            &scales_flat[e * ps..(e + 1) * ps],
        )
        .expect("one expert's bytes");
        for r in 0..out {
            let mut exact = 0.0f64;
            for c in 0..inp {
                let byte = blocks[e][r][c / 32][(c % 32) / 2];
                let nib = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                let s = i32::from(scales[e][r][c / 32]) - 127;
                let want = f64::from(E2M1[usize::from(nib)]) * 2f64.powi(s);
                assert_eq!(f64::from(m.get(r, c)), want, "expert {e} ({r}, {c})");
                exact += want * f64::from(x[c]);
            }
            for isa in tiers() {
                let mut got = vec![0.0f32; out];
                matmul_with(isa, &m, &x, 1, &mut got);
                assert!((f64::from(got[r]) - exact).abs() <= 1e-5 * exact.abs().max(1.0), "{isa}");
            }
        }
    }
}

/// A scale buffer or declared scale shape that contradicts the weight shape is refused with an
/// error naming the format and both shapes.
#[test]
fn scale_shape_contradicting_weight_shape_is_refused_by_name() {
    let codes = vec![0u8; 130 * 200];
    // [ceil(130/128), ceil(200/128)] = [2, 2] f32 = 16 bytes; give [1, 2].
    let err = Matrix::fp8_block(130, 200, &codes, &[0u8; 8]).expect_err("short scales");
    assert!(matches!(
        err,
        KernelError::ScaleShape { format: "fp8", rows: 130, cols: 200, expected: [2, 2], .. }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("fp8")
            && msg.contains("130x200")
            && msg.contains("[2, 2]")
            && msg.contains("8 bytes"),
        "{msg}"
    );
    let err = WeightFormat::Fp8Block.check_scale_shape(130, 200, &[1, 2]).expect_err("shape");
    assert!(err.to_string().contains("[1, 2]") && err.to_string().contains("[2, 2]"), "{err}");
    assert!(WeightFormat::Fp8Block.check_scale_shape(130, 200, &[2, 2]).is_ok());

    let packed = vec![0u8; 4 * 64 / 2];
    let err = Matrix::int4_group(4, 64, &packed, &[0u8; 4 * 2]).expect_err("short scales");
    assert!(err.to_string().contains("int4") && err.to_string().contains("[4, 2]"), "{err}");
    let err = WeightFormat::Int4Group.check_scale_shape(4, 64, &[4, 1]).expect_err("shape");
    assert!(err.to_string().contains("4x64") && err.to_string().contains("[4, 1]"), "{err}");
    let err = Matrix::int4_group(4, 48, &packed[..96], &[0u8; 8]).expect_err("width");
    assert_eq!(err.to_string(), "int4 matrix width 48 is not a multiple of its 32-column group");
    assert!(WeightFormat::Mxfp4.check_scale_shape(4, 64, &[4, 2]).is_ok());
    assert!(WeightFormat::Int8Row.check_scale_shape(4, 64, &[4]).is_ok());
    assert!(WeightFormat::Bf16.check_scale_shape(4, 64, &[]).is_ok());
}

/// The format table lists every format once, under distinct names.
#[test]
fn format_table_names() {
    let names: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.name()).collect();
    assert_eq!(names, ["f32", "bf16", "mxfp4", "int8", "fp8", "int4"]);
}

/// FP8 with scales whose products overflow to ±∞ or underflow to subnormals, on every tier
/// (NaNs from ∞ − ∞ compared as NaN).
#[test]
fn fp8_extreme_scales() {
    // 304 columns: a multiple of 16, so few rows take the AVX-512 tile of the stored codes
    // (whose spans with a scale of 2^120 or more fall back to the buffered decode).
    for (rows, cols) in [(131, 300), (131, 304)] {
        for (k, s) in [3.0e38f32, 1e-40, -1e-45, f32::INFINITY].into_iter().enumerate() {
            let mut rng = Rng::new(0xE7 + u64::try_from(k).expect("small"));
            let (codes, _) = fp8_data(&mut rng, Mode::Normal, rows, cols);
            let scales = f32_bytes(&[s, 1.0, s, 0.5, s, s]);
            let m = Matrix::fp8_block(rows, cols, &codes, &scales).expect("shape");
            for t in [1, 3, 9] {
                let x = values(&mut rng, Mode::Normal, t * cols);
                let what = format!("{cols} columns s={s} t={t}");
                assert_tiers_equal_scalar_nan_as_one(&m, &x, t, &what);
            }
        }
    }
}

/// A block scale of 2^120 or more is finite but its product with 2^8 (the factor the x86
/// register kernels fold with) is not: such a span goes to the buffered decode, which
/// multiplies twice. The kernels find it block by block as they fold, so a span whose first
/// block fuses and whose second does not is abandoned halfway (nothing stored) and folded
/// again by the buffered decode. Codes below 64 in magnitude and small activations keep every
/// product and sum finite, so a fold with the overflowed factor would show as ∞ here
/// (`fp8_extreme_scales` cannot tell: its outputs overflow either way).
#[test]
fn fp8_scales_past_2_to_the_120_fall_back_to_the_buffered_decode_even_mid_span() {
    let (rows, cols) = (131, 304);
    let mut rng = Rng::new(0x0F8B_1200);
    let (mut codes, _) = fp8_data(&mut rng, Mode::Normal, rows, cols);
    for c in &mut codes {
        // Exponent field below 13: |value| < 64.
        if *c & 0x7F >= 0x68 {
            *c &= 0xA7;
        }
    }
    let big = 2f32.powi(121);
    let scales = f32_bytes(&[1.0, big, 0.5, big, 0.25, 1.0]);
    let m = Matrix::fp8_block(rows, cols, &codes, &scales).expect("shape");
    for t in [1, 2, 3, 5, 9, 14] {
        let x: Vec<f32> =
            values(&mut rng, Mode::Normal, t * cols).iter().map(|v| v * 1e-3).collect();
        let mut want = vec![0.0f32; t * rows];
        matmul_scalar(&m, &x, t, &mut want);
        assert!(want.iter().all(|v| v.is_finite()), "the reference stays finite");
        assert_tiers_equal_scalar_nan_as_one(&m, &x, t, &format!("t={t}"));
    }
}

/// Every finite e4m3 code, in every lane position, through every tier's one-row and buffered
/// decodes, read alone (one-hot activations, so no sum can round a wrong subnormal away): the
/// x86 decode once put subnormal codes into subnormal f32s (and ran 7× slower on Intel cores,
/// which take a microcode assist on each); its replacement widens through halves and must give
/// the table's value for every code. NaN codes have their own test.
#[test]
fn fp8_subnormal_codes_decoded_through_subnormal_floats() {
    let cols = 256;
    let rows = 16;
    let finite = |c: usize| match u8::try_from(c % 256).expect("a byte") {
        0x7F => 0x00,
        0xFF => 0x80,
        b => b,
    };
    // Row r holds every code once, rotated by r, so each code meets each lane position.
    let codes: Vec<u8> =
        (0..rows).flat_map(|r| (0..cols).map(move |c| finite((c + 17 * r) % 256))).collect();
    let scales = f32_bytes(&[0.75, -1.5e-3]);
    let m = Matrix::fp8_block(rows, cols, &codes, &scales).expect("shape");
    // T = 1 per column (the one-row kernels), then all columns at once (T = 256: the buffered
    // decode of the many-row kernels).
    let one_hot = |t: usize, j: usize| {
        let mut x = vec![0.0f32; cols];
        x[j] = 1.0 + t as f32;
        x
    };
    let mut cases: Vec<(usize, Vec<f32>)> = (0..cols).map(|j| (1, one_hot(0, j))).collect();
    cases.push((cols, (0..cols).flat_map(|j| one_hot(j % 3, j)).collect()));
    for (t, x) in cases {
        let mut want = vec![0.0f32; t * rows];
        matmul_scalar(&m, &x, t, &mut want);
        for isa in tiers() {
            let mut got = vec![0.0f32; t * rows];
            matmul_with(isa, &m, &x, t, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{isa} T={t} output {i}: {g:e} vs {w:e}");
            }
        }
    }
}
