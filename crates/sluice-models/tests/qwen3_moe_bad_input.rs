//! Qwen3-MoE checkpoints that contradict their config are refused at load with the family, the
//! tensor and the file named; never a panic, never a silently different computation.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::edit::{copy_fixture, edit_config, load, load_err};

#[test]
fn an_expert_count_that_contradicts_the_tensors_is_refused_by_name() {
    // tiny-a has 8 experts in layers 1 and 2 (layer 0 is dense).
    let e = load_err("qwen3_moe", "tiny-a", |v| v["num_experts"] = 10.into());
    assert!(e.contains("qwen3_moe") && e.contains("num_experts = 10"), "{e}");
    assert!(e.contains("model.layers.1.mlp.experts.8.gate_proj.weight"), "{e}");
    let e = load_err("qwen3_moe", "tiny-a", |v| v["num_experts"] = 6.into());
    assert!(e.contains("qwen3_moe") && e.contains("model.layers.1.mlp.experts.6."), "{e}");
    // A layer made sparse that holds a dense MLP has no experts at all.
    let e = load_err("qwen3_moe", "tiny-a", |v| v["mlp_only_layers"] = serde_json::json!([]));
    assert!(e.contains("model.layers.0.mlp.experts.0.gate_proj.weight"), "{e}");
}

#[test]
fn expert_shapes_that_contradict_the_config_name_family_tensor_and_file() {
    let e = load_err("qwen3_moe", "tiny-a", |v| v["moe_intermediate_size"] = 48.into());
    assert!(e.starts_with("qwen3_moe checkpoint:"), "{e}");
    assert!(e.contains("model.layers.1.mlp.experts.0.gate_proj.weight"), "{e}");
    assert!(e.contains("model-0000"), "error should name the shard file: {e}");
    let e = load_err("qwen3_moe", "tiny-b", |v| v["decoder_sparse_step"] = 1.into());
    assert!(e.contains("model.layers.0.mlp.experts.0.gate_proj.weight"), "{e}");
}

#[test]
fn unsupported_settings_are_refused_as_qwen3_moe() {
    let e = load_err("qwen3_moe", "tiny-b", |v| v["num_experts_per_tok"] = 7.into());
    assert!(e.contains("qwen3_moe config") && e.contains("exceeds num_experts"), "{e}");
    let e = load_err("qwen3_moe", "tiny-b", |v| v["use_sliding_window"] = true.into());
    assert!(e.contains("qwen3_moe config") && e.contains("use_sliding_window"), "{e}");
}

#[test]
fn an_unknown_architecture_lists_the_supported_ones() {
    let d = copy_fixture("qwen3_moe", "tiny-a");
    edit_config(d.path(), |v| v["architectures"] = serde_json::json!(["MixtralForCausalLM"]));
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("MixtralForCausalLM") && e.contains("Qwen3MoeForCausalLM"), "{e}");
}
