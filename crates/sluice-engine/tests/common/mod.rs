//! Helpers the engine's integration tests share: loading a committed fixture model.

use sluice_checkpoint::Checkpoint;
use sluice_models::Model;
use std::path::PathBuf;
use std::sync::Arc;

/// The committed fixture `tests/fixtures/FAMILY/NAME`, loaded.
pub fn load(family: &str, name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(family)
        .join(name);
    sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
}
