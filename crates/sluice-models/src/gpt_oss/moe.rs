//! The GPT-OSS MoE block over the T rows of a pass (transformers `GptOssMLP`, `GptOssTopKRouter`,
//! `GptOssExperts`, 5.17).
//!
//! Router: `logits = x · Wᵀ + b` in f32, `topk` over the logits (descending; ties, which the golden
//! generator rejects, by lower id), weights = softmax over the k chosen logits. Each chosen expert:
//!
//! ```python
//! gate_up = x @ W_gate_up + b_gate_up          # 2I columns, gate even, up odd
//! gate = gate.clamp(max=limit); up = up.clamp(-limit, limit)
//! out = ((up + 1) * gate * sigmoid(gate * alpha)) @ W_down + b_down
//! ```
//!
//! with the MXFP4 experts served by the expert store (see [`super::weights`]). A row's output is the sum of
//! `expert_out · weight` over its experts in ascending expert id from zero, the order of HF's
//! `index_add_` loop, added into one running sum per row as each expert finishes (the store
//! hands experts over in ascending id order; see [`crate::combine`]). The union of experts over
//! the pass runs each expert once on all its rows ([`crate::ROW_BLOCK`] at a time) through the
//! batch-invariant matmul; the combination is per row, so rows never interact.
//!
//! An expert is two kernel-pool calls ([`Expert::add_into`], [`sluice_kernels::matmul_then`]):
//! each chunk of the gate_up projection adds the bias to its cells and writes their clamped
//! SwiGLU, and each chunk of the down projection adds the bias and the weighted cells into the
//! rows' running sums, right after computing them. As separate passes over whole buffers
//! (bias, activation, bias, weighted add), that work ran on the engine thread alone while the
//! pool's helpers waited: 6% of a 256-token prefill's wall time on a 2-vCPU VM, 2.4% after
//! (docs/PERFORMANCE.md, session 18). The roundings per cell are those of the separate passes,
//! so the bits are too.

use super::attention::add_bias;
use super::config::{GptOssConfig, SWIGLU_ALPHA};
use super::weights::MoeWeights;
use crate::combine::IdOrder;
use crate::kimi_k3::Route;
use crate::qwen3::Ctx;
use crate::qwen3_moe::moe::{At, BlockOut};
use crate::ModelError;
use sluice_kernels::ops::{sigmoid, softmax_inplace};
use sluice_kernels::{add_weighted, matmul_then, Matrix, Target};
use sluice_store::{ExpertStore, StoreError};
use std::ops::Range;

/// Selects the top-k experts of one row of (biased) router logits.
pub(crate) fn route(logits: &[f32], k: usize) -> Route {
    let mut order: Vec<u32> = (0..u32::try_from(logits.len()).unwrap_or(u32::MAX)).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    order.truncate(k);
    // softmax(router_top_value, dim=1)
    let mut weights: Vec<f32> = order.iter().map(|&i| logits[i as usize]).collect();
    softmax_inplace(&mut weights);
    Route { ids: order, weights }
}

/// The clamped SwiGLU of one row of `gate_up [2I]` (interleaved) into `out [I]`.
pub(crate) fn clamped_swiglu(gate_up: &[f32], limit: f32, out: &mut [f32]) {
    for (o, gu) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
        let gate = gu[0].min(limit);
        let up = gu[1].clamp(-limit, limit);
        let glu = gate * sigmoid(gate * SWIGLU_ALPHA);
        *o = (up + 1.0) * glu;
    }
}

/// One routed expert as its two pool calls read it.
pub(crate) struct Expert<'a> {
    /// `[2I, d]`, rows interleaved: gate even, up odd.
    pub(crate) gate_up: Matrix<'a>,
    /// `[d, I]`.
    pub(crate) down: Matrix<'a>,
    /// `[2I]`, interleaved as `gate_up`'s rows.
    pub(crate) gate_up_bias: &'a [f32],
    /// `[d]`.
    pub(crate) down_bias: &'a [f32],
    /// The SwiGLU clamp.
    pub(crate) limit: f32,
}

