//! Kimi Delta Attention over the T rows of a pass (K3.md §2.2; mlx-lm
//! `KimiK3DeltaAttention.__call__`, fla `naive_recurrent_kda`).
//!
//! Linear → causal depthwise conv (pre-conv inputs kept in the window) → SiLU; q, k
//! L2-normalised with eps 1e-6 on the sum of squares, q scaled by D^-½ afterwards; decay
//! `g = lb · σ(exp(A_log[h]) · (f_b(f_a x) + dt_bias))` with A_log **per head**; β = σ(b_proj x);
//! per row in order: decay → predict with the decayed state → delta write → read; output
//! RMSNorm(o_norm, rms_norm_eps) per head × σ(g_proj x) → o_proj.

use super::config::K3Config;
use super::state::{KdaLayer, KdaRow};
use super::weights::KdaWeights;
use super::Ctx;
use sluice_kernels::ops::{causal_conv_silu_step, kda_step, l2_norm_inplace, rms_norm, sigmoid};

/// Runs the layer on `x [T, d]` (already `input_layernorm`-ed), staging state changes in `st`,
/// in blocks of at most [`crate::ROW_BLOCK`] rows: the projections, the recurrence inputs and
/// the head outputs of a block are all that is live besides the layer's output, so a long
/// prompt pass holds them for one block, not for every row. Rows are independent in every
/// kernel and the recurrence runs row by row in order either way, so the result is
/// bit-identical to one block of T rows. A block also ends at each row the pass captures the
/// state after ([`KdaLayer::capture_at`]), where the working state is copied: the state after
/// exactly those rows, for a snapshot inside the pass.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &KdaWeights,
    c: &K3Config,
    st: &mut KdaLayer,
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    let d = c.hidden_size;
    let mut out = Vec::with_capacity(t * d);
    let mut start = 0;
    while start < t {
        let capture = st.next_capture(start + 1).filter(|&r| r < t);
        let n = crate::ROW_BLOCK.min(t - start).min(capture.map_or(usize::MAX, |r| r - start));
        out.extend(block(ctx, w, c, st, &x[start * d..(start + n) * d], n));
        start += n;
        if capture == Some(start) {
            st.captured.push(st.work.clone());
        }
    }
    out
}

/// One block of `t` rows of [`forward`]; its rows' recurrence inputs are kept in `st` when the
/// pass keeps them for a partial commit.
fn block(
    ctx: &Ctx<'_>,
    w: &KdaWeights,
    c: &K3Config,
    st: &mut KdaLayer,
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    let la = &c.linear_attn_config;
    let (h, dd, kk) = (la.num_heads, la.head_dim, la.short_conv_kernel_size);
    let p = h * dd;
    let d = c.hidden_size;

    let q_lin = ctx.mm(&w.q_proj, x, t);
    let k_lin = ctx.mm(&w.k_proj, x, t);
    let v_lin = ctx.mm(&w.v_proj, x, t);
    let f = ctx.mm(&w.f_b, &ctx.mm(&w.f_a, x, t), t);
    let b = ctx.mm(&w.b_proj, x, t);
    let gate = ctx.mm(&w.g_proj, x, t);

    // The conv window holds the last kernel−1 pre-conv rows of [q; k; v] (3·P channels); each
    // projection is convolved with its own taps, so run the three channel groups separately
    // over a window laid out [kernel−1, 3P].
    let mut rows = Vec::with_capacity(t);
    let scale = (dd as f32).powf(-0.5);
    let lb = la.gate_lower_bound;
    for ti in 0..t {
        let mut pre = Vec::with_capacity(3 * p);
        pre.extend_from_slice(&q_lin[ti * p..(ti + 1) * p]);
        pre.extend_from_slice(&k_lin[ti * p..(ti + 1) * p]);
        pre.extend_from_slice(&v_lin[ti * p..(ti + 1) * p]);
        let mut qkv = [vec![0.0f32; p], vec![0.0f32; p], vec![0.0f32; p]];
        for (j, out) in qkv.iter_mut().enumerate() {
            // Gather this group's window columns, step, and scatter back.
            let mut hist = vec![0.0f32; (kk - 1) * p];
            for r in 0..kk - 1 {
                hist[r * p..(r + 1) * p]
                    .copy_from_slice(&st.work.conv[r * 3 * p + j * p..r * 3 * p + (j + 1) * p]);
            }
            causal_conv_silu_step(&mut hist, &pre[j * p..(j + 1) * p], &w.conv[j], kk, out);
        }
        if kk > 1 {
            let cv = &mut st.work.conv;
            cv.copy_within(3 * p.., 0);
            let len = cv.len();
            cv[len - 3 * p..].copy_from_slice(&pre);
        }
        let [mut q, mut k, v] = qkv;
        for hi in 0..h {
            let r = hi * dd..(hi + 1) * dd;
            l2_norm_inplace(&mut q[r.clone()], 1e-6);
            for e in &mut q[r.clone()] {
                *e *= scale;
            }
            l2_norm_inplace(&mut k[r], 1e-6);
        }
        // g = lb · σ(exp(A_log_h) · (f + dt_bias)) (mlx-lm compute_lower_bound_g); without a
        // lower bound, g = −exp(A_log_h) · softplus(f + dt_bias) (compute_g).
        let mut g = vec![0.0f32; p];
        for (ci, gv) in g.iter_mut().enumerate() {
            let a = w.a_exp[ci / dd];
            let z = f[ti * p + ci] + w.dt_bias[ci];
            *gv = match lb {
                Some(lb) => lb * sigmoid(a * z),
                None => -a * softplus(z),
            };
        }
        let beta = b[ti * h..(ti + 1) * h].iter().map(|&v| sigmoid(v)).collect();
        rows.push(KdaRow { pre_conv: pre, q, k, v, g, beta });
    }

    // Recurrence, heads in parallel (each head owns a disjoint block of the state).
    let mut o = vec![0.0f32; t * p];
    let mut per_head: Vec<Vec<f32>> =
        sluice_kernels::pool::map_chunks_mut(&mut st.work.s, dd * dd, |hi, s| {
            let mut out = vec![0.0f32; t * dd];
            for (ti, row) in rows.iter().enumerate() {
                let r = hi * dd..(hi + 1) * dd;
                kda_step(
                    s,
                    &row.q[r.clone()],
                    &row.k[r.clone()],
                    &row.v[r.clone()],
                    &row.g[r],
                    row.beta[hi],
                    &mut out[ti * dd..(ti + 1) * dd],
                );
            }
            out
        });
    for (hi, out) in per_head.iter_mut().enumerate() {
        for ti in 0..t {
            o[ti * p + hi * dd..ti * p + (hi + 1) * dd]
                .copy_from_slice(&out[ti * dd..(ti + 1) * dd]);
        }
    }
    if st.keep_rows {
        st.rows.extend(rows);
    } else {
        drop(rows);
    }

    // o = RMSNorm(o_norm) per head, then × σ(gate) (FusedRMSNormGated order).
    let mut normed = vec![0.0f32; t * p];
    for (chunk, out) in o.chunks_exact(dd).zip(normed.chunks_exact_mut(dd)) {
        rms_norm(chunk, Some(&w.o_norm), c.rms_norm_eps, out);
    }
    for (v, &gv) in normed.iter_mut().zip(&gate) {
        *v *= sigmoid(gv);
    }
    let out = ctx.mm(&w.o_proj, &normed, t);
    debug_assert_eq!(out.len(), t * d);
    out
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
