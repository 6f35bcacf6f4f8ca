//! GPT-OSS checkpoints that lack a tensor or contradict their config are refused at load with the
//! family, the tensor and the file named; never a panic, never a silently different computation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_checkpoint::Checkpoint;
use sluice_models::Model;
use std::path::Path;
use std::sync::Arc;

/// Copies a GPT-OSS fixture's model files (not the goldens) into a fresh temporary directory.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(common::fixture_of("gpt_oss", name)).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_string();
        if !file.starts_with("golden") && p.is_file() {
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

/// Renames tensor `from` to `to` (same length, so no offset moves) in whichever file names it:
/// the shard header and the index. The shard then no longer holds a tensor called `from`.
fn rename_tensor(dir: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let mut hits = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let quoted = format!("\"{from}\"");
        let hit = bytes.windows(quoted.len()).position(|w| w == quoted.as_bytes());
        if let Some(at) = hit {
            bytes[at + 1..at + 1 + to.len()].copy_from_slice(to.as_bytes());
            std::fs::write(&p, bytes).unwrap();
            hits += 1;
        }
    }
    assert_eq!(hits, 2, "{from} should be named by one shard header and the index");
}

fn load(dir: &Path) -> Result<Model, String> {
    let c = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    sluice_models::load(Arc::new(c)).map_err(|e| e.to_string())
}

#[test]
fn a_missing_scales_tensor_names_family_and_tensor() {
    let d = copy_fixture("tiny-a");
    let name = "model.layers.2.mlp.experts.down_proj_scales";
    rename_tensor(d.path(), name, "model.layers.2.mlp.experts.down_proj_scaleZ");
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("gpt_oss checkpoint:"), "{e}");
    assert!(e.contains(name), "{e}");
}

#[test]
fn an_expert_count_that_contradicts_the_tensors_names_file_and_tensor() {
    let d = copy_fixture("tiny-b");
    edit_config(d.path(), |v| v["num_local_experts"] = 8.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("gpt_oss checkpoint:"), "{e}");
    assert!(e.contains("model.layers.0.mlp.router.weight") && e.contains("model-0000"), "{e}");
}

#[test]
fn experts_not_in_mxfp4_and_other_rope_types_are_refused() {
    let d = copy_fixture("tiny-a");
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("quantization_config");
    });
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("gpt_oss config") && e.contains("mxfp4"), "{e}");
    let d = copy_fixture("tiny-a");
    edit_config(d.path(), |v| v["rope_scaling"]["rope_type"] = "linear".into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("\"linear\""), "{e}");
    let d = copy_fixture("tiny-a");
    edit_config(d.path(), |v| v["layer_types"][1] = "chunked_attention".into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("chunked_attention"), "{e}");
    let d = copy_fixture("tiny-a");
    edit_config(d.path(), |v| v["experts_per_token"] = 3.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("experts_per_token"), "{e}");
}
