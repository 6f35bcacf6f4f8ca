//! Synthetic Qwen3-MoE checkpoints in the published layout (per-expert bf16 tensors, see
//! [`super::weights`]), for streaming and in-memory benchmarks, with `layers` MoE layers and a
//! vocabulary of `vocab` rows:
//!
//! - [`slice_config`] keeps Qwen3-235B-A22B's real per-layer dimensions — hidden 4096, 64 query
//!   / 4 KV heads of 128, 128 experts of width 1536, top-8 with `norm_topk_prob`, dense width
//!   12288 (the published config.json of `Qwen/Qwen3-235B-A22B`, 94 layers, vocab 151936);
//! - [`slice_config_30b`] keeps Qwen3-30B-A3B's — hidden 2048, 32 query / 4 KV heads of 128, 128
//!   experts of width 768, top-8 with `norm_topk_prob`, dense width 6144 (the published
//!   config.json of `Qwen/Qwen3-30B-A3B`, 48 layers, vocab 151936): the model people run in
//!   memory on a 64 GB machine.
//!
//! One shard per layer plus one for the embedding, the final norm and the head.

use crate::synth::{fan_in, Init, SynthTensor};
use serde_json::{json, Value};
use sluice_core::DType;

/// Qwen3-235B-A22B's per-layer dimensions with `layers` MoE layers and `vocab` vocabulary rows.
pub fn slice_config(layers: usize, vocab: usize) -> Value {
    config([4096, 12288, 1536, 64], layers, vocab)
}

/// Qwen3-30B-A3B's per-layer dimensions with `layers` MoE layers and `vocab` vocabulary rows.
pub fn slice_config_30b(layers: usize, vocab: usize) -> Value {
    config([2048, 6144, 768, 32], layers, vocab)
}

/// A Qwen3-MoE config of `[hidden, dense width, expert width, query heads]` (4 KV heads of 128
/// and 128 experts, top-8, in both published sizes).
fn config([hidden, dense, width, heads]: [usize; 4], layers: usize, vocab: usize) -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": hidden,
        "intermediate_size": dense,
        "moe_intermediate_size": width,
        "num_attention_heads": heads,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1
    })
}

/// The tensors of a checkpoint of `config` (as [`slice_config`] writes it), shard by shard.
pub fn tensors(config: &Value) -> Result<Vec<Vec<SynthTensor>>, crate::ModelError> {
    let c = super::config::Qwen3MoeConfig::from_json(config)?;
    let b = &c.base;
    let [d, q, kv, hd, inter, e, ffn, vocab] = [
        b.hidden_size,
        b.q_width(),
        b.kv_width(),
        b.head_dim,
        c.moe_intermediate_size,
        c.num_experts,
        b.intermediate_size,
        b.vocab_size,
    ]
    .map(|x| x as u64);
    let t =
        |name: String, shape: &[u64], init: Init| SynthTensor::new(name, DType::BF16, shape, init);
    let mut shards = Vec::new();
    for i in 0..b.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let mut s = vec![
            t(format!("{p}.input_layernorm.weight"), &[d], Init::Ones),
            t(format!("{a}.q_proj.weight"), &[q, d], fan_in(d)),
            t(format!("{a}.k_proj.weight"), &[kv, d], fan_in(d)),
            t(format!("{a}.v_proj.weight"), &[kv, d], fan_in(d)),
            t(format!("{a}.o_proj.weight"), &[d, q], fan_in(q)),
            t(format!("{a}.q_norm.weight"), &[hd], Init::Ones),
            t(format!("{a}.k_norm.weight"), &[hd], Init::Ones),
            t(format!("{p}.post_attention_layernorm.weight"), &[d], Init::Ones),
        ];
        if c.is_moe(i) {
            s.push(t(format!("{p}.mlp.gate.weight"), &[e, d], fan_in(d)));
            for x in 0..e {
                let m = format!("{p}.mlp.experts.{x}");
                s.push(t(format!("{m}.gate_proj.weight"), &[inter, d], fan_in(d)));
                s.push(t(format!("{m}.up_proj.weight"), &[inter, d], fan_in(d)));
                s.push(t(format!("{m}.down_proj.weight"), &[d, inter], fan_in(inter)));
            }
        } else {
            s.push(t(format!("{p}.mlp.gate_proj.weight"), &[ffn, d], fan_in(d)));
            s.push(t(format!("{p}.mlp.up_proj.weight"), &[ffn, d], fan_in(d)));
            s.push(t(format!("{p}.mlp.down_proj.weight"), &[d, ffn], fan_in(ffn)));
        }
        shards.push(s);
    }
    shards.push(vec![
        t("model.embed_tokens.weight".into(), &[vocab, d], Init::Uniform(1.0)),
        t("model.norm.weight".into(), &[d], Init::Ones),
        t("lm_head.weight".into(), &[vocab, d], fan_in(d)),
    ]);
    Ok(shards)
}
