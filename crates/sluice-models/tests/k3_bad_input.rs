//! Bad input gives a clear error naming the cause, never a panic: configs that contradict the
//! tensors, unknown architectures, missing or truncated shards, out-of-vocabulary ids, empty
//! input.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{fixture, load};
use sluice_checkpoint::Checkpoint;
use sluice_models::{LogitRows, ModelError};
use std::path::Path;
use std::sync::Arc;

/// Copies the tiny-a fixture's model files into a fresh temporary directory.
fn copy_fixture() -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("tiny-a")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with("golden") {
            continue;
        }
        std::fs::copy(&p, dst.path().join(name)).unwrap();
    }
    dst
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Err(e) => e.to_string(),
        Ok(c) => sluice_models::load(Arc::new(c)).expect_err("must not load").to_string(),
    }
}

#[test]
fn config_contradicting_tensors_names_the_tensor() {
    let d = copy_fixture();
    edit_config(d.path(), |v| v["text_config"]["hidden_size"] = 80.into());
    let e = load_err(d.path());
    assert!(e.contains("language_model.model."), "{e}");
    assert!(e.contains("model-0000"), "error should name the shard file: {e}");
}

#[test]
fn wrong_expert_count_is_caught() {
    let d = copy_fixture();
    edit_config(d.path(), |v| v["text_config"]["num_experts"] = 17.into());
    let e = load_err(d.path());
    assert!(e.contains("experts.16.w1.weight_packed"), "{e}");
}

#[test]
fn unknown_architecture_is_refused() {
    let d = copy_fixture();
    edit_config(d.path(), |v| v["architectures"] = serde_json::json!(["LlamaForCausalLM"]));
    let e = load_err(d.path());
    assert!(e.contains("unknown architecture") && e.contains("LlamaForCausalLM"), "{e}");
}

#[test]
fn unsupported_activation_is_refused() {
    let d = copy_fixture();
    edit_config(d.path(), |v| v["text_config"]["hidden_act"] = "silu".into());
    let e = load_err(d.path());
    assert!(e.contains("hidden_act"), "{e}");
}

#[test]
fn missing_shard_is_named() {
    let d = copy_fixture();
    std::fs::remove_file(d.path().join("model-00002-of-000003.safetensors")).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model-00002-of-000003.safetensors"), "{e}");
}

#[test]
fn truncated_shard_is_named() {
    let d = copy_fixture();
    let p = d.path().join("model-00001-of-000003.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1000).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model-00001-of-000003.safetensors"), "{e}");
}

#[test]
fn wrong_dtype_is_named() {
    // Relabel layer 0's o_norm (F32) as I32 with the same shape and bytes: the dtype is wrong.
    let d = copy_fixture();
    let ck = Checkpoint::open(d.path()).unwrap();
    let name = "language_model.model.layers.0.self_attn.o_norm.weight";
    let entry = ck.tensor(name).unwrap().clone();
    let shard = ck.shard_file(&entry).to_path_buf();
    let mut specs = Vec::new();
    let mut datas: Vec<Vec<u8>> = Vec::new();
    let mut in_shard: Vec<_> = ck.tensors().filter(|t| t.shard == entry.shard).cloned().collect();
    in_shard.sort_by_key(|t| t.offset);
    for t in &in_shard {
        let bytes = ck.bytes(t).to_vec();
        if t.name == name {
            specs.push(sluice_checkpoint::TensorSpec::new(
                t.name.clone(),
                sluice_core::DType::I32,
                t.shape.clone(),
            ));
        } else {
            specs.push(sluice_checkpoint::TensorSpec::new(
                t.name.clone(),
                t.dtype,
                t.shape.clone(),
            ));
        }
        datas.push(bytes);
    }
    drop(ck);
    let mut w = sluice_checkpoint::ShardWriter::create(&shard, specs, None).unwrap();
    for (t, b) in in_shard.iter().zip(&datas) {
        w.write_tensor(&t.name, b).unwrap();
    }
    w.finish().unwrap();
    let e = load_err(d.path());
    assert!(e.contains(name) && e.contains("I32"), "{e}");
}

#[test]
fn out_of_vocab_and_empty_input_are_errors() {
    let m = load("tiny-a");
    let mut s = m.new_state();
    let v = u32::try_from(m.config().vocab_size).unwrap();
    match m.forward(&mut s, &[1, v], LogitRows::Last, None) {
        Err(ModelError::TokenOutOfRange { id, .. }) => assert_eq!(id, v),
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert!(matches!(m.forward(&mut s, &[], LogitRows::Last, None), Err(ModelError::EmptyInput)));
    // The state is untouched by the refused passes.
    assert_eq!(s.len(), 0);
    assert!(s.pending().is_none());
}
