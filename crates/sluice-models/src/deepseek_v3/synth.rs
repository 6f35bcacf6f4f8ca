//! Synthetic DeepSeek-V3-architecture checkpoints in the published layouts, for streaming
//! benchmarks: [`slice_config`] keeps the real per-layer dimensions of DeepSeek V3 / R1
//! (`deepseek-ai/DeepSeek-V3` config.json: hidden 7168, MLA with 128 heads, q LoRA 1536, kv LoRA
//! 512, RoPE 64 + nope 128, v 128, YaRN ×40; 256 routed experts of width 2048, top-8,
//! `n_group` 8 / `topk_group` 4, one shared expert; dense width 18432; FP8 e4m3 with 128×128
//! block scales for every projection) or of Kimi K2 Thinking (`moonshotai/Kimi-K2-Thinking`: the
//! same widths with 64 heads, 384 experts, one group, YaRN ×32 over θ 50000; bf16 attention,
//! dense and shared MLPs, INT4 pack-quantized routed experts, group 32) — with one dense layer,
//! `layers` MoE layers, `experts` routed experts and `vocab` vocabulary rows (the full models
//! have 3 / 1 dense and 58 / 60 MoE layers, 256 / 384 experts, vocab 129280 / 163840).
//! One shard per layer plus one for the embedding, the final norm and the head; an expert's
//! tensors are listed together, as the published shards sort them.

use crate::synth::{fan_in, Init, SynthTensor};
use serde_json::{json, Value};
use sluice_core::DType;

/// Which published model a slice follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    /// DeepSeek V3 / R1: FP8 everywhere but embedding, head, norms and routers.
    DeepseekV3,
    /// Kimi K2 Thinking: INT4 routed experts, bf16 elsewhere.
    KimiK2,
}

/// The config.json of a slice of `kind` with one dense and `layers` MoE layers, `experts`
/// routed experts per layer and `vocab` vocabulary rows.
pub fn slice_config(kind: Slice, layers: usize, experts: usize, vocab: usize) -> Value {
    let mut c = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "num_experts_per_tok": 8,
        "num_hidden_layers": layers + 1,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": false,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": vocab,
    });
    let extra = match kind {
        Slice::DeepseekV3 => json!({
            "model_type": "deepseek_v3",
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_group": 8,
            "topk_group": 4,
            "routed_scaling_factor": 2.5,
            "max_position_embeddings": 163840,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "beta_fast": 32, "beta_slow": 1, "factor": 40.0, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"
            },
            "quantization_config": {
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]
            }
        }),
        Slice::KimiK2 => json!({
            "model_type": "kimi_k2",
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.827,
            "max_position_embeddings": 262144,
            "rope_theta": 50000.0,
            "rope_scaling": {
                "beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"
            },
            "quantization_config": {
                "config_groups": {"group_0": {
                    "input_activations": null, "output_activations": null, "targets": ["Linear"],
                    "weights": {
                        "actorder": null, "block_structure": null, "dynamic": false,
                        "group_size": 32, "num_bits": 4, "observer": "minmax",
                        "observer_kwargs": {}, "strategy": "group", "symmetric": true,
                        "type": "int"
                    }
                }},
                "format": "pack-quantized",
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
                "kv_cache_scheme": null,
                "quant_method": "compressed-tensors",
                "quantization_status": "compressed"
            }
        }),
    };
    if let (Some(c), Value::Object(e)) = (c.as_object_mut(), extra) {
        c.extend(e);
    }
    c
}

/// How the linear layers of a slice are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Bf16,
    Fp8,
    Int4,
}

