//! The row-wise ops against straightforward f64 formulas (and one hand-computed convolution).

use sluice_kernels::ops::{
    causal_conv_silu_step, dot_f64, exp_inplace_with, kda_step, kda_step_reference, kda_step_with,
    l2_norm_inplace, rms_norm, sigmoid, silu, silu_glu, situ_glu, situ_glu_with, softmax_inplace,
};
use sluice_kernels::Isa;

/// Deterministic test values in roughly [−3, 3).
fn wave(n: usize, phase: f64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = 3.0 * (f64::from(u32::try_from(i).expect("small")) * 0.731 + phase).sin();
            #[allow(clippy::cast_possible_truncation)] // test data
            let v = v as f32;
            v
        })
        .collect()
}

/// `|got − want| ≤ rel · |want| + abs` for every element.
fn assert_close(got: &[f32], want: &[f64], rel: f64, abs: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(err <= rel * w.abs() + abs, "{what}[{i}]: got {g:e}, want {w:e}");
    }
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn rms_norm_matches_f64() {
    for n in [1, 7, 64, 1000] {
        let x = wave(n, 0.3);
        let w = wave(n, 1.1);
        let eps = 1e-6f32;
        let mean = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>()
            / f64::from(u32::try_from(n).expect("small"));
        let inv = 1.0 / (mean + f64::from(eps)).sqrt();
        let mut out = vec![0.0; n];
        rms_norm(&x, Some(&w), eps, &mut out);
        let want: Vec<f64> =
            x.iter().zip(&w).map(|(&v, &wi)| f64::from(wi) * f64::from(v) * inv).collect();
        assert_close(&out, &want, 1e-6, 1e-30, "rms_norm weighted");
        rms_norm(&x, None, eps, &mut out);
        let want: Vec<f64> = x.iter().map(|&v| f64::from(v) * inv).collect();
        assert_close(&out, &want, 1e-6, 1e-30, "rms_norm unweighted");
    }
}

#[test]
fn l2_norm_matches_f64() {
    for n in [1, 5, 128] {
        let x = wave(n, 2.0);
        let eps = 1e-6f32;
        let inv = 1.0 / (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() + 1e-6).sqrt();
        let mut y = x.clone();
        l2_norm_inplace(&mut y, eps);
        let want: Vec<f64> = x.iter().map(|&v| f64::from(v) * inv).collect();
        assert_close(&y, &want, 1e-6, 1e-30, "l2_norm");
    }
    // All zeros stay finite thanks to eps.
    let mut z = vec![0.0f32; 4];
    l2_norm_inplace(&mut z, 1e-6);
    assert!(z.iter().all(|v| *v == 0.0));
}

#[test]
fn situ_glu_matches_f64() {
    let g: Vec<f32> = wave(50, 0.0).iter().map(|v| v * 4.0).collect();
    let u: Vec<f32> = wave(50, 0.9).iter().map(|v| v * 5.0).collect();
    let (beta, lb) = (4.0f32, 8.0f32);
    let mut out = vec![0.0; 50];
    for linear in [Some(lb), None] {
        situ_glu(&g, &u, beta, linear, &mut out);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let (g, u, b) = (f64::from(g), f64::from(u), f64::from(beta));
                let gg = b * (g / b).tanh() * sigmoid64(g);
                let uu = linear.map_or(u, |lb| f64::from(lb) * (u / f64::from(lb)).tanh());
                gg * uu
            })
            .collect();
        assert_close(&out, &want, 1e-5, 1e-12, "situ_glu");
    }
}

