//! Latent MoE over the T rows of a pass (K3.md §2.4; mlx-lm `KimiK3SparseMoE`,
//! `_group_expert_select`).
//!
//! Router: `σ(x · gateᵀ)` in f32; `+ e_score_correction_bias` for **selection only**; top-k;
//! weights are the unbiased scores renormalised (`/ (Σ + 1e-20)`) then × `routed_scaling_factor`
//! (before the latent norm, as vLLM and mlx-lm apply it). Experts run in the latent width on
//! `routed_expert_down_proj x`; the weighted sum is added per row in **ascending expert id**
//! into one running sum as each expert's batch finishes (mlx-lm sums over the router's top-k
//! axis instead; see [`crate::combine`] for why the order is fixed by id, and what it changes),
//! RMSNorm'd, projected up, and the shared experts (on the full hidden `x`, unweighted) are
//! added. The union of experts over the T rows is requested from the store once per pass, which
//! hands them over in ascending id order; each expert runs on all its rows, a block of rows at
//! a time, in one batch-invariant matmul (mapped, every expert of the layer together in three
//! kernel-pool calls, `GluExpert::run_layer`; the same bits).

use super::config::K3Config;
use super::weights::{MlpWeights, MoeWeights};
use super::{Ctx, Trace};
use crate::combine::{gated_mlp, GluExpert};
use crate::ModelError;
use sluice_kernels::ops::{rms_norm, sigmoid, situ_glu};
use sluice_kernels::Matrix;

/// One row's routing: expert ids and weights in router order.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Selected expert ids, best biased score first.
    pub ids: Vec<u32>,
    /// Combination weights aligned with `ids` (renormalised and scaled).
    pub weights: Vec<f32>,
}

/// Selects experts for one row of router logits.
pub(crate) fn route(logits: &[f32], bias: &[f32], c: &K3Config) -> Route {
    let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
    let mut order: Vec<u32> = (0..u32::try_from(scores.len()).unwrap_or(u32::MAX)).collect();
    let choice = |i: u32| scores[i as usize] + bias[i as usize];
    order.sort_by(|&a, &b| choice(b).total_cmp(&choice(a)).then(a.cmp(&b)));
    order.truncate(c.num_experts_per_token);
    let mut w: Vec<f32> = order.iter().map(|&i| scores[i as usize]).collect();
    if c.num_experts_per_token > 1 && c.moe_renormalize {
        let sum: f32 = w.iter().sum::<f32>() + 1e-20;
        for v in &mut w {
            *v /= sum;
        }
    }
    for v in &mut w {
        *v *= c.routed_scaling_factor;
    }
    Route { ids: order, weights: w }
}

/// Dense SiTU-GLU MLP on `x [T, d_in]` ([`gated_mlp`]: [`crate::ROW_BLOCK`] rows at a time,
/// the gate and up projections and the activation in one kernel-pool call).
pub(crate) fn mlp(ctx: &Ctx<'_>, w: &MlpWeights, c: &K3Config, x: &[f32], t: usize) -> Vec<f32> {
    let glu = |g: &[f32], u: &[f32], a: &mut [f32]| {
        situ_glu(g, u, c.situ_beta(), c.activation_situ_linear_beta, a);
    };
    let src = ctx.spine;
    gated_mlp([&w.gate.get(src), &w.up.get(src), &w.down.get(src)], &glu, x, t)
}

/// [`mlp`] with each block's output written over its input rows (the MLP maps `[T, d]` to
/// `[T, d]`): the MoE block's input is dead once its shared experts and latent projection have
/// read it, so its rows hold the shared output instead of a second `[T, d]` buffer.
/// Bit-identical to [`mlp`]: each block reads its rows before they are overwritten.
fn mlp_in_place(ctx: &Ctx<'_>, w: &MlpWeights, c: &K3Config, x: &mut [f32], t: usize) {
    let d = x.len() / t.max(1);
    debug_assert_eq!(w.down.rows(), d, "a shared expert maps the hidden width to itself");
    for xb in x.chunks_mut(crate::ROW_BLOCK * d.max(1)) {
        let n = xb.len() / d.max(1);
        let out = mlp(ctx, w, c, xb, n);
        xb.copy_from_slice(&out);
    }
}

/// The experts the router `logits [T, E]` pick for any row, distinct, most confident first:
/// by the best rank any row gives them (ties by id). A guess is read in this order, so when
/// the store has room for only part of it, it reads the likeliest experts.
fn route_union(logits: &[f32], bias: &[f32], c: &K3Config) -> Vec<u32> {
    let mut ranked: Vec<(usize, u32)> = logits
        .chunks_exact(c.num_experts)
        .flat_map(|l| route(l, bias, c).ids.into_iter().enumerate())
        .collect();
    ranked.sort_unstable();
    let mut seen = vec![false; c.num_experts];
    ranked
        .into_iter()
        .filter_map(|(_, id)| {
            let s = seen.get_mut(id as usize)?;
            (!std::mem::replace(s, true)).then_some(id)
        })
        .collect()
}

/// Guesses the experts of the first MoE layer from `x`, that layer's input before its
/// attention has run (normed with the layer's post-attention norm), and hands the guess to
/// the store, which reads it while the attention computes. Layers after it are guessed by
/// the layer before them (see [`forward`]); the first has no layer before it. A wrong guess
/// costs bandwidth, never output, and the store's gate stops reading guesses that do not pay.
pub(crate) fn guess_first(
    ctx: &Ctx<'_>,
    w: &MoeWeights,
    c: &K3Config,
    layer: usize,
    x: &[f32],
    t: usize,
) {
    let ids = route_union(&ctx.mm(&w.router, x, t), &w.bias, c);
    ctx.experts.prefetch(layer, &ids);
}

