//! Helpers shared by the integration tests: config files and hand-crafted shards.

#![allow(dead_code, reason = "each test binary uses a different subset of the helpers")]

use std::path::Path;

use serde_json::{json, Value};
use sluice_checkpoint::{write_json_atomic, Checkpoint, CheckpointError};

/// A Kimi K3-style multimodal config.json.
pub fn k3_config() -> Value {
    json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": {
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "hidden_size": 8
        },
        "vision_config": {}
    })
}

/// A bare text config.json.
pub fn text_config() -> Value {
    json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 8})
}

/// Writes `config.json` into `dir`.
pub fn write_config(dir: &Path, value: &Value) {
    write_json_atomic(&dir.join("config.json"), value).expect("write config.json");
}

/// Bytes of a safetensors file with the given header length prefix, header and data.
pub fn raw_file(n: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = n.to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Bytes of a safetensors file with a correct length prefix for `header`.
pub fn crafted(header: &str, data: &[u8]) -> Vec<u8> {
    raw_file(header.len() as u64, header.as_bytes(), data)
}

/// A temporary checkpoint directory with a text config and `model.safetensors` = `bytes`;
/// returns the directory and the result of opening it.
pub fn open_single(bytes: &[u8]) -> (tempfile::TempDir, Result<Checkpoint, CheckpointError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write shard");
    let result = Checkpoint::open(dir.path());
    (dir, result)
}

/// Opens a checkpoint made of `bytes`, expecting failure; returns the error and its message.
pub fn open_err(bytes: &[u8]) -> (CheckpointError, String) {
    let (_dir, result) = open_single(bytes);
    let err = result.expect_err("opening a corrupt shard must fail");
    let msg = err.to_string();
    assert!(msg.contains("model.safetensors"), "message must name the file: {msg}");
    (err, msg)
}

/// `n` little-endian f32 values 0.0, 1.0, 2.0, … as bytes.
pub fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}
