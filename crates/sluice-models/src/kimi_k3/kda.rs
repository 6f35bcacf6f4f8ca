//! Kimi Delta Attention over the T rows of a pass (K3.md §2.2; mlx-lm
//! `KimiK3DeltaAttention.__call__`, fla `naive_recurrent_kda`).
//!
//! Linear → causal depthwise conv (pre-conv inputs kept in the window) → SiLU; q, k
//! L2-normalised with eps 1e-6 on the sum of squares, q scaled by D^-½ afterwards; decay
//! `g = lb · σ(exp(A_log[h]) · (f_b(f_a x) + dt_bias))` with A_log **per head**; β = σ(b_proj x);
//! per row in order: decay → predict with the decayed state → delta write → read; output
//! RMSNorm(o_norm, rms_norm_eps) per head × σ(g_proj x) → o_proj.
//!
//! The engine thread runs the projections; everything between them runs per head on the
//! kernel pool, where a layer's first block of a pass also copies each head's committed
//! state into the working state just before stepping it (see `KdaLayer::work`).

use super::config::K3Config;
use super::state::{KdaLayer, KdaRow, KdaState};
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
            st.captured.push(st.current().clone());
        }
    }
    out
}

/// One block of `t` rows of [`forward`]; its rows' recurrence inputs are kept in `st` when the
/// pass keeps them for a partial commit.
///
/// Everything after the projections is per channel or per head, and a head's channels, conv
/// taps, window columns, decay, β and state are its own, so the whole chain (conv → norms →
/// g, β → recurrence → o_norm → gate) runs per head on the kernel pool ([`head`]): the same
/// scalar functions on the same values in the same order as a chain over all channels, so
/// the same bits. The engine thread keeps only the projections and their matmuls.
fn block(
    ctx: &Ctx<'_>,
    w: &KdaWeights,
    c: &K3Config,
    st: &mut KdaLayer,
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    let la = &c.linear_attn_config;
    let (h, dd) = (la.num_heads, la.head_dim);
    let p = h * dd;
    let d = c.hidden_size;

    let lin = [ctx.mm(&w.q_proj, x, t), ctx.mm(&w.k_proj, x, t), ctx.mm(&w.v_proj, x, t)];
    let f = ctx.mm(&w.f_b, &ctx.mm(&w.f_a, x, t), t);
    let beta: Vec<f32> = ctx.mm(&w.b_proj, x, t).into_iter().map(sigmoid).collect();
    let gate = ctx.mm(&w.g_proj, x, t);

    let mut rows: Vec<KdaRow> = if st.keep_rows {
        (0..t)
            .map(|ti| KdaRow {
                pre_conv: vec![0.0; 3 * p],
                q: vec![0.0; p],
                k: vec![0.0; p],
                v: vec![0.0; p],
                g: vec![0.0; p],
                beta: beta[ti * h..(ti + 1) * h].to_vec(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut normed = vec![0.0f32; t * p];
    let inputs = BlockInputs { w, c, lin: &lin, f: &f, beta: &beta, gate: &gate, t };
    {
        let KdaLayer { committed, work, live, .. } = &mut *st;
        // Before the layer's first block of a pass, each head starts from its committed state.
        let from = (!*live).then_some(&*committed);
        let records = rows.iter_mut().flat_map(|r| {
            let KdaRow { pre_conv, q, k, v, g, .. } = r;
            [pre_conv.as_mut_slice(), q, k, v, g]
        });
        let mut heads: Vec<Head<'_>> = work
            .s
            .chunks_exact_mut(dd * dd)
            .zip(by_head([work.conv.as_mut_slice()], h, dd))
            .zip(by_head(normed.chunks_exact_mut(p), h, dd))
            .zip(by_head(records, h, dd))
            .map(|(((s, conv), out), rec)| Head { s, conv, out, rec })
            .collect();
        sluice_kernels::pool::map_chunks_mut(&mut heads, 1, |hi, hd| {
            head(&inputs, from, hi, &mut hd[0]);
        });
        *live = true;
    }
    if st.keep_rows {
        st.rows.extend(rows);
    }
    let out = ctx.mm(&w.o_proj, &normed, t);
    debug_assert_eq!(out.len(), t * d);
    out
}

/// What every head of a block reads: the weights, the block's projections `[T, P]` (`lin` =
/// q, k, v before the conv; `f` the decay projection, `gate` the output gate's) and β
/// `[T, H]`.
struct BlockInputs<'a> {
    w: &'a KdaWeights,
    c: &'a K3Config,
    lin: &'a [Vec<f32>; 3],
    f: &'a [f32],
    beta: &'a [f32],
    gate: &'a [f32],
    t: usize,
}

/// One head's part of a block's buffers, each piece `D` wide.
struct Head<'a> {
    /// The head's recurrent state `[Dk, Dv]` in the working state.
    s: &'a mut [f32],
    /// The head's columns of the working conv window `[kernel − 1, 3·P]`: row r's q, k, v
    /// columns at `3r`, `3r + 1`, `3r + 2`.
    conv: Vec<&'a mut [f32]>,
    /// The head's columns of each row of the gated output `[T, P]`.
    out: Vec<&'a mut [f32]>,
    /// When the pass keeps rows, the head's columns of each row's record: pre-conv q, k, v,
    /// then q, k, v, g ([`RECORD`] per row).
    rec: Vec<&'a mut [f32]>,
}

/// Pieces of one row's record per head: three pre-conv groups and q, k, v, g.
const RECORD: usize = 7;

/// Splits each of `bufs` (each a whole number of `[H, D]` groups) into its `D`-wide pieces and
/// deals them out by head: entry `hi` lists head `hi`'s pieces in the order they occur.
fn by_head<'a>(
    bufs: impl IntoIterator<Item = &'a mut [f32]>,
    h: usize,
    dd: usize,
) -> Vec<Vec<&'a mut [f32]>> {
    let mut out: Vec<Vec<&mut [f32]>> = (0..h).map(|_| Vec::new()).collect();
    for buf in bufs {
        for (i, piece) in buf.chunks_exact_mut(dd).enumerate() {
            out[i % h].push(piece);
        }
    }
    out
}