/// The batch buffers of [`Expert::add_into`], reused from expert to expert.
#[derive(Default)]
pub(crate) struct ExpertBuffers {
    gate_up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

impl Expert<'_> {
    /// Runs the expert on `xs [n, d]`, the gathered rows of the prompt rows `to` (strictly
    /// increasing), and adds `(y + b_down) · weights[j]` into row `to[j]` of `out [T, d]`: two
    /// pool calls whose chunks finish their own cells (see the module docs).
    pub(crate) fn add_into(
        &self,
        xs: &[f32],
        to: &[usize],
        weights: &[f32],
        b: &mut ExpertBuffers,
        out: &mut [f32],
    ) {
        let n = to.len();
        assert_eq!(weights.len(), n, "gpt_oss expert: one routing weight per row");
        let (two_i, d) = (self.gate_up.rows(), self.down.rows());
        b.gate_up.resize(n * two_i, 0.0);
        b.act.resize(n * two_i / 2, 0.0);
        b.y.resize(n * d, 0.0);
        // gate_up = x @ W_gate_up + b_gate_up; then the clamped SwiGLU of each (gate, up) pair.
        // A chunk's rows start and end at multiples of 16 or at 2I, so it holds whole pairs,
        // and its pairs `r / 2` are its cells of `act` (`Target::rows(.., 2)` checks this).
        let act = |_: usize, r: Range<usize>, gu: &mut [f32], a: &mut [f32]| {
            add_bias(gu, &self.gate_up_bias[r]);
            clamped_swiglu(gu, self.limit, a);
        };
        matmul_then(&self.gate_up, xs, n, &mut b.gate_up, Target::rows(&mut b.act, 2), &act);
        // index_add_((act @ W_down + b_down) * weight), experts ascending, into the running sums.
        let add = |j: usize, r: Range<usize>, y: &mut [f32], o: &mut [f32]| {
            add_bias(y, &self.down_bias[r]);
            add_weighted(o, y, weights[j]);
        };
        matmul_then(&self.down, &b.act, n, &mut b.y, Target::scatter(out, to), &add);
    }
}

