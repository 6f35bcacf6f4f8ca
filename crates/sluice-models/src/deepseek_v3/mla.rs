//! Multi-head latent attention with decoupled RoPE over the T rows of a pass (transformers
//! `DeepseekV3Attention`, 5.17; DeepSeek-V3 `inference/model.py` `MLA` in its `absorb` mode).
//!
//! The cache holds, per position, the normalised latent `kv_a_layernorm(c_kv)` (`kv_lora_rank`
//! values) and the shared rotary key `k_pe` already rotated at its absolute position
//! (`qk_rope_head_dim` values): 576 values per token per layer at DeepSeek-V3's sizes, instead of
//! 128 heads × (192 + 128) for expanded keys and values.
//!
//! Every pass — a prompt prefill or one decode row — runs the absorbed form: `q_lat[h] =
//! W_UK[h]ᵀ · q_nope[h]`, score = `(q_lat · lat + q_pe · k_pe) · scale`, `out[h] = W_UV[h] · Σ
//! p · lat`, then `o_proj`. That is transformers' expanded form (`k_nope = W_UK · lat`, `v = W_UV ·
//! lat`) regrouped; the goldens hold it to relative L2 1e-4. Using one form for every T is what
//! makes a T-row pass bit-identical to T single rows: each row reads only positions up to its own,
//! and every reduction runs per (row, head) in position order. A pass runs [`crate::ROW_BLOCK`]
//! rows at a time, each block appending its rows to the cache before the next block reads them,
//! so the projections and per-head outputs are held for one block however long the prompt
//! (bit-identical for the same reason; `kv_b_proj` is widened once per block). The f64 sums of
//! up to [`LANES`] rows of a head run side by side ([`latent::attend`]), each in its one-row
//! order: the same bits.
//!
//! RoPE: `rope_interleave` (the default and DeepSeek's layout) rotates pairs `(x₂ⱼ, x₂ⱼ₊₁)` and
//! writes them de-interleaved (`cat(x₁c − x₂s, x₂c + x₁s)`, transformers
//! `apply_rotary_pos_emb_interleave`); otherwise halves are rotated (`rotate_half`). q and k get
//! the same permutation, so their dot product is the reference's.

use super::config::DeepseekV3Config;
use super::weights::{AttnWeights, QProj};
use super::{mm, Rope};
use crate::grouped::Work;
use crate::kimi_k3::state::MlaLayer;
use crate::latent_parts::{latent_heads, latent_part, with_heads_widened};
use crate::spine::TensorBytes;
use sluice_kernels::latent::{self, LANES};
use sluice_kernels::ops::rms_norm;

/// `DeepseekV3RMSNorm(q_lora_rank)` / `(kv_lora_rank)` are built without `eps=`, so they use the
/// class default, not `rms_norm_eps`.
const LATENT_NORM_EPS: f32 = 1e-6;

/// Rotates one rotary slice `x [rope]` in place by half-width `cos`/`sin`.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], interleave: bool) {
    let half = x.len() / 2;
    if interleave {
        // q1, q2 = q[..., 0::2], q[..., 1::2]; cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin])
        let src = x.to_vec();
        for j in 0..half {
            let (a, b) = (src[2 * j], src[2 * j + 1]);
            x[j] = a * cos[j] - b * sin[j];
            x[j + half] = b * cos[j] + a * sin[j];
        }
    } else {
        crate::gpt_oss::rope::apply(x, cos, sin);
    }
}

