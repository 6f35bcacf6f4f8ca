//! Rotary position embedding and grouped-query attention for Qwen3.
//!
//! ## Attention
//!
//! Qwen3 grouped-query attention over the T rows of a pass (transformers `Qwen3Attention.forward`
//! with `eager_attention_forward`), appending the pass's keys and values to the layer's KV cache.
//!
//! Per row: `q = q_norm(q_proj x)` and `k = k_norm(k_proj x)` per head (an RMSNorm over
//! `head_dim` whose weight all heads share), RoPE on both at the row's absolute position, then
//! causal softmax attention of each query head over the cached positions `0 ..= pos` of its KV head
//! (`kv = head / groups`, HF `repeat_kv`), scaled by `head_dim^-0.5`, and `o_proj`.
//!
//! Batch invariance: the projections go through the batch-invariant matmul; the norms, RoPE and
//! every score and weighted sum are computed per (row, head) in position order, so a row's output
//! never depends on how many rows share the pass or how the heads are split across threads.
//!
//! Scores and weighted sums run eight rows of the pass at a time, one per vector lane, and
//! several heads of a KV head over one read of its keys ([`crate::grouped`]): each lane adds
//! its row's f64 products in the one-row order, so each result is bit for bit the
//! one-sum-at-a-time result. One f64 sum at a time was a chain of dependent additions: a
//! 256-token prefill of a Qwen3-30B-A3B slice spent ~15% of its time there on 2 vCPUs
//! (docs/PERFORMANCE.md, session 19).
//!
//! ## RoPE
//!
//! Rotary position embedding computed the way transformers computes it, in f32, so that the
//! engine's rotated queries and keys match HF's to the last bit or two.
//!
//! The reference (`modeling_qwen3.py`, transformers 5.17):
//!
//! ```python
//! # Qwen3RotaryEmbedding.compute_default_rope_parameters
//! inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
//! # Qwen3RotaryEmbedding.forward
//! freqs = position_ids[..., None].float() * inv_freq      # f32 product
//! emb = torch.cat((freqs, freqs), dim=-1)
//! cos, sin = emb.cos(), emb.sin()                          # attention_scaling is 1.0 for default RoPE
//! # apply_rotary_pos_emb
//! q_embed = (q * cos) + (rotate_half(q) * sin)             # rotate_half(x) = cat(-x2, x1)
//! ```
//!
//! Every intermediate is rounded to f32 where torch rounds it: the exponent `2j / dim`, the power
//! (torch raises the f32-rounded base), the reciprocal, the angle `pos · inv_freq`. The power,
//! cosine and sine are evaluated in f64 and rounded once, which is the correctly rounded f32
//! result; torch's vectorised f32 versions are within an ulp of it. The rotation is two f32
//! products and one f32 sum, never fused, as in PyTorch.

use super::config::Qwen3Config;
use super::state::KvCache;
use super::weights::AttnWeights;
use super::Ctx;
use sluice_kernels::ops::{rms_norm, softmax_inplace};

/// Runs the attention of one layer on `x [t, d]` (the `input_layernorm` output), staging the t new
/// rows in `cache`; returns the `o_proj` output `[t, d]`.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &AttnWeights,
    c: &Qwen3Config,
    cache: &mut KvCache,
    x: &[f32],
    t: usize,
    rope: &RopeRows,
) -> Vec<f32> {
    let (hd, heads, kv_heads) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let (qw, kw) = (c.q_width(), c.kv_width());
    let eps = c.rms_norm_eps;

    // query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)); same for keys;
    // then apply_rotary_pos_emb(query_states, key_states, cos, sin).
    let mut q = ctx.mm(&w.q_proj, x, t);
    let mut k = ctx.mm(&w.k_proj, x, t);
    let v = ctx.mm(&w.v_proj, x, t);
    // Row by row (rows in chunks on the kernel pool; each row's values do not depend on the
    // split): every head normed, then rotated.
    let norm_rope = |rows: &mut [f32], width: usize, norm: &[f32]| {
        crate::served::rows_on_pool(rows, width, |r0, block| {
            let mut normed = vec![0.0f32; hd];
            for (i, row) in block.chunks_exact_mut(width).enumerate() {
                let ti = r0 + i;
                let (cos, sin) =
                    (&rope.cos[ti * hd..(ti + 1) * hd], &rope.sin[ti * hd..(ti + 1) * hd]);
                for head in row.chunks_exact_mut(hd) {
                    rms_norm(head, Some(norm), eps, &mut normed);
                    apply_rope(&mut normed, cos, sin);
                    head.copy_from_slice(&normed);
                }
            }
        });
    };
    norm_rope(&mut q, qw, &w.q_norm);
    norm_rope(&mut k, kw, &w.k_norm);
    // key_states, value_states = past_key_values.update(key_states, value_states, layer_idx)
    cache.push(&k, &v);
    // HF multiplies the f32 scores by the f32-rounded `head_dim ** -0.5`;
    // softmax(attn_weights, dim=-1, dtype=float32) over each row's scaled scores; then
    // attn_output = matmul(attn_weights, value_states), heads side by side per row.
    let attn = crate::grouped::Grouped::over(&q, cache, (heads, kv_heads, hd), t, None)
        .attend(&|_, p| softmax_inplace(p));
    ctx.mm(&w.o_proj, &attn, t)
}

