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

use super::attention::add_bias;
use super::config::{GptOssConfig, SWIGLU_ALPHA};
use super::weights::MoeWeights;
use crate::combine::{add_weighted, IdOrder};
use crate::kimi_k3::Route;
use crate::qwen3::Ctx;
use crate::qwen3_moe::moe::{At, BlockOut};
use crate::ModelError;
use sluice_kernels::ops::{sigmoid, softmax_inplace};
use sluice_kernels::{matmul, Matrix};
use sluice_store::{ExpertStore, StoreError};

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
    let (mut xs, mut gu, mut act, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
        // A block of rows at a time: the batch buffers hold one block however many prompt
        // rows chose the expert (rows are independent in the kernels).
        for us in users[id].chunks(crate::ROW_BLOCK) {
            let n = us.len();
            xs.clear();
            for &(row, _) in us {
                xs.extend_from_slice(&x[row * d..(row + 1) * d]);
            }
            gu.resize(n * 2 * inter, 0.0);
            act.resize(n * inter, 0.0);
            y.resize(n * d, 0.0);
            matmul(&gate_up, &xs, n, &mut gu);
            add_bias(&mut gu, &w.gate_up_bias[id * 2 * inter..(id + 1) * 2 * inter]);
            for (a, g) in act.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                clamped_swiglu(g, c.swiglu_limit, a);
            }
            matmul(&down, &act, n, &mut y);
            add_bias(&mut y, &w.down_bias[id * d..(id + 1) * d]);
            // index_add_(expert_out * weight), experts ascending, into the running sums.
            for (j, &(row, slot)) in us.iter().enumerate() {
                let o = &mut out[row * d..(row + 1) * d];
                add_weighted(o, &y[j * d..(j + 1) * d], routes[row].weights[slot]);
            }
        }
        Ok(())
    })?;
    Ok((out, logits, routes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_softmaxes_only_the_chosen_logits() {
        let r = route(&[0.5, 3.0, -1.0, 2.0], 2);
        assert_eq!(r.ids, [1, 3]);
        let e = (-1.0f32).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
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
