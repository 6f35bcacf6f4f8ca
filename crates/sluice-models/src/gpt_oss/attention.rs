//! GPT-OSS grouped-query attention with sinks over the T rows of a pass (transformers
//! `GptOssAttention.forward` with `eager_attention_forward`, 5.17), appending the pass's keys and
//! values to the layer's KV cache.
//!
//! Per row: `q = q_proj x + b_q`, `k = k_proj x + b_k`, `v = v_proj x + b_v`; YaRN RoPE on q and k
//! at the row's absolute position (half-width tables, [`super::rope`]); each query head scores
//! the keys of its KV head (`kv = head / groups`) scaled by `head_dim^-0.5` over positions
//! `0 ..= pos` on full-attention layers and `pos − window < k ≤ pos` on sliding ones; the head's
//! learned sink logit joins the softmax as one more column that is dropped afterwards:
//!
//! ```python
//! combined = cat([scores + mask, sinks], -1); combined = combined - combined.max(-1)
//! probs = softmax(combined, -1)[..., :-1]; out = probs @ v
//! ```
//!
//! and `o_proj` (+ bias). The cache keeps every position, sliding layers included (HF's sliding
//! cache keeps only the window; the keys a row may see are the same).
//!
//! Batch invariance: projections go through the batch-invariant matmul; biases, RoPE, scores and
//! sums are per (row, head) in position order.
//!
//! Scores and weighted sums run eight rows of the pass at a time, one per vector lane, and
//! several heads of a KV head over one read of its keys ([`crate::grouped`]):
//! each lane adds its row's f64 products in the one-row order, so each result is bit for bit the
//! one-sum-at-a-time result. One f64 sum at a time was a chain of dependent additions: a
//! 256-token prefill of a Qwen3-30B-A3B slice spent ~15% of its time there on 2 vCPUs
//! (docs/PERFORMANCE.md, session 19).

use super::config::{AttnKind, GptOssConfig};
use super::rope::{apply, HalfRows};
use super::weights::AttnWeights;
use crate::qwen3::state::KvCache;
use crate::qwen3::Ctx;

/// Adds `bias` to every row of `x [t, bias.len()]`.
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (a, &b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

/// Runs the attention of one layer on `x [t, d]` (the `input_layernorm` output), staging the t
/// new rows in `cache`; returns the `o_proj` output `[t, d]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &AttnWeights,
    c: &GptOssConfig,
    kind: AttnKind,
    cache: &mut KvCache,
    x: &[f32],
    t: usize,
    rope: &HalfRows,
) -> Vec<f32> {
    let (hd, heads, kv_heads) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let (qw, kw, half) = (c.q_width(), c.kv_width(), c.head_dim / 2);
    let mut q = ctx.mm(&w.q_proj, x, t);
    add_bias(&mut q, &w.q_bias);
    let mut k = ctx.mm(&w.k_proj, x, t);
    add_bias(&mut k, &w.k_bias);
    let mut v = ctx.mm(&w.v_proj, x, t);
    add_bias(&mut v, &w.v_bias);
    for ti in 0..t {
        let (cos, sin) =
            (&rope.cos[ti * half..(ti + 1) * half], &rope.sin[ti * half..(ti + 1) * half]);
        for head in q[ti * qw..(ti + 1) * qw].chunks_exact_mut(hd) {
            apply(head, cos, sin);
        }
        for head in k[ti * kw..(ti + 1) * kw].chunks_exact_mut(hd) {
            apply(head, cos, sin);
        }
    }
    cache.push(&k, &v);
    let window = match kind {
        AttnKind::Full => None,
        AttnKind::Sliding => Some(c.sliding_window),
    };
    // Scores scaled by the f32-rounded `head_dim ** -0.5`.
    let grouped = crate::grouped::Grouped::over(&q, cache, (heads, kv_heads, hd), t, window);
    // softmax over [scores, sink] in f32 after subtracting the max; the sink column is dropped
    // from the weights but stays in the denominator.
    let attn = grouped.attend(&|h, p| {
        let sink = w.sinks[h];
        let max = p.iter().copied().fold(sink, f32::max);
        let mut sum = f64::from((sink - max).exp());
        for s in p.iter_mut() {
            *s = (*s - max).exp();
            sum += f64::from(*s);
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / sum) as f32;
        p.iter_mut().for_each(|e| *e *= inv);
    });
    let mut o = ctx.mm(&w.o_proj, &attn, t);
    add_bias(&mut o, &w.o_bias);
    o
}