/// Inverse frequencies of one head width and θ.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    head_dim: usize,
}

/// cos and sin rows `[t, head_dim]` for the consecutive positions of one pass.
#[derive(Debug, Clone)]
pub struct RopeRows {
    /// `cat(cos(freqs), cos(freqs))` per position.
    pub cos: Vec<f32>,
    /// `cat(sin(freqs), sin(freqs))` per position.
    pub sin: Vec<f32>,
}

impl Rope {
    /// The default-RoPE inverse frequencies for `head_dim` (even) and base `theta`.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        #[allow(clippy::cast_possible_truncation)]
        let base = f64::from(theta as f32);
        #[allow(clippy::cast_precision_loss)]
        let inv_freq = (0..head_dim)
            .step_by(2)
            .map(|j| {
                let e = j as f32 / head_dim as f32;
                #[allow(clippy::cast_possible_truncation)]
                let p = base.powf(f64::from(e)) as f32;
                1.0f32 / p
            })
            .collect();
        Self { inv_freq, head_dim }
    }

    /// `inv_freq [head_dim / 2]` (HF's `Qwen3RotaryEmbedding.inv_freq` buffer).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// cos/sin rows for positions `pos0 .. pos0 + t`.
    pub fn rows(&self, pos0: usize, t: usize) -> RopeRows {
        let hd = self.head_dim;
        let half = hd / 2;
        let mut cos = vec![0.0f32; t * hd];
        let mut sin = vec![0.0f32; t * hd];
        for ti in 0..t {
            // position_ids are int64 and become f32 exactly below 2^24 (far past any context).
            #[allow(clippy::cast_precision_loss)]
            let pos = (pos0 + ti) as f32;
            let (c, s) = (&mut cos[ti * hd..(ti + 1) * hd], &mut sin[ti * hd..(ti + 1) * hd]);
            for (j, &f) in self.inv_freq.iter().enumerate() {
                let angle = f64::from(pos * f);
                #[allow(clippy::cast_possible_truncation)]
                let (cv, sv) = (angle.cos() as f32, angle.sin() as f32);
                c[j] = cv;
                c[j + half] = cv;
                s[j] = sv;
                s[j + half] = sv;
            }
        }
        RopeRows { cos, sin }
    }
}

/// Rotates one head `x [head_dim]` in place: `x · cos + rotate_half(x) · sin`.
pub fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    debug_assert_eq!(cos.len(), x.len());
    debug_assert_eq!(sin.len(), x.len());
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        // rotate_half(x)[i] = -x[i + half] for the first half, x[i - half] for the second.
        x[i] = a * cos[i] + (-b) * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inv_freq_starts_at_one_and_decreases() {
        let r = Rope::new(16, 1e6);
        assert_eq!(r.inv_freq().len(), 8);
        assert_eq!(r.inv_freq()[0], 1.0);
        assert!(r.inv_freq().windows(2).all(|w| w[1] < w[0]));
        // theta^(-14/16) for the last pair.
        let want = 1e6f64.powf(-14.0 / 16.0);
        assert!((f64::from(r.inv_freq()[7]) - want).abs() <= want * 1e-6);
    }

    #[test]
    fn position_zero_is_the_identity() {
        let r = Rope::new(8, 1e4);
        let rows = r.rows(0, 1);
        let mut x = [1.0f32, -2.0, 3.0, 0.5, 7.0, -1.0, 0.25, 4.0];
        let before = x;
        apply_rope(&mut x, &rows.cos, &rows.sin);
        assert_eq!(x, before);
    }

    #[test]
    fn rotation_preserves_pair_norms() {
        let r = Rope::new(8, 1e4);
        let rows = r.rows(5, 3);
        for ti in 0..3 {
            let mut x = [1.0f32, -2.0, 3.0, 0.5, 7.0, -1.0, 0.25, 4.0];
            let before = x;
            apply_rope(&mut x, &rows.cos[ti * 8..(ti + 1) * 8], &rows.sin[ti * 8..(ti + 1) * 8]);
            for i in 0..4 {
                let n0 = before[i].hypot(before[i + 4]);
                let n1 = x[i].hypot(x[i + 4]);
                assert!((n0 - n1).abs() <= 1e-5 * n0, "pair {i} at row {ti}");
            }
        }
    }

    #[test]
    fn rows_depend_only_on_the_absolute_position() {
        let r = Rope::new(16, 1e6);
        let a = r.rows(3, 4);
        let b = r.rows(5, 1);
        assert_eq!(a.cos[2 * 16..3 * 16], b.cos[..]);
        assert_eq!(a.sin[2 * 16..3 * 16], b.sin[..]);
    }
}
