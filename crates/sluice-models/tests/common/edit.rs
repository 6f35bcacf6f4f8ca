//! Broken copies of a fixture for the `<family>_bad_input.rs` tests: a fixture's model files
//! copied into a temporary directory, then its config or its shard headers edited in place, and
//! the copy loaded through the family table with the error as text.

use sluice_checkpoint::Checkpoint;
use sluice_models::Model;
use std::path::Path;
use std::sync::Arc;

/// Copies fixture `family/name`'s model files (not the goldens) into a fresh temporary
/// directory.
pub fn copy_fixture(family: &str, name: &str) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(super::fixture_of(family, name)).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_string();
        if !file.starts_with("golden") && p.is_file() {
            std::fs::copy(&p, dst.path().join(file)).unwrap();
        }
    }
    dst
}

/// Rewrites `dir`'s `config.json` through `f`.
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Replaces `from` by `to` (same length, so every offset stays valid) in the safetensors header
/// of every shard and in the index: renames a tensor or rewrites its shape in place. `from` must
/// occur in exactly one shard header.
pub fn edit_headers(dir: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len(), "an in-place edit keeps the header length");
    let mut hits = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.ends_with(".safetensors") {
            let mut b = std::fs::read(&p).unwrap();
            let n = usize::try_from(u64::from_le_bytes(b[..8].try_into().unwrap())).unwrap();
            let h = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
            if h.contains(from) {
                hits += 1;
                b[8..8 + n].copy_from_slice(h.replace(from, to).as_bytes());
                std::fs::write(&p, b).unwrap();
            }
        } else if name == "model.safetensors.index.json" {
            let s = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, s.replace(from, to)).unwrap();
        }
    }
    assert_eq!(hits, 1, "{from} must occur in exactly one shard header");
}

/// Loads the checkpoint in `dir` through the family table; the error as its message.
pub fn load(dir: &Path) -> Result<Model, String> {
    let c = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    sluice_models::load(Arc::new(c)).map_err(|e| e.to_string())
}

/// The message refusing fixture `family/name` with its config edited by `f`.
pub fn load_err(family: &str, name: &str, f: impl FnOnce(&mut serde_json::Value)) -> String {
    let d = copy_fixture(family, name);
    edit_config(d.path(), f);
    load(d.path()).expect_err("must not load")
}