/// Runs the MoE block of `layer` on `x [t, d]` (the `post_attention_layernorm` output), its
/// experts served by `store`; returns the block output `[t, d]`, the router logits `[t, E]`
/// and each row's route.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &MoeWeights,
    store: &dyn ExpertStore,
    at: At<'_>,
    c: &GptOssConfig,
    x: &[f32],
    t: usize,
) -> Result<BlockOut, ModelError> {
    let layer = at.layer;
    let (d, e, k, inter) =
        (c.hidden_size, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size);
    let mut logits = ctx.mm(&w.router, x, t);
    add_bias(&mut logits, &w.router_bias);
    let routes: Vec<Route> = logits.chunks_exact(e).map(|l| route(l, k)).collect();

    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
    for (row, r) in routes.iter().enumerate() {
        for (slot, &id) in r.ids.iter().enumerate() {
            users[id as usize].push((row, slot));
        }
    }
    let ids: Vec<u32> =
        (0..e).filter(|&i| !users[i].is_empty()).filter_map(|i| u32::try_from(i).ok()).collect();
    // The misses start reading now; the next layer's guess is computed while they are in flight
    // and handed to the store, which reads it once this layer's experts hold their slots.
    store.read_ahead(layer, &ids);
    let guess = (at.guess)();
    let next = guess.as_ref().map(|(l, g)| (*l, g.as_slice()));
    let mut out = vec![0.0f32; t * d];
    let mut order = IdOrder::new(layer);
    let (mut xs, mut to, mut weights) = (Vec::new(), Vec::new(), Vec::new());
    let mut buffers = ExpertBuffers::default();
    store.for_each_then_prefetch(layer, &ids, next, &mut |id, v| {
        order.next(id)?;
        // Parts in the order of `GptOssExpertLayout`: gate_up blocks, scales; down blocks, scales.
        let (Ok(gate_up), Ok(down)) = (
            Matrix::mxfp4(2 * inter, d, v.part(0), v.part(1)),
            Matrix::mxfp4(d, inter, v.part(2), v.part(3)),
        ) else {
            return Err(StoreError::Consumer(format!(
                "expert {id} of layer {layer} has byte lengths that do not match its shape"
            )));
        };
        let id = id as usize;
        let expert = Expert {
            gate_up,
            down,
            gate_up_bias: &w.gate_up_bias[id * 2 * inter..(id + 1) * 2 * inter],
            down_bias: &w.down_bias[id * d..(id + 1) * d],
            limit: c.swiglu_limit,
        };
        // A block of rows at a time: the batch buffers hold one block however many prompt
        // rows chose the expert (rows are independent in the kernels).
        for us in users[id].chunks(crate::ROW_BLOCK) {
            xs.clear();
            to.clear();
            weights.clear();
            for &(row, slot) in us {
                xs.extend_from_slice(&x[row * d..(row + 1) * d]);
                to.push(row);
                weights.push(routes[row].weights[slot]);
            }
            expert.add_into(&xs, &to, &weights, &mut buffers, &mut out);
        }
        Ok(())
    })?;
    Ok((out, logits, routes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_kernels::matmul;

    #[test]
    fn router_softmaxes_only_the_chosen_logits() {
        let r = route(&[0.5, 3.0, -1.0, 2.0], 2);
        assert_eq!(r.ids, [1, 3]);
        let e = (-1.0f32).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// The old expert: a pool call per projection, and the biases, the activation and the
    /// weighted add as passes over whole buffers on the calling thread.
    fn separate_passes(e: &Expert<'_>, xs: &[f32], to: &[usize], weights: &[f32], out: &mut [f32]) {
        let (n, two_i, d) = (to.len(), e.gate_up.rows(), e.down.rows());
        let mut gu = vec![0.0f32; n * two_i];
        matmul(&e.gate_up, xs, n, &mut gu);
        add_bias(&mut gu, e.gate_up_bias);
        let mut act = vec![0.0f32; n * two_i / 2];
        for (a, g) in act.chunks_exact_mut(two_i / 2).zip(gu.chunks_exact(two_i)) {
            clamped_swiglu(g, e.limit, a);
        }
        let mut y = vec![0.0f32; n * d];
        matmul(&e.down, &act, n, &mut y);
        add_bias(&mut y, e.down_bias);
        for (j, &row) in to.iter().enumerate() {
            for (o, &v) in out[row * d..(row + 1) * d].iter_mut().zip(&y[j * d..(j + 1) * d]) {
                *o += v * weights[j];
            }
        }
    }

    /// A test weight of `format` from its weight and scale bytes.
    fn matrix<'a>(
        format: &str,
        rows: usize,
        cols: usize,
        (w, s): &'a (Vec<u8>, Vec<u8>),
    ) -> Matrix<'a> {
        match format {
            "mxfp4" => Matrix::mxfp4(rows, cols, w, s).expect("mxfp4"),
            _ => Matrix::f32(rows, cols, w).expect("f32"),
        }
    }

    #[test]
    fn a_gpt_oss_expert_activation_and_weighted_add_ran_on_the_engine_thread_alone() {
        // Two pool calls whose chunks finish their own cells give the bits of the separate
        // passes for every block size and pool, in MXFP4 (the published experts) and f32.
        let vals = |k: usize, s: f32, a: f32| -> Vec<f32> {
            (0..k).map(|i| (i as f32 * s).sin() * a).collect::<Vec<f32>>()
        };
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // Scales 2^-4 … 2^0: gate and up values on both sides of the clamp.
        let mx = |rows: usize, cols: usize, seed: usize| -> (Vec<u8>, Vec<u8>) {
            let packed = (0..rows * cols / 2)
                .map(|i| u8::try_from((i * 37 + seed) % 251).expect("a byte"))
                .collect();
            let scales = (0..rows * cols / 32)
                .map(|i| u8::try_from(123 + (i * 7 + seed) % 5).expect("a byte"))
                .collect();
            (packed, scales)
        };
        let t_max = 70;
        for (format, d, inter) in [("mxfp4", 96, 96), ("f32", 40, 40), ("f32", 200, 24)] {
            let (gu_w, down_w) = match format {
                "mxfp4" => (mx(2 * inter, d, 1), mx(d, inter, 2)),
                _ => (
                    (f32_bytes(&vals(2 * inter * d, 0.37, 1.5)), Vec::new()),
                    (f32_bytes(&vals(d * inter, 0.11, 0.5)), Vec::new()),
                ),
            };
            let (gub, db) = (vals(2 * inter, 0.7, 3.0), vals(d, 0.3, 1.0));
            let e = Expert {
                gate_up: matrix(format, 2 * inter, d, &gu_w),
                down: matrix(format, d, inter, &down_w),
                gate_up_bias: &gub,
                down_bias: &db,
                limit: 7.0,
            };
            let x = vals(t_max * d, 0.23, 2.0);
            let weights = vals(t_max, 0.9, 1.0);
            // Every other prompt row from row 1, onto running sums already holding values.
            let to: Vec<usize> = (0..t_max).map(|j| 2 * j + 1).collect();
            let base = vals((2 * t_max + 1) * d, 0.05, 1.0);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for threads in [1, 2, 3, 16] {
                let pool = sluice_kernels::Pool::new(threads).expect("pool");
                let mut b = ExpertBuffers::default();
                for n in 1..=t_max {
                    let (xs, to, w) = (&x[..n * d], &to[..n], &weights[..n]);
                    let (mut want, mut got) = (base.clone(), base.clone());
                    pool.install(|| {
                        separate_passes(&e, xs, to, w, &mut want);
                        e.add_into(xs, to, w, &mut b, &mut got);
                    });
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{format} d={d} I={inter}, {threads} threads, {n} rows"
                    );
                }
            }
        }
    }

    #[test]
    fn swiglu_clamps_gate_above_and_up_both_ways() {
        let mut out = [0.0f32; 3];
        clamped_swiglu(&[10.0, 20.0, -10.0, -20.0, 1.0, 0.5], 7.0, &mut out);
        let glu = |g: f32| g * sigmoid(g * SWIGLU_ALPHA);
        assert_eq!(out[0], 8.0 * glu(7.0), "gate 10 → 7, up 20 → 7");
        assert_eq!(out[1], -6.0 * glu(-10.0), "gate is not clamped below, up −20 → −7");
        assert_eq!(out[2], 1.5 * glu(1.0));
    }
}
