//! Row-wise operations on f32 activations: norms, activations, softmax, the KDA causal
//! convolution and delta-rule recurrence. Each works on one row (or one head) at a time, so a
//! row's result never depends on the other rows in a pass. Reductions over a row accumulate in
//! f64 in an order fixed by the row alone (index order; a softmax's sum in 8 lanes):
//! deterministic and well inside the f32 error budget.

use crate::isa::Isa;

/// `out = w ⊙ x / sqrt(mean(x²) + eps)`; `w = None` means no weight (AttnRes keys).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    #[allow(clippy::cast_precision_loss)]
    let mean = ss / x.len() as f64;
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
    match w {
        Some(w) => {
            for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
                *o = wi * (v * inv);
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * inv;
            }
        }
    }
}

/// In-place `x / sqrt(Σx² + eps)` (fla `l2norm`: eps inside the square root, on the sum).
pub fn l2_norm_inplace(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / (ss + f64::from(eps)).sqrt()) as f32;
    for v in x {
        *v *= inv;
    }
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// SiTU-GLU: `[β·tanh(g/β)·σ(g)] · [β_lin·tanh(u/β_lin)]` (σ takes the unclipped gate). A `None`
/// linear beta leaves the up branch unclipped.
///
/// `tanh` and `σ` are [`tanh1`] and `1 / (1 + exp1(−g))` in plain f32 arithmetic, many values
/// at a time on the SIMD tiers, each tier giving the scalar tier's bits. Kimi K3's experts
/// called the C library's `tanhf` (through `expm1f`) and `expf` per value: 8–10% of a
/// 512-token prefill on the K3 slice at 2 threads.
pub fn situ_glu(gate: &[f32], up: &[f32], beta: f32, linear_beta: Option<f32>, out: &mut [f32]) {
    situ_glu_with(crate::isa::isa(), gate, up, beta, linear_beta, out);
}

/// [`situ_glu`] on tier `isa` (tests compare every tier's bits).
///
/// # Panics
/// If the running CPU does not support `isa`.
pub fn situ_glu_with(
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    beta: f32,
    linear_beta: Option<f32>,
    out: &mut [f32],
) {
    crate::isa::on_tier!(isa, "situ_glu", (
        gate: &[f32], up: &[f32], beta: f32, linear_beta: Option<f32>, out: &mut [f32],
    ) {
        avx512("avx512f") => situ_body(gate, up, beta, linear_beta, out),
        avx2("avx2,fma") => situ_body(gate, up, beta, linear_beta, out),
        _ => situ_body(gate, up, beta, linear_beta, out),
    });
}

/// The values of [`situ_glu`], for every tier (the branch on the linear beta is outside the
/// loops, so each loop is straight-line arithmetic the tiers run side by side).
#[inline(always)]
fn situ_body(gate: &[f32], up: &[f32], beta: f32, linear_beta: Option<f32>, out: &mut [f32]) {
    match linear_beta {
        Some(lb) => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = situ_gate(g, beta) * (lb * tanh1(u / lb));
            }
        }
        None => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = situ_gate(g, beta) * u;
            }
        }
    }
}

/// SiTU's gate branch `β·tanh(g/β)·σ(g)` (a function, not a closure, so that it compiles with
/// the calling tier's features).
#[inline(always)]
fn situ_gate(g: f32, beta: f32) -> f32 {
    beta * tanh1(g / beta) * (1.0 / (1.0 + exp1(-g)))
}

/// `tanh(x)` in plain f32 arithmetic (Cephes' `tanhf`): for `|x| < 0.625` the odd polynomial
/// `x + x³·P(x²)`, else `1 − 2 / (exp(2|x|) + 1)` by [`exp1`] with the sign of `x`; both are
/// computed and one selected, so the tiers run it branch-free. Within two units in the last
/// place of `tanh`; ±∞ give ±1, NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh1(x: f32) -> f32 {
    const P: [f32; 5] =
        [-5.704_988_7e-3, 2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1];
    let a = x.abs();
    let z = x * x;
    let mut p = P[0];
    for &k in &P[1..] {
        p = p.mul_add(z, k);
    }
    // Odd, so formed on |x| and given x's sign: tanh(−0) stays −0.
    let small = (p * z).mul_add(a, a).copysign(x);
    let large = (1.0 - 2.0 / (exp1(a + a) + 1.0)).copysign(x);
    if a < 0.625 {
        small
    } else {
        large
    }
}

