//! Helpers the engine's integration tests share: loading a committed fixture model, and one
//! `run_turn` whose reuse comes from the on-disk state cache only.

use sluice_checkpoint::Checkpoint;
use sluice_engine::session::{SessionCache, SessionConfig};
use sluice_engine::state_cache::StateCache;
use sluice_engine::turn::{run_turn, Turn, TurnOptions};
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

/// One `run_turn` (3 tokens, every token's logits as bits) with a session cache that keeps nothing
/// in memory, so every reuse is from `disk`; without `disk`, no cache at all.
#[allow(dead_code)] // used by the tests of restores from disk, not by every file
pub fn disk_turn(
    m: &Model,
    disk: Option<&Arc<StateCache>>,
    p: &[u32],
    boundaries: &[usize],
) -> (Vec<Vec<u32>>, Turn) {
    let mut cache = disk.map(|d| {
        SessionCache::new(SessionConfig { checkpoint_every: 0, max_bytes: 0, max_entries: 0 })
            .with_disk(Some(Arc::clone(d)))
    });
    let opts = TurnOptions {
        per_token_logits: true,
        boundaries: boundaries.to_vec(),
        ..TurnOptions::greedy(3)
    };
    let mut logits = Vec::new();
    let mut cb = |_t: u32, l: Option<&[f32]>| {
        logits.push(l.unwrap().iter().map(|x| x.to_bits()).collect());
        true
    };
    let t = run_turn(m, cache.as_mut(), p, &opts, None, &|| false, &mut cb).unwrap();
    if let Some(d) = disk {
        d.flush();
    }
    (logits, t)
}
