//! The Qwen3-MoE sparse block over the T rows of a pass (transformers `Qwen3MoeSparseMoeBlock`,
//! `Qwen3MoeTopKRouter`, `Qwen3MoeExperts`, 5.17).
//!
//! Router: `logits = x · gateᵀ` in f32, `softmax` over all experts in f32, `topk` (probability
//! descending; ties, which the golden generator rejects, by lower id), and when `norm_topk_prob`
//! the k probabilities divided by their f32 sum. Each chosen expert computes
//! `down(silu(gate x) · up x)`; a row's output is the sum of `expert_out · weight` over its
//! experts **in ascending expert id**, starting from zero, which is the order in which HF's
//! `index_add_` loop over `expert_hit` adds them.
//!
//! Batch invariance: the union of experts over the T rows runs each expert once on all the rows
//! that chose it ([`crate::ROW_BLOCK`] rows at a time), through the batch-invariant matmul, and
//! the combination is per row in an order fixed by that row's own routing, so a row's output
//! never depends on the other rows. The experts come from the expert store (mapped or streamed;
//! the same bytes either way) in ascending id order, whatever order their reads finish in, and
//! each is added into its rows' running sums as its batch finishes ([`crate::combine`]): no row
//! keeps its k expert outputs. Mapped, a layer's experts run together, three kernel-pool calls
//! for the layer instead of two per expert (`GluExpert::run_layer`; the same bits).

use super::config::Qwen3MoeConfig;
use crate::combine::GluExpert;
use crate::kimi_k3::Route;
use crate::qwen3::weights::Linear;
use crate::qwen3::Ctx;
use crate::ModelError;
use sluice_kernels::ops::{silu_glu, softmax_inplace};
use sluice_kernels::Matrix;
use sluice_store::{ExpertStore, StoreError};

/// What a sparse block returns: its output `[t, d]`, the router logits `[t, E]` and each
/// row's route (shared with GPT-OSS's block).
pub(crate) type BlockOut = (Vec<f32>, Vec<f32>, Vec<Route>);

/// Where a sparse block runs, and how to guess the experts of the next MoE layer for the store
/// to prefetch while this one computes (shared with GPT-OSS's block).
pub(crate) struct At<'a> {
    /// The block's layer.
    pub(crate) layer: usize,
    /// The guess `(next MoE layer, its likely experts)`, computed once this layer's own misses
    /// are submitted; `None` when prefetch is off or no MoE layer follows.
    pub(crate) guess: &'a dyn Fn() -> Option<(usize, Vec<u32>)>,
}

/// The experts the rows of router `logits [t, e]` would choose (each row's top `k` by logit: the
/// order both softmax-then-top-k and top-k-then-softmax routers pick in), as one list, likeliest
/// first (every row's first choice, then every second, ...), each once. A prefetch guess from a
/// layer's router on another layer's input, never a route: a wrong guess costs bandwidth, never
/// output, and the store's precision gate stops reading guesses that do not pay.
pub(crate) fn guess_union(logits: &[f32], e: usize, k: usize) -> Vec<u32> {
    let mut ranked: Vec<(usize, u32)> = Vec::new();
    for row in logits.chunks_exact(e) {
        let mut order: Vec<u32> = (0..u32::try_from(e).unwrap_or(u32::MAX)).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        ranked.extend(order.into_iter().take(k).enumerate());
    }
    ranked.sort_unstable();
    let mut seen = vec![false; e];
    ranked
        .into_iter()
        .filter_map(|(_, id)| {
            let s = seen.get_mut(id as usize)?;
            (!std::mem::replace(s, true)).then_some(id)
        })
        .collect()
}

/// Selects the top-k experts of one row of router logits.
pub(crate) fn route(logits: &[f32], c: &Qwen3MoeConfig) -> Route {
    // routing_weights = softmax(router_logits, dtype=float)
    let mut probs = logits.to_vec();
    softmax_inplace(&mut probs);
    // torch.topk(routing_weights, top_k): largest first.
    let mut order: Vec<u32> = (0..u32::try_from(probs.len()).unwrap_or(u32::MAX)).collect();
    order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
    order.truncate(c.num_experts_per_tok);
    let mut weights: Vec<f32> = order.iter().map(|&i| probs[i as usize]).collect();
    if c.norm_topk_prob {
        // router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        let sum: f32 = weights.iter().sum();
        for w in &mut weights {
            *w /= sum;
        }
    }
    Route { ids: order, weights }
}