#[test]
fn kimi_k3s_experts_took_the_c_librarys_tanhf_and_expf_a_value_now_every_tier_gives_the_scalar_bits(
) {
    // Gates and ups over the whole range: small (the polynomial), large (through exp), past the
    // clamps, zeros of both signs, infinities, NaN; odd lengths for the tiers' tails.
    let mut g: Vec<f32> = (0..=u32::MAX).step_by(65_537).map(f32::from_bits).collect();
    g.extend(EXP_EDGES);
    g.extend([0.624_999_9, 0.625, -0.625, 2.5, -2.5, 1e-20, -1e-20]);
    let u: Vec<f32> = g.iter().rev().copied().collect();
    for linear in [Some(8.0f32), None] {
        let mut want = vec![0.0f32; g.len()];
        situ_glu_with(Isa::Scalar, &g, &u, 4.0, linear, &mut want);
        for isa in Isa::available() {
            for len in [g.len(), 17, 7] {
                let mut got = vec![f32::NAN; len];
                situ_glu_with(isa, &g[..len], &u[..len], 4.0, linear, &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{isa} {linear:?}: situ_glu({:e}, {:e}) = {a:e}, the scalar tier {b:e}",
                        g[i],
                        u[i]
                    );
                }
            }
        }
    }
}

#[test]
fn situ_glu_is_within_a_few_units_in_the_last_place_of_f64() {
    // tanh alone: the up branch with β_lin = 1 and a gate whose factor is exactly 1 (σ(g)·β·
    // tanh(g/β) for g = 200, β = 1 rounds to 1) gives `tanh(u)` itself.
    let ulps = |a: f32, b: f32| a.to_bits().abs_diff(b.to_bits());
    let us: Vec<f32> = (0..400_001).map(|i| -20.0 + 40.0 * i as f32 / 4e5).collect();
    let gs = vec![200.0f32; us.len()];
    let mut got = vec![0.0f32; us.len()];
    situ_glu(&gs, &us, 1.0, Some(1.0), &mut got);
    let mut worst = (0, 0.0f32);
    for (&u, &t) in us.iter().zip(&got) {
        #[allow(clippy::cast_possible_truncation)]
        let exact = f64::from(u).tanh() as f32;
        let d = if exact == 0.0 { u32::from(t != 0.0) } else { ulps(t.abs(), exact.abs()) };
        if d > worst.0 {
            worst = (d, u);
        }
        assert_eq!(t.is_sign_negative(), exact.is_sign_negative(), "tanh({u:e}) sign");
    }
    assert!(worst.0 <= 2, "tanh({:e}) is {} ulps off", worst.1, worst.0);
    let mut ends = [0.0f32; 4];
    situ_glu(
        &[200.0; 4],
        &[f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0],
        1.0,
        Some(1.0),
        &mut ends,
    );
    assert_eq!(ends, [1.0, -1.0, 0.0, -0.0]);
    assert!(ends[3].is_sign_negative(), "tanh(-0) = -0");
}

#[test]
fn silu_glu_and_scalars_match_f64() {
    let g = wave(20, 0.4);
    let u = wave(20, 1.7);
    let mut out = vec![0.0; 20];
    silu_glu(&g, &u, &mut out);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| f64::from(g) * sigmoid64(f64::from(g)) * f64::from(u))
        .collect();
    assert_close(&out, &want, 1e-5, 1e-12, "silu_glu");
    for &v in &g {
        assert_close(&[sigmoid(v)], &[sigmoid64(f64::from(v))], 1e-6, 1e-30, "sigmoid");
        let s = f64::from(v) * sigmoid64(f64::from(v));
        assert_close(&[silu(v)], &[s], 1e-5, 1e-12, "silu");
    }
    let (a, b) = (wave(33, 0.1), wave(33, 0.2));
    let want: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    assert!((dot_f64(&a, &b) - want).abs() <= 1e-12 * want.abs().max(1.0));
}

#[test]
fn softmax_matches_f64() {
    for n in [1, 3, 100] {
        // Large logits: the max subtraction keeps exp finite.
        let x: Vec<f32> = wave(n, 0.5).iter().map(|v| v * 30.0).collect();
        let max = x.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|v| v / sum).collect();
        let mut y = x.clone();
        softmax_inplace(&mut y);
        assert_close(&y, &want, 1e-5, 1e-30, "softmax");
        let total: f64 = y.iter().map(|&v| f64::from(v)).sum();
        assert!((total - 1.0).abs() < 1e-5, "softmax sums to {total}");
    }
}

/// Values `exp` meets at its edges: zeros, infinities, NaN, the clamp's bounds, the overflow
/// and subnormal thresholds, the smallest normals.
const EXP_EDGES: [f32; 14] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    -104.0,
    -103.97,
    -103.9,
    -87.4,
    88.722_83,
    88.723,
    89.0,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
];