/// SiLU-GLU: `silu(g) · u`.
pub fn silu_glu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// In-place numerically stable softmax: `exp(x − max)` by [`exp_inplace`], summed in f64 in
/// [`SOFTMAX_LANES`] lanes (value `i` into lane `i mod 8`, in index order; then the lanes
/// pairwise, `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`). The order depends on the row alone.
/// The maximum is taken in lanes too: the maximum of a set does not depend on the order (NaNs
/// skipped either way; a +0.0 or −0.0 maximum gives the same `exp(x − max)`).
///
/// **Why lanes.** One f64 sum in index order is a chain of dependent additions, one addition's
/// latency a value: once the exponentials ran 16 at a time ([`exp_inplace`]), that chain and the
/// maximum's were most of a softmax over a 1,024-score row (docs/PERFORMANCE.md, issue 20,
/// session 30).
pub fn softmax_inplace(x: &mut [f32]) {
    let mut m = [f32::NEG_INFINITY; 16];
    let mut rows = x.chunks_exact(16);
    for c in &mut rows {
        for (mi, &v) in m.iter_mut().zip(c) {
            *mi = mi.max(v);
        }
    }
    let max = rows.remainder().iter().chain(&m).copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v -= max;
    }
    exp_inplace(x);
    let mut lanes = [0.0f64; SOFTMAX_LANES];
    let mut rows = x.chunks_exact(SOFTMAX_LANES);
    for c in &mut rows {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(rows.remainder()) {
        *l += f64::from(v);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    let sum = ((a + b) + (c + d)) + ((e + f) + (g + h));
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Lanes of a softmax's f64 sum ([`softmax_inplace`]).
pub const SOFTMAX_LANES: usize = 8;

/// `x = exp(x)` for every value, within one unit in the last place of the exact value, the
/// same bits on every tier ([`exp_inplace_with`]).
///
/// **Why not `f32::exp`.** A softmax over attention scores takes one exponential a score:
/// 2,048 × 1,024 × 32 a layer of a 2,048-token Qwen3-30B-A3B prefill, where the C library's
/// scalar `expf` and the softmax around it were 9% of the pass (docs/PERFORMANCE.md, issue 20,
/// session 30). Here the tiers run 8 or 16 at a time.
pub fn exp_inplace(x: &mut [f32]) {
    exp_inplace_with(crate::isa::isa(), x);
}

/// [`exp_inplace`] on tier `isa`. The body is plain f32 arithmetic, each step one IEEE
/// operation (a multiply, a fused multiply-add, a round to nearest even, integer and bit
/// moves) that the tiers only run side by side, so every tier gives the scalar tier's bits.
///
/// # Panics
/// If the running CPU does not support `isa`.
pub fn exp_inplace_with(isa: Isa, x: &mut [f32]) {
    crate::isa::on_tier!(isa, "exp", (x: &mut [f32]) {
        avx512("avx512f") => exp_body(x),
        avx2("avx2,fma") => exp_body(x),
        _ => exp_body(x),
    });
}

/// The values of [`exp_inplace`], for every tier.
#[inline(always)]
fn exp_body(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = exp1(*v);
    }
}

/// `exp(x)`: `x = n · ln 2 + r` with `n` the nearest integer to `x / ln 2` and `r` formed in
/// two parts of ln 2 (the first exact in few bits, so `n · C1` is exact), `exp(r)` by Cephes'
/// `expf` polynomial on `|r| ≤ ln 2 / 2`, then scaled by `2^n` as two powers of two, the first
/// product exact, so that a result in the subnormal range is rounded once. `x` is clamped to
/// `[−104, 89]` first: below, the result rounds to +0.0; above, it overflows to +∞ as `exp`
/// does. NaN stays NaN.
#[inline(always)]
fn exp1(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    const P: [f32; 6] =
        [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_66, 0.5];
    let c = x.clamp(-104.0, 89.0);
    let n = (c * LOG2E).round_ties_even();
    let r = (-n).mul_add(C1, c);
    let r = (-n).mul_add(C2, r);
    let mut p = P[0];
    for &k in &P[1..] {
        p = p.mul_add(r, k);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // `n` is a whole number in [−150, 129] (the clamp), so both halves' exponents are normal.
    // It is read as an integer from the low bits of `n + 1.5 · 2^23`, exact for |n| < 2^22 (a
    // saturating `as i32` made the tiers convert lane by lane).
    const MAGIC: f32 = 12_582_912.0;
    #[allow(clippy::cast_possible_wrap)]
    let ni = (n + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    #[allow(clippy::cast_sign_loss)]
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    let out = y * pow2(n1) * pow2(n2);
    if x.is_nan() {
        x
    } else {
        out
    }
}

/// Dot product accumulated in f64 in index order (for short vectors: attention scores, AttnRes
/// logits, state reads).
#[inline]
pub fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

/// One step of a causal depthwise convolution of kernel `k` followed by SiLU.
///
/// `hist` holds the previous `k − 1` inputs per channel, oldest first, laid out
/// `[k − 1, channels]`; `w` is `[channels, k]` (PyTorch `Conv1d` weight `[C, 1, k]`), tap `k − 1`
/// multiplies the current input. `hist` is shifted to include `y` afterwards.
pub fn causal_conv_silu_step(hist: &mut [f32], y: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let c = y.len();
    debug_assert_eq!(hist.len(), (k - 1) * c);
    debug_assert_eq!(w.len(), k * c);
    for ch in 0..c {
        let mut acc = 0.0f64;
        for j in 0..k - 1 {
            acc += f64::from(w[ch * k + j]) * f64::from(hist[j * c + ch]);
        }
        acc += f64::from(w[ch * k + k - 1]) * f64::from(y[ch]);
        #[allow(clippy::cast_possible_truncation)]
        let u = acc as f32;
        out[ch] = silu(u);
    }
    if k > 1 {
        hist.copy_within(c.., 0);
        hist[(k - 2) * c..].copy_from_slice(y);
    }
}

/// One KDA (gated delta rule) step for one head with state `s [dk, dv]` (row = key channel):
/// decay rows by `exp(g)`, predict `kᵀS`, write `β k (v − kᵀS)ᵀ`, read `o = Sᵀ q` from the
/// updated state. `q` is already scaled and normalised, `k` normalised.
///
/// The four steps take two sweeps over the state: each row is decayed and then folded into the
/// prediction while it is in registers, and written and then folded into the read the same
/// way. Every value and every sum is formed in the order of the four separate sweeps (the
/// prediction and the read still add rows in increasing key channel), so the result is bit for
/// bit that of [`kda_step_reference`]; the state is 64 KiB a head, so halving its passes halves
/// what a decode step moves through the cache. The sweeps run on the tier [`crate::isa::isa`]
/// picks ([`kda_step_with`]).
pub fn kda_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    kda_step_with(crate::isa::isa(), s, q, k, v, g, beta, o);
}

/// [`kda_step`] compiled for the vector width of `isa`: its sweeps run along a state row, where
/// each value column keeps its own sums (the same additions in the same order at any width; a
/// product of two f32 values is exact in f64), so every tier gives the same bits. The baseline
/// x86-64 build ran them two f64 lanes wide.
///
/// # Panics
/// If the running CPU does not support `isa`.
#[allow(clippy::too_many_arguments)]
pub fn kda_step_with(
    isa: Isa,
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    crate::isa::on_tier!(isa, "kda_step", (
        s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: f32, o: &mut [f32],
    ) {
        avx512("avx512f") => kda_step_body(s, q, k, v, g, beta, o),
        avx2("avx2,fma") => kda_step_body(s, q, k, v, g, beta, o),
        _ => kda_step_body(s, q, k, v, g, beta, o),
    });
}

/// The two sweeps of [`kda_step`], for every tier.
#[inline(always)]
fn kda_step_body(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    let dk = k.len();
    let dv = v.len();
    debug_assert_eq!(s.len(), dk * dv);
    // 1) decay key rows (fla naive_recurrent_kda: S = S * exp(g)[..., None]), 2) prediction
    // with the decayed state.
    let mut pred = vec![0.0f64; dv];
    for (i, row) in s.chunks_exact_mut(dv).take(dk).enumerate() {
        let d = g[i].exp();
        let ki = f64::from(k[i]);
        for (p, x) in pred.iter_mut().zip(row.iter_mut()) {
            *x *= d;
            *p += ki * f64::from(*x);
        }
    }
    // 3) rank-1 delta write, 4) read the updated state.
    #[allow(clippy::cast_possible_truncation)]
    let err: Vec<f32> = v.iter().zip(&pred).map(|(&vj, &pj)| (f64::from(vj) - pj) as f32).collect();
    let mut acc = pred;
    acc.fill(0.0);
    for (i, row) in s.chunks_exact_mut(dv).take(dk).enumerate() {
        let bk = beta * k[i];
        let qi = f64::from(q[i]);
        for ((a, x), &e) in acc.iter_mut().zip(row.iter_mut()).zip(&err) {
            *x += bk * e;
            *a += qi * f64::from(*x);
        }
    }
    for (oj, a) in o.iter_mut().zip(acc) {
        #[allow(clippy::cast_possible_truncation)]
        {
            *oj = a as f32;
        }
    }
}

/// [`kda_step`] as four separate sweeps over the state, in the order of fla's
/// `naive_recurrent_kda`: the reference the fused step is tested against bit for bit.
pub fn kda_step_reference(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    let dk = k.len();
    let dv = v.len();
    debug_assert_eq!(s.len(), dk * dv);
    for i in 0..dk {
        let d = g[i].exp();
        for x in &mut s[i * dv..(i + 1) * dv] {
            *x *= d;
        }
    }
    let mut pred = vec![0.0f64; dv];
    for i in 0..dk {
        let ki = f64::from(k[i]);
        for (p, &x) in pred.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
            *p += ki * f64::from(x);
        }
    }
    for i in 0..dk {
        let bk = beta * k[i];
        for (j, x) in s[i * dv..(i + 1) * dv].iter_mut().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let err = (f64::from(v[j]) - pred[j]) as f32;
            *x += bk * err;
        }
    }
    let mut acc = vec![0.0f64; dv];
    for i in 0..dk {
        let qi = f64::from(q[i]);
        for (a, &x) in acc.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
            *a += qi * f64::from(x);
        }
    }
    for (oj, a) in o.iter_mut().zip(acc) {
        #[allow(clippy::cast_possible_truncation)]
        {
            *oj = a as f32;
        }
    }
}
