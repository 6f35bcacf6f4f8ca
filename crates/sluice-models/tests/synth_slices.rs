//! The synthetic slices of `sluice synth --preset qwen3-moe-slice|gpt-oss-slice`: their configs
//! are the real models' per-layer dimensions, and what the writer produces from a slice config
//! (shrunk here so the test writes kilobytes, not gigabytes) loads through the family table and
//! runs a finite pass, mapped and streamed alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::{gpt_oss, qwen3_moe, synth, LogitRows};
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
    let g =
        gpt_oss::config::GptOssConfig::from_json(&gpt_oss::synth::slice_config(2, 1000)).unwrap();
    assert_eq!((g.hidden_size, g.num_local_experts, g.intermediate_size), (2880, 128, 2880));
    assert_eq!((g.num_experts_per_tok, g.num_attention_heads), (4, 64));
    assert_eq!((g.num_key_value_heads, g.head_dim), (8, 64));
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
        shrink(gpt_oss::synth::slice_config(2, 300), &small),
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