#[test]
fn softmax_took_the_c_librarys_scalar_expf_a_score_now_exp_on_every_tier_gives_the_scalar_bits() {
    // A stride over every f32 bit pattern (all signs, magnitudes, subnormals, NaN payloads).
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(4099).map(f32::from_bits).collect();
    xs.extend(EXP_EDGES);
    let mut want = xs.clone();
    exp_inplace_with(Isa::Scalar, &mut want);
    for isa in Isa::available() {
        // Odd lengths: the tiers' tails too.
        for len in [xs.len(), 17, 7] {
            let mut got = xs[..len].to_vec();
            exp_inplace_with(isa, &mut got);
            for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{isa}: exp({x:e}) = {g:e}, the scalar tier {w:e}"
                );
            }
        }
    }
}

#[test]
fn exp_is_within_one_unit_in_the_last_place() {
    // Ulps between two finite non-negative floats.
    let ulps = |a: f32, b: f32| a.to_bits().abs_diff(b.to_bits());
    let mut xs: Vec<f32> = (0..1_000_000).map(|i| -104.0 + 193.0 * i as f32 / 1e6).collect();
    xs.extend((0..100_000).map(|i| -1.0 + 2.0 * i as f32 / 1e5));
    let mut got = xs.clone();
    exp_inplace_with(Isa::Scalar, &mut got);
    let mut worst = (0, 0.0f32);
    for (&x, &g) in xs.iter().zip(&got) {
        #[allow(clippy::cast_possible_truncation)]
        let exact = f64::from(x).exp() as f32;
        let u = ulps(g, exact);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    assert!(worst.0 <= 1, "exp({:e}) is {} ulps off", worst.1, worst.0);
    let mut edges = EXP_EDGES;
    exp_inplace_with(Isa::Scalar, &mut edges);
    assert_eq!(edges[..2], [1.0, 1.0]);
    assert_eq!(edges[2..4], [f32::INFINITY, 0.0]);
    assert!(edges[4].is_nan());
    assert_eq!(edges[5], 0.0, "exp(-104) rounds to +0");
    assert!(edges[6] > 0.0 && edges[6] < f32::MIN_POSITIVE, "exp(-103.97) is subnormal");
    assert!(edges[9].is_finite() && edges[10] == f32::INFINITY, "overflow at ln(f32::MAX)");
}

#[test]
fn causal_conv_hand_computed() {
    // k = 3, 2 channels. History (oldest first, [k − 1, C]) = [[1, 2], [3, 4]].
    let mut hist = vec![1.0f32, 2.0, 3.0, 4.0];
    // w is [C, k]: channel 0 taps [0.5, −1, 2], channel 1 taps [1, 0, 0.25].
    let w = [0.5f32, -1.0, 2.0, 1.0, 0.0, 0.25];
    let y = [10.0f32, -8.0];
    let mut out = [0.0f32; 2];
    causal_conv_silu_step(&mut hist, &y, &w, 3, &mut out);
    // ch0: 0.5·1 − 1·3 + 2·10 = 17.5; ch1: 1·2 + 0·4 + 0.25·(−8) = 0.
    let want = [17.5 * sigmoid64(17.5), 0.0];
    assert_close(&out, &want, 1e-6, 1e-30, "conv output");
    assert_eq!(hist, [3.0, 4.0, 10.0, -8.0], "history shifted by one step");

    // A second step uses the shifted history: ch0 = 0.5·3 − 1·10 + 2·1 = −6.5.
    causal_conv_silu_step(&mut hist, &[1.0, 1.0], &w, 3, &mut out);
    let ch1 = 1.0 * 4.0 + 0.0 * -8.0 + 0.25 * 1.0;
    assert_close(&out, &[-6.5 * sigmoid64(-6.5), ch1 * sigmoid64(ch1)], 1e-6, 1e-30, "step 2");

    // k = 1: no history, a pointwise scale.
    let mut none: Vec<f32> = Vec::new();
    causal_conv_silu_step(&mut none, &[2.0], &[1.5], 1, &mut out[..1]);
    assert_close(&out[..1], &[3.0 * sigmoid64(3.0)], 1e-6, 1e-30, "k = 1");
}

/// Direct f64 delta rule: S *= exp(g) per key row; err = v − kᵀS; S += β k errᵀ; o = Sᵀq.
fn kda_f64(s: &mut [f64], q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: f32) -> Vec<f64> {
    let (dk, dv) = (k.len(), v.len());
    for i in 0..dk {
        for x in &mut s[i * dv..(i + 1) * dv] {
            *x *= f64::from(g[i]).exp();
        }
    }
    let err: Vec<f64> = (0..dv)
        .map(|j| f64::from(v[j]) - (0..dk).map(|i| f64::from(k[i]) * s[i * dv + j]).sum::<f64>())
        .collect();
    for i in 0..dk {
        for j in 0..dv {
            s[i * dv + j] += f64::from(beta) * f64::from(k[i]) * err[j];
        }
    }
    (0..dv).map(|j| (0..dk).map(|i| f64::from(q[i]) * s[i * dv + j]).sum()).collect()
}

#[test]
fn kda_step_matches_f64() {
    let (dk, dv) = (8, 5);
    let mut s: Vec<f32> = wave(dk * dv, 0.2).iter().map(|v| v * 0.3).collect();
    let mut s64: Vec<f64> = s.iter().map(|&v| f64::from(v)).collect();
    let mut o = vec![0.0f32; dv];
    for step in 0..4 {
        let phase = f64::from(step);
        let mut q = wave(dk, 1.0 + phase);
        let mut k = wave(dk, 2.0 + phase);
        l2_norm_inplace(&mut q, 1e-6);
        l2_norm_inplace(&mut k, 1e-6);
        let v = wave(dv, 3.0 + phase);
        let g: Vec<f32> = wave(dk, 4.0 + phase).iter().map(|x| -0.1 * x.abs()).collect();
        let beta = 0.7;
        kda_step(&mut s, &q, &k, &v, &g, beta, &mut o);
        let want = kda_f64(&mut s64, &q, &k, &v, &g, beta);
        assert_close(&o, &want, 1e-5, 1e-5, "kda output");
        assert_close(&s, &s64, 1e-5, 1e-5, "kda state");
    }
}

#[test]
fn fused_kda_step_is_bit_identical_to_the_four_sweeps() {
    // K3's head (128 × 128), the mini model's (64 × 64) and awkward sizes; several steps so
    // the state carries each step's rounding into the next.
    for (dk, dv) in [(128, 128), (64, 64), (3, 17), (17, 5), (1, 1)] {
        let mut a: Vec<f32> = wave(dk * dv, 0.4).iter().map(|v| v * 0.3).collect();
        let mut b = a.clone();
        let mut c = a.clone();
        let (mut oa, mut ob, mut oc) = (vec![0.0f32; dv], vec![0.0f32; dv], vec![0.0f32; dv]);
        for step in 0..6 {
            let phase = f64::from(step);
            let mut q = wave(dk, 1.5 + phase);
            let mut k = wave(dk, 2.5 + phase);
            l2_norm_inplace(&mut q, 1e-6);
            l2_norm_inplace(&mut k, 1e-6);
            let v = wave(dv, 3.5 + phase);
            let g: Vec<f32> = wave(dk, 4.5 + phase).iter().map(|x| -0.2 * x.abs()).collect();
            kda_step_reference(&mut b, &q, &k, &v, &g, 0.6, &mut ob);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // Every tier from the same state: each must give the reference's bits.
            let before = a.clone();
            for isa in Isa::available() {
                a.copy_from_slice(&before);
                kda_step_with(isa, &mut a, &q, &k, &v, &g, 0.6, &mut oa);
                assert_eq!(bits(&oa), bits(&ob), "{isa} output, {dk}x{dv} step {step}");
                assert_eq!(bits(&a), bits(&b), "{isa} state, {dk}x{dv} step {step}");
            }
            kda_step(&mut c, &q, &k, &v, &g, 0.6, &mut oc);
            assert_eq!(bits(&oc), bits(&ob), "default tier output, {dk}x{dv} step {step}");
        }
    }
}
