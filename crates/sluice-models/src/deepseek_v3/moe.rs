//! The DeepSeek-V3 MoE block over the T rows of a pass: group-limited sigmoid routing, routed
//! experts and the shared experts (transformers `DeepseekV3MoE`, `DeepseekV3Experts`, 5.17;
//! routing as DeepSeek-V3 `inference/model.py` `Gate.forward`).
//!
//! Router, per row: `logits = x · gateᵀ` in f32; `scores = σ(logits)`; `biased = scores +
//! e_score_correction_bias` (selection only); each of the `n_group` groups is scored by the sum of
//! its two largest biased scores; the `topk_group` best groups are kept and the others masked
//! with **−inf** (DeepSeek's reference; transformers 4.x filled 0.0, which picks experts from
//! excluded groups when fewer than k biased scores in the kept groups are positive — tiny-a's
//! goldens hold such rows); the top-k biased scores among the kept groups choose the experts (ties
//! by lower id); their weights are the unbiased scores, divided by their sum (`+ 1e-20`) when
//! `norm_topk_prob`, times `routed_scaling_factor`.
//!
//! Combination, per row: `Σ expert_out · weight` over the row's experts in ascending expert id
//! from zero (the order of transformers' `index_add_` loop over `expert_hit`), added into one
//! running sum per row as each expert finishes (the store hands experts over in ascending id
//! order; see [`crate::combine`]), then `+ shared(x)`. Each expert runs once on all rows that
//! chose it ([`crate::ROW_BLOCK`] at a time; mapped, every expert of the layer together in
//! three kernel-pool calls, `GluExpert::run_layer`) through the batch-invariant matmul, so a
//! row's output never depends on the other rows. Routed experts come from the expert store (mapped or
//! streamed, the same published bytes either way; see [`super::experts`]).

use super::config::DeepseekV3Config;
use super::experts::DeepseekV3ExpertLayout;
use super::weights::{Mlp, MoeWeights};
use crate::combine::{gated_mlp, GluExpert};
use crate::kimi_k3::Route;
use crate::qwen3_moe::moe::{At, BlockOut};
use crate::spine::TensorBytes;
use crate::ModelError;
use sluice_kernels::matmul;
use sluice_kernels::ops::{sigmoid, silu_glu};
use sluice_store::ExpertStore;

/// Routes one row of router logits.
pub(crate) fn route(logits: &[f32], bias: &[f32], c: &DeepseekV3Config) -> Route {
    let e = logits.len();
    let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
    let biased: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per = e / c.n_group;
    let desc = |v: &[f32], a: usize, b: usize| v[b].total_cmp(&v[a]).then(a.cmp(&b));
    let mut keep = vec![true; c.n_group];
    if c.topk_group < c.n_group {
        // group_scores = scores_for_choice.view(-1, n_group, per).topk(2)[0].sum(-1)
        let gs: Vec<f32> = biased
            .chunks_exact(per)
            .map(|g| {
                let mut top = [f32::NEG_INFINITY; 2];
                for &v in g {
                    if v > top[0] {
                        top = [v, top[0]];
                    } else if v > top[1] {
                        top[1] = v;
                    }
                }
                top[0] + top[1]
            })
            .collect();
        let mut order: Vec<usize> = (0..c.n_group).collect();
        order.sort_by(|&a, &b| desc(&gs, a, b));
        keep.iter_mut().for_each(|k| *k = false);
        for &g in &order[..c.topk_group] {
            keep[g] = true;
        }
    }
    // scores_for_choice.masked_fill(~score_mask, -inf); topk(k)
    let mut order: Vec<usize> = (0..e).filter(|&i| keep[i / per]).collect();
    order.sort_by(|&a, &b| desc(&biased, a, b));
    order.truncate(c.num_experts_per_tok);
    let mut weights: Vec<f32> = order.iter().map(|&i| scores[i]).collect();
    if c.norm_topk_prob {
        let sum = weights.iter().sum::<f32>() + 1e-20;
        for w in &mut weights {
            *w /= sum;
        }
    }
    for w in &mut weights {
        *w *= c.routed_scaling_factor;
    }
    let ids = order.into_iter().map(|i| u32::try_from(i).unwrap_or(u32::MAX)).collect();
    Route { ids, weights }
}