/// Runs the sparse block of `layer` on `x [t, d]` (the `post_attention_layernorm` output), its
/// experts served by `store`; returns the block output `[t, d]`, the router logits `[t, E]` and
/// each row's route.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    router: &Linear,
    store: &dyn ExpertStore,
    at: At<'_>,
    c: &Qwen3MoeConfig,
    x: &[f32],
    t: usize,
) -> Result<BlockOut, ModelError> {
    let layer = at.layer;
    let (d, e, inter) = (c.base.hidden_size, c.num_experts, c.moe_intermediate_size);
    let logits = ctx.mm(router, x, t);
    let routes = crate::combine::routes_on_pool(&logits, e, |l| route(l, c));

    let (users, ids) = crate::combine::users(&routes, e);
    // The misses start reading now; the next layer's guess is computed while they are in flight
    // and handed to the store, which reads it once this layer's experts hold their slots.
    store.read_ahead(layer, &ids);
    let guess = (at.guess)();
    let next = guess.as_ref().map(|(l, g)| (*l, g.as_slice()));
    // final_hidden_states.index_add_(0, token_idx, expert_out * weight), experts ascending:
    // each expert once, on all of its rows, added into their running sums as it finishes.
    let mut out = vec![0.0f32; t * d];
    let mut batch = GluExpert::default();
    batch.run_layer(
        store,
        layer,
        &ids,
        next,
        |id, v| {
            // Parts in the order of `Qwen3MoeExpertLayout`: gate, up, down.
            let (Ok(gate_w), Ok(up_w), Ok(down_w)) = (
                Matrix::bf16(inter, d, v.part(0)),
                Matrix::bf16(inter, d, v.part(1)),
                Matrix::bf16(d, inter, v.part(2)),
            ) else {
                return Err(StoreError::Consumer(format!(
                    "expert {id} of layer {layer} has byte lengths that do not match its shape"
                )));
            };
            Ok([gate_w, up_w, down_w])
        },
        // Qwen3MoeMLP: down(silu(gate x) · up x)
        silu_glu,
        &users,
        crate::ROW_BLOCK,
        x,
        |row, slot| routes[row].weights[slot],
        &mut out,
    )?;
    Ok((out, logits, routes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3::config::Qwen3Config;

    fn cfg(k: usize, norm: bool) -> Qwen3MoeConfig {
        let base = Qwen3Config::from_json(&serde_json::json!({
            "vocab_size": 8, "hidden_size": 4, "intermediate_size": 4, "num_hidden_layers": 1,
            "num_attention_heads": 1, "head_dim": 4
        }))
        .expect("config");
        Qwen3MoeConfig {
            base,
            num_experts: 4,
            num_experts_per_tok: k,
            moe_intermediate_size: 2,
            norm_topk_prob: norm,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
        }
    }

    #[test]
    fn top_k_of_the_softmax_largest_first() {
        let r = route(&[0.1, 2.0, -1.0, 1.0], &cfg(2, false));
        assert_eq!(r.ids, [1, 3]);
        let z: f32 = [0.1f32, 2.0, -1.0, 1.0].iter().map(|&v| (v - 2.0).exp()).sum();
        assert!((r.weights[0] - 1.0 / z).abs() < 1e-6, "unnormalised: the softmax probability");
        let r = route(&[0.1, 2.0, -1.0, 1.0], &cfg(2, true));
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6, "renormalised to one");
        assert!(r.weights[0] > r.weights[1]);
    }

    #[test]
    fn ties_go_to_the_lower_id() {
        assert_eq!(route(&[1.0, 3.0, 3.0, 0.0], &cfg(1, true)).ids, [1]);
    }
}
