//! Synthetic GPT-OSS checkpoints in the published layout (stacked MXFP4 `*_blocks` /
//! `*_scales` experts with bf16 biases, see [`super::weights`]), for streaming benchmarks:
//! [`slice_config`] keeps gpt-oss-120b's real per-layer dimensions — hidden 2880, 64 query / 8 KV
//! heads of 64, 128 experts of width 2880, top-4, sliding window 128 on alternate layers, YaRN
//! ×32 over 4096 positions, SwiGLU limit 7 — with `layers` layers, `experts` routed experts and
//! `vocab` vocabulary rows (the published config.json of `openai/gpt-oss-120b`, 36 layers of 128
//! experts, vocab 201088; `openai/gpt-oss-20b` has the same per-layer dimensions with 24 layers of
//! 32 experts, so 24 layers and 32 experts write gpt-oss-20b but for its vocabulary rows). One
//! shard per layer plus one for the embedding, the final norm and the head.

use crate::synth::{fan_in, Init, SynthTensor};
use serde_json::{json, Value};
use sluice_core::DType;

/// gpt-oss-120b's per-layer dimensions with `layers` layers, `experts` routed experts (128
/// published; gpt-oss-20b: 32) and `vocab` vocabulary rows.
pub fn slice_config(layers: usize, experts: usize, vocab: usize) -> Value {
    let types: Vec<&str> = (0..layers)
        .map(|i| if i % 2 == 0 { "sliding_attention" } else { "full_attention" })
        .collect();
    json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "num_hidden_layers": layers,
        "layer_types": types,
        "sliding_window": 128,
        "vocab_size": vocab,
        "max_position_embeddings": 131072,
        "initial_context_length": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150_000.0,
        "rope_scaling": {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096, "truncate": false
        },
        "swiglu_limit": 7.0,
        "attention_bias": true,
        "tie_word_embeddings": false,
        "quantization_config": {"quant_method": "mxfp4"},
        "eos_token_id": 1,
        "pad_token_id": 0
    })
}

/// The tensors of a checkpoint of `config` (as [`slice_config`] writes it), shard by shard.
pub fn tensors(config: &Value) -> Result<Vec<Vec<SynthTensor>>, crate::ModelError> {
    let c = super::config::GptOssConfig::from_json(config)?;
    let [d, q, kv, e, inter, vocab, heads] = [
        c.hidden_size,
        c.q_width(),
        c.kv_width(),
        c.num_local_experts,
        c.intermediate_size,
        c.vocab_size,
        c.num_attention_heads,
    ]
    .map(|x| x as u64);
    let bf =
        |name: String, shape: &[u64], init: Init| SynthTensor::new(name, DType::BF16, shape, init);
    let u8t =
        |name: String, shape: &[u64], init: Init| SynthTensor::new(name, DType::U8, shape, init);
    // E8M0 scales 2^-6 .. 2^-4 times E2M1 values up to 6: entries up to ~0.4, like a trained
    // expert's; a row of `in` of them keeps the output near unit scale.
    let scales = Init::Scales(121, 123);
    let small = Init::Uniform(0.01);
    let mut shards = Vec::new();
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let x = format!("{p}.mlp.experts");
        shards.push(vec![
            bf(format!("{p}.input_layernorm.weight"), &[d], Init::Ones),
            bf(format!("{a}.q_proj.weight"), &[q, d], fan_in(d)),
            bf(format!("{a}.q_proj.bias"), &[q], small),
            bf(format!("{a}.k_proj.weight"), &[kv, d], fan_in(d)),
            bf(format!("{a}.k_proj.bias"), &[kv], small),
            bf(format!("{a}.v_proj.weight"), &[kv, d], fan_in(d)),
            bf(format!("{a}.v_proj.bias"), &[kv], small),
            bf(format!("{a}.o_proj.weight"), &[d, q], fan_in(q)),
            bf(format!("{a}.o_proj.bias"), &[d], small),
            bf(format!("{a}.sinks"), &[heads], small),
            bf(format!("{p}.post_attention_layernorm.weight"), &[d], Init::Ones),
            bf(format!("{p}.mlp.router.weight"), &[e, d], fan_in(d)),
            bf(format!("{p}.mlp.router.bias"), &[e], small),
            u8t(format!("{x}.gate_up_proj_blocks"), &[e, 2 * inter, d / 32, 16], Init::Bytes),
            u8t(format!("{x}.gate_up_proj_scales"), &[e, 2 * inter, d / 32], scales),
            bf(format!("{x}.gate_up_proj_bias"), &[e, 2 * inter], small),
            u8t(format!("{x}.down_proj_blocks"), &[e, d, inter / 32, 16], Init::Bytes),
            u8t(format!("{x}.down_proj_scales"), &[e, d, inter / 32], scales),
            bf(format!("{x}.down_proj_bias"), &[e, d], small),
        ]);
    }
    shards.push(vec![
        bf("model.embed_tokens.weight".into(), &[vocab, d], Init::Uniform(1.0)),
        bf("model.norm.weight".into(), &[d], Init::Ones),
        bf("lm_head.weight".into(), &[vocab, d], fan_in(d)),
    ]);
    Ok(shards)
}
