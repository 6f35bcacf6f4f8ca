//! The synthetic slices of `sluice synth --preset qwen3-moe-slice|qwen3-30b-slice|gpt-oss-slice`:
//! their configs are the real models' per-layer dimensions, and what the writer produces from a slice config
//! (shrunk here so the test writes kilobytes, not gigabytes) loads through the family table and
//! runs a finite pass, mapped and streamed alike. The K3 slice's `config.json` carries what other
//! readers of the release (llama.cpp's converter) need from it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::{gpt_oss, kimi_k3, qwen3_moe, synth, LogitRows};
use sluice_store::{CacheSize, StreamingConfig};
use std::sync::Arc;

fn shrink(mut c: Value, keys: &[(&str, u64)]) -> Value {
    for &(k, v) in keys {
        c[k] = v.into();
    }
    c
}

#[test]
fn slice_configs_have_the_real_per_layer_dimensions() {
    let q = qwen3_moe::config::Qwen3MoeConfig::from_json(&qwen3_moe::synth::slice_config(2, 1000))
        .unwrap();
    assert_eq!((q.base.hidden_size, q.num_experts, q.moe_intermediate_size), (4096, 128, 1536));
    assert_eq!((q.num_experts_per_tok, q.base.num_attention_heads), (8, 64));
    assert_eq!((q.base.num_key_value_heads, q.base.head_dim), (4, 128));
    let g = gpt_oss::config::GptOssConfig::from_json(&gpt_oss::synth::slice_config(2, 128, 1000))
        .unwrap();
    assert_eq!((g.hidden_size, g.num_local_experts, g.intermediate_size), (2880, 128, 2880));
    assert_eq!((g.num_experts_per_tok, g.num_attention_heads), (4, 64));
    assert_eq!((g.num_key_value_heads, g.head_dim), (8, 64));
    // Qwen3-30B-A3B and gpt-oss-20b, the models people run in memory.
    let q = qwen3_moe::config::Qwen3MoeConfig::from_json(&qwen3_moe::synth::slice_config_30b(
        48, 151_936,
    ))
    .unwrap();
    assert_eq!((q.base.hidden_size, q.num_experts, q.moe_intermediate_size), (2048, 128, 768));
    assert_eq!((q.num_experts_per_tok, q.base.num_attention_heads), (8, 32));
    assert_eq!((q.base.num_key_value_heads, q.base.head_dim), (4, 128));
    assert_eq!((q.base.intermediate_size, q.base.num_hidden_layers), (6144, 48));
    let g = gpt_oss::config::GptOssConfig::from_json(&gpt_oss::synth::slice_config(24, 32, 1000))
        .unwrap();
    assert_eq!((g.num_local_experts, g.num_hidden_layers, g.hidden_size), (32, 24, 2880));
}

#[test]
fn a_written_slice_loads_and_runs_mapped_and_streamed_alike() {
    let small = [
        ("hidden_size", 64),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("head_dim", 16),
        ("num_experts", 8),
        ("num_local_experts", 8),
        ("num_experts_per_tok", 2),
        ("experts_per_token", 2),
        ("moe_intermediate_size", 32),
        ("intermediate_size", 64),
    ];
    let configs = [
        shrink(qwen3_moe::synth::slice_config(2, 300), &small),
        shrink(gpt_oss::synth::slice_config(2, 128, 300), &small),
    ];
    for (i, config) in configs.iter().enumerate() {
        let tensors = if i == 0 {
            qwen3_moe::synth::tensors(config)
        } else {
            gpt_oss::synth::tensors(config)
        }
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bytes = synth::write(dir.path(), config, &tensors, 7, &mut |_, _| {}).unwrap();
        assert_eq!(bytes, synth::total_bytes(&tensors));
        let ckpt = Arc::new(Checkpoint::open(dir.path()).unwrap());
        let mut m = sluice_models::load(ckpt.clone()).unwrap();
        let run = |m: &sluice_models::Model| {
            let mut st = m.new_state();
            let l = m.forward(&mut st, &[3, 1, 4, 1, 5], LogitRows::All, None).unwrap();
            st.commit(5);
            l
        };
        let mapped = run(&m);
        assert!(mapped.iter().all(|x| x.is_finite()), "{}: finite logits", m.family());
        let routed = m.routed_experts().unwrap();
        let cfg = StreamingConfig { cache: CacheSize::Slots(2), ..StreamingConfig::default() };
        let store = routed.streaming(&ckpt, &cfg, &MemoryBudget::unlimited()).unwrap();
        m.set_experts(Arc::new(store));
        let streamed = run(&m);
        assert!(
            mapped.iter().zip(&streamed).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: streamed = mapped",
            m.family()
        );
    }
}

/// llama.cpp's converter read synth's K3 config and found neither the compressed-tensors
/// `quantization_config` (so it did not know the routed experts are packed MXFP4) nor
/// `max_position_embeddings`: both are now written with the release's values.
#[test]
fn k3_synth_config_lacked_quantization_config_and_max_position_embeddings() {
    let text = kimi_k3::synth::k3_slice_text_config(2, 16, 512);
    let c = kimi_k3::synth::release_config(&text, 256);
    assert_eq!(c["text_config"]["max_position_embeddings"], 1_048_576);
    let q = &c["quantization_config"];
    assert_eq!(q["quant_method"], "compressed-tensors");
    assert_eq!(q["format"], "mxfp4-pack-quantized");
    assert_eq!(q["quantization_status"], "compressed");
    let w = &q["config_groups"]["group_0"]["weights"];
    assert_eq!((w["num_bits"].as_u64(), w["group_size"].as_u64()), (Some(4), Some(32)));
    assert_eq!(
        (w["type"].as_str(), w["scale_dtype"].as_str()),
        (Some("float"), Some("torch.uint8"))
    );
    assert_eq!(q["config_groups"]["group_0"]["targets"], serde_json::json!(["Linear"]));
    let ignore: Vec<&str> =
        q["ignore"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(ignore.len(), 6);
    for kept in ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*lm_head.*"] {
        assert!(ignore.contains(&kept), "{kept} missing from {ignore:?}");
    }
    assert!(ignore.contains(&r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"), "{ignore:?}");
    // The text config still parses: the added key is one the engine reads (the context cap).
    kimi_k3::config::K3Config::from_json(&c["text_config"]).unwrap();
}