/// Runs the layer on `x [t, d]` (the `input_layernorm` output) at positions `past .. past + t`,
/// appending t rows to the cache (staged until commit), a block of rows at a time, each block
/// after the rows the cache already holds.
pub(crate) fn forward(
    src: &dyn TensorBytes,
    w: &AttnWeights,
    c: &DeepseekV3Config,
    rope: &Rope,
    st: &mut MlaLayer,
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    crate::row_blocks(x, t, |x, t| {
        let h = c.num_attention_heads;
        let (nope, rd, vd, kl) =
            (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank);
        let qd = nope + rd;
        let past = st.lat.len() / kl;
        let rows = rope.rows(past, t);
        let half = rd / 2;

        // q_states = q_b_proj(q_a_layernorm(q_a_proj(x))) or q_proj(x)
        let mut q = match &w.q {
            QProj::Lora(l) => {
                let qa = mm(src, &l.a, x, t);
                let ql = l.a.rows();
                let qn = crate::served::norm_rows(&qa, &l.norm, ql, LATENT_NORM_EPS);
                mm(src, &l.b, &qn, t)
            }
            QProj::Plain(p) => mm(src, p, x, t),
        };
        for (ti, qrow) in q.chunks_exact_mut(h * qd).enumerate() {
            let (cs, sn) =
                (&rows.cos[ti * half..(ti + 1) * half], &rows.sin[ti * half..(ti + 1) * half]);
            for head in qrow.chunks_exact_mut(qd) {
                rotate(&mut head[nope..], cs, sn, c.rope_interleave);
            }
        }
        // compressed_kv = kv_a_proj_with_mqa(x); kv_nope, k_rot = split; kv_nope = kv_a_layernorm(...)
        let ckv = mm(src, &w.kv_a, x, t);
        for (ti, row) in ckv.chunks_exact(kl + rd).enumerate() {
            let mut lat = vec![0.0f32; kl];
            rms_norm(&row[..kl], Some(&w.kv_a_norm), LATENT_NORM_EPS, &mut lat);
            st.lat.extend_from_slice(&lat);
            let mut pe = row[kl..].to_vec();
            rotate(
                &mut pe,
                &rows.cos[ti * half..(ti + 1) * half],
                &rows.sin[ti * half..(ti + 1) * half],
                c.rope_interleave,
            );
            st.pe.extend_from_slice(&pe);
        }
        let scale = c.softmax_scale();
        let kv_b = w.kv_b.get(src);
        let (lat_all, pe_all) = (&st.lat, &st.pe);
        let dims = latent::Absorbed { nope, rope: rd, kl, scale };

        // Per set of heads (`latent::attend_heads`: the set's heads read each cached latent
        // value once; each sum in the order it had taken alone, so the same bits).
        let work =
            Work { positions: past + t, key: kl + rd, value: kl, per_pair: (nope + vd) * kl };
        let attn = latent_heads((h, t, vd), &work, &|heads| {
            // kv_b_proj rows of each head: W_UK (nope rows), then W_UV (v rows), decoded once per
            // pass whatever the format (an FP8 block spans several heads, so rows are widened from
            // the whole matrix rather than sliced out of it).
            with_heads_widened(&kv_b, heads.clone(), (nope + vd, nope + vd), |ws| {
                let w_uk: Vec<&[f32]> = ws.iter().map(|w| &w[..nope * kl]).collect();
                let mut vals = vec![[0.0f64; LANES]; vd];
                let mut lanes = vec![[0.0f32; LANES]; kl];
                // out[h] = W_UV[h] · ctx, one f64 dot per value row, the rows as lanes.
                let mut step = |s: usize, c: &[f32], g: usize, out: &mut [f32]| {
                    for (a, v) in lanes.iter_mut().enumerate() {
                        for (l, v) in v.iter_mut().enumerate() {
                            *v = if l < g { c[l * kl + a] } else { 0.0 };
                        }
                    }
                    latent::dot_lanes(&lanes, &ws[s][nope * kl..], vd, &mut vals);
                    for (l, o) in out.chunks_exact_mut(vd).enumerate() {
                        for (o, v) in o.iter_mut().zip(&vals) {
                            #[allow(clippy::cast_possible_truncation)]
                            {
                                *o = v[l] as f32;
                            }
                        }
                    }
                };
                let attn = (&w_uk[..], &lat_all[..], &pe_all[..], past);
                latent_part(&dims, heads, (&q, h, t, vd), attn, &mut step)
            })
        });
        mm(src, &w.o_proj, &attn, t)
    })
}
