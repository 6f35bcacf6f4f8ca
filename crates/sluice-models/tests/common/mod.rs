//! Shared helpers for the model tests: fixture paths, the golden harness ([`golden`]: the
//! goldens the generators in `tools/` wrote next to each tiny checkpoint, and the checks every
//! family's golden test runs against them), broken fixture copies for the bad-input tests
//! ([`edit`]); the prompt, run and streamed-model setup of the streaming and spine-placement
//! tests; the MoE fixtures, loading and run the family contract and family spine tests share.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

pub mod edit;
pub mod golden;
mod moe_fixtures;

use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::{LogitRows, Model};
use sluice_store::{StreamingConfig, StreamingExperts};
use std::path::PathBuf;
use std::sync::Arc;

/// The fixture directory of a family's fixture (`kimi_k3`/`qwen3`, `tiny-a`/`tiny-b`).
pub fn fixture_of(family: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join(name)
}

/// The Kimi K3 fixture directory of `name` (`tiny-a`, `tiny-b`).
pub fn fixture(name: &str) -> PathBuf {
    fixture_of("kimi_k3", name)
}

/// Loads a fixture model.
pub fn load(name: &str) -> KimiK3 {
    let ckpt = Arc::new(Checkpoint::open(&fixture(name)).expect("fixture opens"));
    KimiK3::load(ckpt).expect("fixture loads")
}

/// The prompt of the streaming and spine-placement tests.
pub const PROMPT: [u32; 9] = [5, 17, 300, 42, 99, 7, 250, 301, 12];

/// Logits (as bits) of a prefill of [`PROMPT`] (all rows) and `steps` greedy single-token
/// decode steps (the first one fed token 3), each pass committed.
pub fn prefill_and_decode_bits(m: &KimiK3, steps: usize) -> Vec<u32> {
    let mut st = m.new_state();
    let mut out: Vec<u32> = Vec::new();
    let l = m.forward(&mut st, &PROMPT, LogitRows::All, None).unwrap();
    st.commit(PROMPT.len());
    out.extend(l.iter().map(|x| x.to_bits()));
    let mut tok = 3u32;
    for _ in 0..steps {
        let l = m.forward(&mut st, &[tok], LogitRows::All, None).unwrap();
        st.commit(1);
        tok = argmax(&l);
        out.extend(l.iter().map(|x| x.to_bits()));
    }
    out
}

/// The index of the first largest value.
pub fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[b] {
            b = i;
        }
    }
    u32::try_from(b).unwrap()
}

/// A Kimi K3 fixture model whose routed experts stream from its shards through `config`
/// (charged to no budget), with prefetch as given, and the streaming store.
pub fn streamed_with(
    name: &str,
    config: &StreamingConfig,
    prefetch: bool,
) -> (KimiK3, Arc<StreamingExperts>) {
    let ckpt = Arc::new(Checkpoint::open(&fixture(name)).unwrap());
    let cfg = K3Config::from_json(ckpt.config().text_config()).unwrap();
    let store = Arc::new(
        KimiK3::streaming_experts(&ckpt, &cfg, config, &MemoryBudget::unlimited()).unwrap(),
    );
    let mut m = KimiK3::with_store(ckpt, store.clone()).unwrap();
    m.set_prefetch(prefetch);
    (m, store)
}

/// Every MoE family's fixtures (family folder, fixture): what the family contract and the
/// spine-placement tests run, each through the family boundary only.
#[allow(unused_imports)] // used by the family tests, not by every file
pub use moe_fixtures::MOE_FIXTURES;

/// The prompt of the family contract and spine-placement tests (each id taken modulo the
/// fixture's vocabulary).
pub const FAMILY_PROMPT: [u32; 9] = [1, 5, 9, 2, 7, 3, 11, 4, 6];

/// A family's fixture opened and loaded through the family table, which must pick `family`.
pub fn open_family(family: &str, name: &str) -> (Arc<Checkpoint>, Model) {
    let dir = fixture_of(family, name);
    let ckpt = Arc::new(Checkpoint::open(&dir).expect("fixture opens"));
    let model = sluice_models::load(ckpt.clone()).expect("fixture loads");
    assert_eq!(model.family(), family, "the family table picked the fixture's family");
    (ckpt, model)
}

/// Logits (as bits) of a prefill of [`FAMILY_PROMPT`] (all rows) and `steps` greedy
/// single-token decode steps (the first one fed token 3), through [`Model`], each pass
/// committed.
pub fn family_prefill_and_decode(m: &Model, steps: usize) -> Vec<u32> {
    let vocab = m.vocab_size() as u32;
    let prompt: Vec<u32> = FAMILY_PROMPT.iter().map(|t| t % vocab).collect();
    let mut st = m.new_state();
    let mut out = Vec::new();
    let l = m.forward(&mut st, &prompt, LogitRows::All, None).unwrap();
    st.commit(prompt.len());
    out.extend(l.iter().map(|x| x.to_bits()));
    let mut tok = 3 % vocab;
    for _ in 0..steps {
        let l = m.forward(&mut st, &[tok], LogitRows::All, None).unwrap();
        st.commit(1);
        tok = argmax(&l);
        out.extend(l.iter().map(|x| x.to_bits()));
    }
    out
}
