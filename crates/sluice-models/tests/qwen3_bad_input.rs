//! Qwen3 checkpoints that contradict their config, or ask for something the port does not
//! implement, are refused at load with the key, tensor and file named; never a panic, never a
//! silently different computation.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::edit::{copy_fixture, edit_config, load, load_err};
use common::fixture_of;
use sluice_models::{LogitRows, Model};

#[test]
fn config_contradicting_tensors_names_tensor_and_file() {
    let e = load_err("qwen3", "tiny-a", |v| v["intermediate_size"] = 96.into());
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight"), "{e}");
    assert!(e.contains("model.safetensors"), "error should name the file: {e}");
    let e = load_err("qwen3", "tiny-b", |v| v["head_dim"] = 16.into());
    assert!(e.contains("self_attn.q_proj.weight"), "{e}");
    let e = load_err("qwen3", "tiny-a", |v| v["num_hidden_layers"] = 4.into());
    assert!(e.contains("model.layers.3."), "{e}");
}

#[test]
fn untied_config_needs_an_lm_head() {
    // tiny-a is tied, so its file has no lm_head.weight.
    let e = load_err("qwen3", "tiny-a", |v| v["tie_word_embeddings"] = false.into());
    assert!(e.contains("lm_head.weight"), "{e}");
}

#[test]
fn scaled_rope_is_refused() {
    let e = load_err("qwen3", "tiny-a", |v| {
        v["rope_parameters"] =
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6});
    });
    assert!(e.contains("rope_type \"yarn\""), "{e}");
    let e = load_err("qwen3", "tiny-b", |v| {
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0});
    });
    assert!(e.contains("\"dynamic\""), "{e}");
}

#[test]
fn unimplemented_features_are_refused() {
    let e = load_err("qwen3", "tiny-b", |v| v["attention_bias"] = true.into());
    assert!(e.contains("attention_bias"), "{e}");
    let e = load_err("qwen3", "tiny-b", |v| v["use_sliding_window"] = true.into());
    assert!(e.contains("use_sliding_window"), "{e}");
    let e = load_err("qwen3", "tiny-b", |v| v["hidden_act"] = "gelu_pytorch_tanh".into());
    assert!(e.contains("hidden_act"), "{e}");
}

#[test]
fn legacy_rope_keys_load_the_same_model() {
    // transformers 4.x wrote `rope_theta` + `rope_scaling: null` instead of `rope_parameters`.
    let d = copy_fixture("qwen3", "tiny-b");
    edit_config(d.path(), |v| {
        let theta = v["rope_parameters"]["rope_theta"].clone();
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_theta"] = theta;
        v["rope_scaling"] = serde_json::Value::Null;
    });
    let legacy = load(d.path()).unwrap();
    let current = load(&fixture_of("qwen3", "tiny-b")).unwrap();
    let ids = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let run = |m: &Model| {
        let mut s = m.new_state();
        m.forward(&mut s, &ids, LogitRows::All, None).unwrap()
    };
    assert_eq!(run(&legacy), run(&current));
}

#[test]
fn a_state_of_another_model_is_refused() {
    let qwen = load(&fixture_of("qwen3", "tiny-a")).unwrap();
    let k3 = load(&fixture_of("kimi_k3", "tiny-a")).unwrap();
    let mut k3_state = k3.new_state();
    let e = qwen.forward(&mut k3_state, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("belongs to another model"), "{e}");
    let mut q_state = qwen.new_state();
    let e = k3.forward(&mut q_state, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("kimi_k3"), "{e}");
}
