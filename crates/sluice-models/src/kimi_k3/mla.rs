//! Gated NoPE multi-head latent attention over the T rows of a pass (K3.md §2.3; mlx-lm
//! `KimiK3MLAAttention`).
//!
//! The cache holds, per position, the normalised latent `kv_a_layernorm(c_kv)` (kv_lora values)
//! and the shared `k_pe` (rope-width values, never rotated: K3 is NoPE but the 64 dims exist).
//! Attention runs in the absorbed form: `q_lat[h] = W_UKᵀ[h] · q_nope[h]`, score =
//! `(q_lat·lat + q_pe·k_pe) / √(nope + rope)`, `out[h] = W_UV[h] · Σ p·lat`, then the sigmoid
//! output gate and `o_proj`. Each row only reads positions up to its own (causal), and every
//! reduction runs per (row, head) in position order, so a row's output never depends on T.
//! A pass runs [`crate::ROW_BLOCK`] rows at a time, each block appending its rows to the cache
//! before the next block reads them, so the projections, per-head outputs and gate are held
//! for one block however long the prompt (bit-identical to one call over all rows, for the
//! same reason). Within a head, the f64 sums of [`LANES`] rows run side by side
//! ([`latent::attend`]), each in the order it takes alone, and their W_UV products in one
//! batch-invariant call: the same bits as one row at a time.

use super::config::K3Config;
use super::state::MlaLayer;
use super::weights::MlaWeights;
use super::Ctx;
use crate::grouped::Work;
use crate::latent_parts::{latent_heads, latent_part, with_heads_widened};
use sluice_kernels::latent;
use sluice_kernels::ops::{rms_norm, sigmoid};
use sluice_kernels::{matmul, Matrix, WeightFormat};

/// Runs the layer on `x [T, d]`, appending T rows to the cache (staged until commit), a block
/// of rows at a time, each block after the rows the cache already holds.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &MlaWeights,
    c: &K3Config,
    st: &mut MlaLayer,
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    crate::row_blocks(x, t, |x, t| {
        let h = c.num_attention_heads;
        let (nope, rope, vd) = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
        let (ql, kl) = (c.q_lora_rank, c.kv_lora_rank);
        let qd = nope + rope;

        // q = q_b(RMSNorm_1e-6(q_a x)); eps 1e-6 is the KimiRMSNorm default (K3.md §0.2).
        let qa = ctx.mm(&w.q_a, x, t);
        let qa_n = crate::served::norm_rows(&qa, &w.q_a_norm, ql, 1e-6);
        let q = ctx.mm(&w.q_b, &qa_n, t);
        let ckv = ctx.mm(&w.kv_a, x, t);
        let past = st.lat.len() / kl;
        for row in ckv.chunks_exact(kl + rope) {
            let mut lat = vec![0.0f32; kl];
            rms_norm(&row[..kl], Some(&w.kv_a_norm), 1e-6, &mut lat);
            st.lat.extend_from_slice(&lat);
            st.pe.extend_from_slice(&row[kl..]);
        }
        let total = past + t;
        let scale = (qd as f32).powf(-0.5);
        let kv_b = w.kv_b.get(ctx.spine);
        let (lat_all, pe_all) = (&st.lat, &st.pe);
        let dims = latent::Absorbed { nope, rope, kl, scale };

        // Per set of heads: absorbed attention for every row, the f64 sums several at a time
        // (`latent::attend_heads`: each sum in the order it had taken alone, so the same bits;
        // the set's heads read each cached latent value once).
        let work = Work { positions: total, key: kl + rope, value: kl, per_pair: (nope + vd) * kl };
        let mut attn = latent_heads((h, t, vd), &work, &|heads| {
            // Head hi owns rows [hi·(nope+vd), (hi+1)·(nope+vd)): W_UK first, then W_UV. W_UK is
            // widened once per block, not once per row.
            with_heads_widened(&kv_b, heads.clone(), (nope + vd, nope), |w_uk| {
                let w_uv: Vec<Matrix<'_>> =
                    heads.clone().map(|hi| rows_of(&kv_b, hi * (nope + vd) + nope, vd)).collect();
                // out = W_UV ctx for each head's rows in one call (batch-invariant: each row's
                // bits are those of its single-row call).
                let mut step = |s: usize, c: &[f32], g: usize, out: &mut [f32]| {
                    matmul(&w_uv[s], c, g, out);
                };
                latent_part(&dims, heads, (&q, h, t, vd), (w_uk, lat_all, pe_all, past), &mut step)
            })
        });
        debug_assert_eq!(total, st.lat.len() / kl);
        if let Some(g) = &w.g_proj {
            let gate = ctx.mm(g, x, t);
            for (a, &gv) in attn.iter_mut().zip(&gate) {
                *a *= sigmoid(gv);
            }
        }
        ctx.mm(&w.o_proj, &attn, t)
    })
}

/// Rows `first..first + rows` of `m` as a matrix of the same format (an int8 matrix keeps
/// those rows' scales).
fn rows_of<'a>(m: &Matrix<'a>, first: usize, rows: usize) -> Matrix<'a> {
    let per_row = |buf: &'a [u8]| {
        let n = buf.len().checked_div(m.rows()).unwrap_or(0);
        &buf[first * n..(first + rows) * n]
    };
    let (data, scales) = (per_row(m.data()), per_row(m.scales()));
    let r = match m.format() {
        WeightFormat::F32 => Matrix::f32(rows, m.cols(), data),
        WeightFormat::Int8Row => Matrix::int8_row(rows, m.cols(), data, scales),
        _ => Matrix::bf16(rows, m.cols(), data),
    };
    r.expect("invariant: a whole-row slice of a checked matrix")
}