/// The experts the rows of router `logits [t, E]` would choose under this family's routing
/// (sigmoid, `e_score_correction_bias`, group-limited top-k: [`route`]), as one list, likeliest
/// first (every row's first choice, then every second, ...), each once. A prefetch guess from
/// a layer's router on another layer's input, never a route: a wrong guess costs bandwidth,
/// never output, and the store's precision gate stops reading guesses that do not pay.
pub(crate) fn guess(logits: &[f32], bias: &[f32], c: &DeepseekV3Config) -> Vec<u32> {
    let e = c.n_routed_experts;
    let mut ranked: Vec<(usize, u32)> = Vec::new();
    for row in logits.chunks_exact(e) {
        ranked.extend(route(row, bias, c).ids.into_iter().enumerate());
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

/// `DeepseekV3MLP` on `x [t, d]`: `down(silu(gate x) · up x)`, [`crate::ROW_BLOCK`] rows at a
/// time (its gate, up and activation rows are the widest buffers; rows are independent, so the
/// result is bit-identical to one call over all rows).
pub(crate) fn mlp(src: &dyn TensorBytes, w: &Mlp, x: &[f32], t: usize) -> Vec<f32> {
    gated_mlp([&w.gate.get(src), &w.up.get(src), &w.down.get(src)], &silu_glu, x, t)
}

/// Runs the MoE block of `at.layer` on `x [t, d]`, its routed experts served by `store` in the
/// layout `layout` (and `at.guess` handed to the store to prefetch for the next MoE layer);
/// returns its output `[t, d]`, the router logits `[t, E]` and each row's route.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    src: &dyn TensorBytes,
    w: &MoeWeights,
    c: &DeepseekV3Config,
    store: &dyn ExpertStore,
    layout: &DeepseekV3ExpertLayout,
    at: At<'_>,
    x: &[f32],
    t: usize,
) -> Result<BlockOut, ModelError> {
    let layer = at.layer;
    let (d, e) = (c.hidden_size, c.n_routed_experts);
    let mut logits = vec![0.0f32; t * e];
    matmul(&w.router.get(src), x, t, &mut logits);
    let routes = crate::combine::routes_on_pool(&logits, e, |l| route(l, &w.bias, c));

    let (users, ids) = crate::combine::users(&routes, e);
    // The misses start reading now; the shared experts and the next layer's guess compute
    // while they are in flight, and the store reads the guess once this layer's experts hold
    // their slots.
    store.read_ahead(layer, &ids);
    let sh = mlp(src, &w.shared, x, t);
    let guess = (at.guess)();
    let next = guess.as_ref().map(|(l, g)| (*l, g.as_slice()));
    // Each expert once, on all of its rows, in ascending id as the store delivers them, added
    // into the rows' running sums.
    let mut out = vec![0.0f32; t * d];
    let mut batch = GluExpert::default();
    batch.run_layer(
        store,
        layer,
        &ids,
        next,
        |id, v| layout.matrices(layer, id, v),
        // DeepseekV3MLP: down(silu(gate x) · up x)
        silu_glu,
        &users,
        crate::ROW_BLOCK,
        x,
        |row, slot| routes[row].weights[slot],
        &mut out,
    )?;
    // hidden_states = experts(...) + shared_experts(residuals)
    for (a, &v) in out.iter_mut().zip(&sh) {
        *a += v;
    }
    Ok((out, logits, routes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n_group: usize, topk_group: usize, k: usize) -> DeepseekV3Config {
        let mut v = serde_json::json!({
            "vocab_size": 8, "hidden_size": 4, "intermediate_size": 4, "moe_intermediate_size": 2,
            "num_hidden_layers": 1, "num_attention_heads": 1, "n_routed_experts": 8,
            "kv_lora_rank": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "qk_nope_head_dim": 2,
            "num_experts_per_tok": k, "routed_scaling_factor": 1.0
        });
        v["n_group"] = n_group.into();
        v["topk_group"] = topk_group.into();
        DeepseekV3Config::from_json(&v).expect("config")
    }

    #[test]
    fn excluded_groups_are_masked_with_minus_infinity_not_zero() {
        // 4 groups of 2; the bias makes every biased score negative except expert 0's. Groups 0
        // (0.88) and 1 (-0.1) beat 2 and 3 (-0.2) on their top-2 sums; k = 3 must still come from groups 0 and 1 only (a 0.0
        // fill would rank the excluded experts' 0.0 above the kept negatives).
        let logits = [4.0, 0.0, 0.0, 0.0, -8.0, -8.0, -8.0, -8.0];
        let bias = [0.0, -0.6, -0.55, -0.55, -0.1, -0.1, -0.1, -0.1];
        let r = route(&logits, &bias, &cfg(4, 2, 3));
        let mut ids = r.ids.clone();
        ids.sort_unstable();
        assert!(ids.iter().all(|&i| i < 4), "chose {ids:?} outside the kept groups");
        assert_eq!(r.ids[0], 0);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_guess_is_the_union_of_the_rows_routes_likeliest_first() {
        // Two groups of two kept out of four: row 0 routes [0, 2], row 1 routes [5, 4]; the
        // guess lists first choices first.
        let rows = [
            [3.0, -1.0, 2.0, -1.0, -9.0, -9.0, -9.0, -9.0],
            [-9.0, -9.0, -9.0, -9.0, 1.0, 2.0, -9.0, -9.0],
        ];
        let c = cfg(4, 2, 2);
        let logits: Vec<f32> = rows.iter().flatten().copied().collect();
        assert_eq!(guess(&logits, &[0.0; 8], &c), [0, 5, 2, 4]);
        for r in &rows {
            let ids = route(r, &[0.0; 8], &c).ids;
            assert!(ids.iter().all(|i| guess(&logits, &[0.0; 8], &c).contains(i)));
        }
    }

    #[test]
    fn weights_are_unbiased_scores_and_ties_go_to_the_lower_id() {
        let logits = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let r = route(&logits, &[0.0; 8], &cfg(1, 1, 1));
        assert_eq!(r.ids, [0]);
        let bias = [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let r = route(&logits, &bias, &cfg(1, 1, 2));
        assert_eq!(r.ids, [1, 0]);
        assert_eq!(r.weights[0], r.weights[1], "the bias selects but does not weigh");
    }
}
