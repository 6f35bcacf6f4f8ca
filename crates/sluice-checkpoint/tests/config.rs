//! `config.json` handling through `Checkpoint::open`.

mod common;

use common::{f32_bytes, k3_config};
use sluice_checkpoint::{
    write_safetensors, Checkpoint, CheckpointConfig, CheckpointError, TensorData,
};
use sluice_core::DType;

#[test]
fn missing_config_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = f32_bytes(1);
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[TensorData { name: "w", dtype: DType::F32, shape: &[1], data: &data }],
        None,
    )
    .expect("write");
    let err = Checkpoint::open(dir.path()).expect_err("no config");
    assert!(matches!(err, CheckpointError::MissingConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn bad_config_json_names_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), "{\n  \"architectures\": [\"X\"],\n  oops\n}")
        .expect("write");
    let err = Checkpoint::open(dir.path()).expect_err("bad json");
    assert!(
        matches!(err, CheckpointError::BadJson { ref source, .. } if source.line() == 3),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("config.json") && msg.contains("line 3 column 3"), "{msg}");
}

#[test]
fn config_without_architectures() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "x"}"#).expect("write");
    let err = CheckpointConfig::load(dir.path()).expect_err("no architectures");
    assert!(matches!(err, CheckpointError::MissingArchitectures { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn k3_multimodal_config_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_config(dir.path(), &k3_config());
    let cfg = CheckpointConfig::load(dir.path()).expect("load");
    assert!(cfg.is_multimodal());
    assert_eq!(cfg.architectures(), ["KimiK3ForConditionalGeneration".to_owned()]);
    assert_eq!(cfg.model_type(), Some("kimi_k3"));
    assert_eq!(cfg.text_config()["hidden_size"], 8);
    assert_eq!(cfg.raw()["vision_config"], serde_json::json!({}));
    assert_eq!(cfg.path(), dir.path().join("config.json"));
}
