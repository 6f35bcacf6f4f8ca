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

use sluice_checkpoint::Checkpoint;
use sluice_models::{LogitRows, Model};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixture(family: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join(name)
}

/// Copies a Qwen3 fixture's model files (not the goldens) into a fresh temporary directory.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("qwen3", name)).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_string();
        if !file.starts_with("golden") {
            std::fs::copy(&p, dst.path().join(file)).unwrap();
        }
    }
    dst
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn load(dir: &Path) -> Result<Model, String> {
    let c = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    sluice_models::load(Arc::new(c)).map_err(|e| e.to_string())
}

fn load_err(name: &str, f: impl FnOnce(&mut serde_json::Value)) -> String {
    let d = copy_fixture(name);
    edit_config(d.path(), f);
    load(d.path()).expect_err("must not load")
}

#[test]
fn config_contradicting_tensors_names_tensor_and_file() {
    let e = load_err("tiny-a", |v| v["intermediate_size"] = 96.into());
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight"), "{e}");
    assert!(e.contains("model.safetensors"), "error should name the file: {e}");
    let e = load_err("tiny-b", |v| v["head_dim"] = 16.into());
    assert!(e.contains("self_attn.q_proj.weight"), "{e}");
    let e = load_err("tiny-a", |v| v["num_hidden_layers"] = 4.into());
    assert!(e.contains("model.layers.3."), "{e}");
}

#[test]
fn untied_config_needs_an_lm_head() {
    // tiny-a is tied, so its file has no lm_head.weight.
    let e = load_err("tiny-a", |v| v["tie_word_embeddings"] = false.into());
    assert!(e.contains("lm_head.weight"), "{e}");
}

#[test]
fn scaled_rope_is_refused() {
    let e = load_err("tiny-a", |v| {
        v["rope_parameters"] =
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6});
    });
    assert!(e.contains("rope_type \"yarn\""), "{e}");
    let e = load_err("tiny-b", |v| {
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0});
    });
    assert!(e.contains("\"dynamic\""), "{e}");
}

#[test]
fn unimplemented_features_are_refused() {
    let e = load_err("tiny-b", |v| v["attention_bias"] = true.into());
    assert!(e.contains("attention_bias"), "{e}");
    let e = load_err("tiny-b", |v| v["use_sliding_window"] = true.into());
    assert!(e.contains("use_sliding_window"), "{e}");
    let e = load_err("tiny-b", |v| v["hidden_act"] = "gelu_pytorch_tanh".into());
    assert!(e.contains("hidden_act"), "{e}");
}

#[test]
fn legacy_rope_keys_load_the_same_model() {
    // transformers 4.x wrote `rope_theta` + `rope_scaling: null` instead of `rope_parameters`.
    let d = copy_fixture("tiny-b");
    edit_config(d.path(), |v| {
        let theta = v["rope_parameters"]["rope_theta"].clone();
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_theta"] = theta;
        v["rope_scaling"] = serde_json::Value::Null;
    });
    let legacy = load(d.path()).unwrap();
    let current = load(&fixture("qwen3", "tiny-b")).unwrap();
    let ids = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let run = |m: &Model| {
        let mut s = m.new_state();
        m.forward(&mut s, &ids, LogitRows::All, None).unwrap()
    };
    assert_eq!(run(&legacy), run(&current));
}

#[test]
fn a_state_of_another_model_is_refused() {
    let qwen = load(&fixture("qwen3", "tiny-a")).unwrap();
    let k3 = load(&fixture("kimi_k3", "tiny-a")).unwrap();
    let mut k3_state = k3.new_state();
    let e = qwen.forward(&mut k3_state, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("belongs to another model"), "{e}");
    let mut q_state = qwen.new_state();
    let e = k3.forward(&mut q_state, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("kimi_k3"), "{e}");
}
