//! Kimi K3's spine pieces: which matrices make each decoder layer's piece, and the small
//! vectors (norms, biases, conv taps, AttnRes weights) the model keeps whatever the placement.
//! Where a pass finds the bytes of a piece — mapped, resident, streamed or read by rows — is the
//! mechanism every family shares ([`crate::spine`]), re-exported here for K3's code.

use super::weights::{Attn, Ffn, K3Weights, LayerWeights, Mat};
use crate::ModelError;
use sluice_checkpoint::Checkpoint;
use sluice_store::spine::TensorRange;
use sluice_store::SpineIndex;

use crate::spine::ranges;
pub use crate::spine::{head_piece, layer_piece, TensorBytes, EMBED_PIECE};
pub(crate) use crate::spine::{PieceRef, Spine};

/// The weight matrices of one decoder layer.
fn layer_mats(l: &LayerWeights) -> Vec<&Mat> {
    let mut v: Vec<&Mat> = Vec::with_capacity(16);
    match &l.attn {
        Attn::Kda(w) => v.extend([
            &w.q_proj, &w.k_proj, &w.v_proj, &w.f_a, &w.f_b, &w.b_proj, &w.g_proj, &w.o_proj,
        ]),
        Attn::Mla(w) => {
            v.extend([&w.q_a, &w.q_b, &w.kv_a, &w.kv_b, &w.o_proj]);
            v.extend(w.g_proj.as_ref());
        }
    }
    match &l.ffn {
        Ffn::Dense(w) => v.extend([&w.gate, &w.up, &w.down]),
        Ffn::Moe(w) => {
            v.push(&w.router);
            v.extend(w.down.as_ref());
            v.extend(w.up.as_ref());
            if let Some(s) = &w.shared {
                v.extend([&s.gate, &s.up, &s.down]);
            }
        }
    }
    v
}

/// The spine pieces of `w` in pass order, with their byte spans in `ckpt`'s shards.
pub fn index(w: &K3Weights, ckpt: &Checkpoint) -> Result<SpineIndex, ModelError> {
    let layers: Vec<Vec<TensorRange>> =
        w.layers.iter().map(|l| layer_mats(l).into_iter().flat_map(ranges).collect()).collect();
    crate::spine::index(ckpt, &w.embed, layers, &w.lm_head)
}

/// Bytes of the f32 vectors the model keeps whatever the placement (norms, biases, conv taps).
pub fn small_bytes(w: &K3Weights) -> u64 {
    let f = |v: &Vec<f32>| v.len() as u64 * 4;
    let mut n = f(&w.norm) + w.output_res.as_ref().map_or(0, f);
    for l in &w.layers {
        n += f(&l.input_norm) + f(&l.post_norm);
        n += l.attn_res.as_ref().map_or(0, f) + l.mlp_res.as_ref().map_or(0, f);
        match &l.attn {
            Attn::Kda(k) => {
                n += k.conv.iter().map(f).sum::<u64>() + f(&k.a_exp) + f(&k.dt_bias) + f(&k.o_norm);
            }
            Attn::Mla(m) => n += f(&m.q_a_norm) + f(&m.kv_a_norm),
        }
        if let Ffn::Moe(m) = &l.ffn {
            n += f(&m.bias) + m.norm.as_ref().map_or(0, f);
        }
    }
    n
}