/// The tensors of projection `p` (`[rows, cols]`) stored as `s`.
fn linear(out: &mut Vec<SynthTensor>, p: &str, rows: u64, cols: u64, s: Store) {
    let t = |name: String, dt: DType, shape: &[u64], init: Init| {
        SynthTensor::new(name, dt, shape, init)
    };
    let bound = match fan_in(cols) {
        Init::Uniform(a) => a,
        _ => 1.0,
    };
    match s {
        Store::Bf16 => out.push(t(format!("{p}.weight"), DType::BF16, &[rows, cols], fan_in(cols))),
        Store::Fp8 => {
            // Codes of magnitude in [1/8, 2): a scale of the fan-in bound keeps rows unit-scale.
            out.push(t(format!("{p}.weight"), DType::F8E4M3, &[rows, cols], Init::Fp8));
            let sh = [rows.div_ceil(128), cols.div_ceil(128)];
            out.push(t(format!("{p}.weight_scale_inv"), DType::F32, &sh, Init::Uniform(bound)));
        }
        Store::Int4 => {
            // Nibbles −8..7 (mean magnitude 4): scales of a quarter of the bound.
            out.push(t(format!("{p}.weight_packed"), DType::I32, &[rows, cols / 8], Init::Bytes));
            let sh = [rows, cols / 32];
            out.push(t(format!("{p}.weight_scale"), DType::BF16, &sh, Init::Uniform(bound / 4.0)));
            out.push(t(format!("{p}.weight_shape"), DType::I32, &[2], Init::Dims(rows, cols)));
        }
    }
}

/// The MLP `{p}.{gate,up,down}_proj` of width `inter`, its tensors in name order.
fn mlp(out: &mut Vec<SynthTensor>, p: &str, inter: u64, d: u64, s: Store) {
    linear(out, &format!("{p}.down_proj"), d, inter, s);
    linear(out, &format!("{p}.gate_proj"), inter, d, s);
    linear(out, &format!("{p}.up_proj"), inter, d, s);
}

/// The tensors of a checkpoint of `config` (as [`slice_config`] writes it), shard by shard.
pub fn tensors(config: &Value) -> Result<Vec<Vec<SynthTensor>>, crate::ModelError> {
    let c = super::config::DeepseekV3Config::from_json(config)?;
    let (spine, experts) = if c.model_type == "kimi_k2" {
        (Store::Bf16, Store::Int4)
    } else {
        (Store::Fp8, Store::Fp8)
    };
    let [d, h, ql, kl, rd, nope, vd, inter, ffn, e, vocab] = [
        c.hidden_size,
        c.num_attention_heads,
        c.q_lora_rank.unwrap_or(0),
        c.kv_lora_rank,
        c.qk_rope_head_dim,
        c.qk_nope_head_dim,
        c.v_head_dim,
        c.moe_intermediate_size,
        c.intermediate_size,
        c.n_routed_experts,
        c.vocab_size,
    ]
    .map(|x| x as u64);
    let bf16 =
        |name: String, shape: &[u64], init: Init| SynthTensor::new(name, DType::BF16, shape, init);
    let mut shards = Vec::new();
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let mut s = vec![bf16(format!("{p}.input_layernorm.weight"), &[d], Init::Ones)];
        linear(&mut s, &format!("{a}.q_a_proj"), ql, d, spine);
        s.push(bf16(format!("{a}.q_a_layernorm.weight"), &[ql], Init::Ones));
        linear(&mut s, &format!("{a}.q_b_proj"), h * (nope + rd), ql, spine);
        linear(&mut s, &format!("{a}.kv_a_proj_with_mqa"), kl + rd, d, spine);
        s.push(bf16(format!("{a}.kv_a_layernorm.weight"), &[kl], Init::Ones));
        linear(&mut s, &format!("{a}.kv_b_proj"), h * (nope + vd), kl, spine);
        linear(&mut s, &format!("{a}.o_proj"), d, h * vd, spine);
        s.push(bf16(format!("{p}.post_attention_layernorm.weight"), &[d], Init::Ones));
        if c.is_moe(i) {
            s.push(bf16(format!("{p}.mlp.gate.weight"), &[e, d], fan_in(d)));
            s.push(SynthTensor::new(
                format!("{p}.mlp.gate.e_score_correction_bias"),
                DType::F32,
                &[e],
                Init::Uniform(0.01),
            ));
            for x in 0..e {
                mlp(&mut s, &format!("{p}.mlp.experts.{x}"), inter, d, experts);
            }
            let shared = inter * c.n_shared_experts as u64;
            mlp(&mut s, &format!("{p}.mlp.shared_experts"), shared, d, spine);
        } else {
            mlp(&mut s, &format!("{p}.mlp"), ffn, d, spine);
        }
        shards.push(s);
    }
    shards.push(vec![
        bf16("model.embed_tokens.weight".into(), &[vocab, d], Init::Uniform(1.0)),
        bf16("model.norm.weight".into(), &[d], Init::Ones),
        bf16("lm_head.weight".into(), &[vocab, d], fan_in(d)),
    ]);
    Ok(shards)
}