/// Where an MoE block sits: its layer, and the next MoE layer to prefetch for (if any).
pub(crate) struct Position<'a> {
    pub(crate) layer: usize,
    pub(crate) next: Option<(usize, &'a MoeWeights)>,
}

/// Runs the MoE block of `layer` on `x [T, d]` (the `post_attention_layernorm` output, taken
/// by value: it is dropped, or overwritten by the shared experts' output, as soon as it is dead).
///
/// Every buffer is dropped once dead, so that a prompt row holds at the block's peak only its
/// input (later the shared output), its routing, its latent input and its running sum
/// (`working::prefill_bytes_per_row`): the router logits go once routed, the latent input,
/// routes and (row, slot) lists once the experts ran, and the norm and the up projection
/// work in place and a row block at a time.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &MoeWeights,
    c: &K3Config,
    at: Position<'_>,
    mut x: Vec<f32>,
    t: usize,
    trace: &mut Option<&mut Trace>,
) -> Result<Vec<f32>, ModelError> {
    let Position { layer, next } = at;
    let d = c.hidden_size;
    let e = c.num_experts;
    let lat_w = c.expert_width();
    let inter = c.moe_intermediate_size;

    let logits = ctx.mm(&w.router, &x, t);
    let routes = crate::combine::routes_on_pool(&logits, e, |l| route(l, &w.bias, c));
    drop(logits);
    let (users, ids) = crate::combine::users(&routes, e);
    // The misses start reading now; the work below that does not need them (the next layer's
    // guess, the latent projection, the shared experts) runs while they are in flight.
    ctx.experts.read_ahead(layer, &ids);
    // Guess the next MoE layer's experts with its router on this layer's input; the store
    // starts reading them once this layer's own experts hold their slots, while this layer
    // computes (a wrong guess costs bandwidth, never output). The next layer's router is in
    // its spine piece: resident, or the stream buffer being read while this layer computes
    // (waited for here); no guess if it is not at hand.
    let next_src = next.and_then(|(nl, nw)| ctx.peek_layer(nl).map(|src| (nl, nw, src)));
    let guess: Option<(usize, Vec<u32>)> = next_src.map(|(next_layer, nw, src)| {
        (next_layer, route_union(&ctx.mm_from(&src, &nw.router, &x, t), &nw.bias, c))
    });
    let z = match &w.down {
        Some(m) => ctx.mm(m, &x, t),
        None => x.clone(),
    };
    // The input's last reader: its rows become the shared experts' output, block by block.
    let shared = match &w.shared {
        Some(sh) => {
            mlp_in_place(ctx, sh, c, &mut x, t);
            Some(x)
        }
        None => {
            drop(x);
            None
        }
    };
    // comb[ti] = Σ w · E_id(z_ti) over the row's experts, added in ascending id as they come.
    let mut comb = vec![0.0f32; t * lat_w];
    let mut batch = GluExpert::default();
    let next = guess.as_ref().map(|(l, g)| (*l, g.as_slice()));
    let glu = |g: &[f32], u: &[f32], a: &mut [f32]| {
        situ_glu(g, u, c.situ_beta(), c.activation_situ_linear_beta, a);
    };
    batch.run_layer(
        ctx.experts,
        layer,
        &ids,
        next,
        |id, v| {
            // Parts in the order of `K3ExpertLayout`: w1, w2, w3, each packed then scales.
            let m1 = Matrix::mxfp4(inter, lat_w, v.part(0), v.part(1));
            let m3 = Matrix::mxfp4(inter, lat_w, v.part(4), v.part(5));
            let m2 = Matrix::mxfp4(lat_w, inter, v.part(2), v.part(3));
            let (Ok(m1), Ok(m2), Ok(m3)) = (m1, m2, m3) else {
                return Err(sluice_store::StoreError::Consumer(format!(
                    "expert {id} of layer {layer} has byte lengths that do not match its shape"
                )));
            };
            Ok([m1, m3, m2])
        },
        glu,
        &users,
        crate::EXPERT_BLOCK,
        &z,
        |ti, slot| routes[ti].weights[slot],
        &mut comb,
    )?;
    drop((z, users, batch));
    match trace.as_deref_mut() {
        Some(tr) => {
            tr.routes.insert(layer, routes);
        }
        None => drop(routes),
    }

    if let Some(nw) = &w.norm {
        // In place through one row's copy: the same input, so the same output.
        let mut row = vec![0.0f32; lat_w];
        for r in comb.chunks_exact_mut(lat_w) {
            row.copy_from_slice(r);
            rms_norm(&row, Some(nw), c.rms_norm_eps, r);
        }
    }
    // `up(comb) + shared`, the up projection a row block at a time added into the shared
    // output (f32 addition commutes, so `s + u` is bit for bit the `u + s` of one `[T, d]`
    // projection; rows are independent, so the blocks are bit-identical to one call).
    let out = match (&w.up, shared) {
        (Some(m), Some(mut s)) => {
            let blocks =
                comb.chunks(crate::ROW_BLOCK * lat_w).zip(s.chunks_mut(crate::ROW_BLOCK * d));
            for (cb, sb) in blocks {
                let u = ctx.mm(m, cb, cb.len() / lat_w);
                for (o, v) in sb.iter_mut().zip(&u) {
                    *o += v;
                }
            }
            s
        }
        (Some(m), None) => ctx.mm(m, &comb, t),
        (None, Some(mut s)) => {
            for (o, v) in s.iter_mut().zip(&comb) {
                *o += v;
            }
            s
        }
        (None, None) => comb,
    };
    debug_assert_eq!(out.len(), t * d);
    Ok(out)
}