/// Head `hi`'s chain over the block's rows, in row order. `from` is the committed state when
/// this is the layer's first block of the pass: the head's state and window columns are copied
/// from it first (the working copy is stale until then).
fn head(inp: &BlockInputs<'_>, from: Option<&KdaState>, hi: usize, hd: &mut Head<'_>) {
    let BlockInputs { w, c, lin, f, beta, gate, t } = *inp;
    let la = &c.linear_attn_config;
    let (h, dd, kk) = (la.num_heads, la.head_dim, la.short_conv_kernel_size);
    let p = h * dd;
    let cols = hi * dd..(hi + 1) * dd;
    if let Some(from) = from {
        hd.s.copy_from_slice(&from.s[hi * dd * dd..(hi + 1) * dd * dd]);
    }
    // The conv window holds the last kernel−1 pre-conv rows of [q; k; v] (3·P channels); each
    // projection is convolved with its own taps, so each group's columns step separately, over
    // a window of this head's columns laid out [kernel−1, D].
    let mut hist: [Vec<f32>; 3] = std::array::from_fn(|_| vec![0.0f32; (kk - 1) * dd]);
    for (j, hj) in hist.iter_mut().enumerate() {
        for (r, dst) in hj.chunks_exact_mut(dd).enumerate() {
            match from {
                Some(from) => dst.copy_from_slice(&from.conv[(3 * r + j) * p..][cols.clone()]),
                None => dst.copy_from_slice(hd.conv[3 * r + j]),
            }
        }
    }
    let taps: [&[f32]; 3] = std::array::from_fn(|j| &w.conv[j][hi * dd * kk..(hi + 1) * dd * kk]);
    let scale = (dd as f32).powf(-0.5);
    let lb = la.gate_lower_bound;
    let a = w.a_exp[hi];
    let mut qkv: [Vec<f32>; 3] = std::array::from_fn(|_| vec![0.0f32; dd]);
    let mut g = vec![0.0f32; dd];
    let mut o = vec![0.0f32; dd];
    for ti in 0..t {
        let row = ti * p + hi * dd..ti * p + (hi + 1) * dd;
        for ((hj, out), (lj, tj)) in hist.iter_mut().zip(&mut qkv).zip(lin.iter().zip(taps)) {
            causal_conv_silu_step(hj, &lj[row.clone()], tj, kk, out);
        }
        let [q, k, v] = &mut qkv;
        l2_norm_inplace(q, 1e-6);
        for e in q.iter_mut() {
            *e *= scale;
        }
        l2_norm_inplace(k, 1e-6);
        // g = lb · σ(exp(A_log_h) · (f + dt_bias)) (mlx-lm compute_lower_bound_g); without a
        // lower bound, g = −exp(A_log_h) · softplus(f + dt_bias) (compute_g).
        for ((gv, &fv), &bias) in g.iter_mut().zip(&f[row.clone()]).zip(&w.dt_bias[cols.clone()]) {
            let z = fv + bias;
            *gv = match lb {
                Some(lb) => lb * sigmoid(a * z),
                None => -a * softplus(z),
            };
        }
        kda_step(hd.s, q, k, v, &g, beta[ti * h + hi], &mut o);
        // o = RMSNorm(o_norm) per head, then × σ(gate) (FusedRMSNormGated order).
        let out = &mut *hd.out[ti];
        rms_norm(&o, Some(&w.o_norm), c.rms_norm_eps, out);
        for (v, &gv) in out.iter_mut().zip(&gate[row.clone()]) {
            *v *= sigmoid(gv);
        }
        if let Some([pq, pk, pv, rq, rk, rv, rg]) = hd.rec.get_mut(ti * RECORD..(ti + 1) * RECORD) {
            for (dst, src) in [pq, pk, pv].into_iter().zip(lin) {
                dst.copy_from_slice(&src[row.clone()]);
            }
            for (dst, src) in [rq, rk, rv, rg].into_iter().zip([&qkv[0], &qkv[1], &qkv[2], &g]) {
                dst.copy_from_slice(src);
            }
        }
    }
    for (j, hj) in hist.iter().enumerate() {
        for (r, src) in hj.chunks_exact(dd).enumerate() {
            hd.conv[3 * r + j].copy_from_slice(src);
        }
    }
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
