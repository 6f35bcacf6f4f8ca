//! Shared helpers for the model tests: fixture paths and a reader for the golden tensors that
//! `tools/gen_k3_goldens.py` (mlx-lm) and `tools/gen_qwen3_goldens.py` (HF transformers) wrote
//! next to each tiny checkpoint; the prompt, run and streamed-model setup of the streaming and
//! spine-placement tests.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_checkpoint::{parse_header, Checkpoint};
use sluice_core::{DType, MemoryBudget};
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;
use sluice_store::{StreamingConfig, StreamingExperts};
use std::collections::BTreeMap;
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

/// Golden tensors of one fixture.
pub struct Golden {
    pub f32s: BTreeMap<String, (Vec<u64>, Vec<f32>)>,
    pub i32s: BTreeMap<String, (Vec<u64>, Vec<i32>)>,
    pub json: serde_json::Value,
}

impl Golden {
    /// The goldens of the Kimi K3 fixture `name`.
    pub fn load(name: &str) -> Self {
        Self::load_dir(&fixture(name))
    }

    /// The goldens in a fixture directory.
    pub fn load_dir(dir: &std::path::Path) -> Self {
        let path = dir.join("golden.safetensors");
        let bytes = std::fs::read(&path).expect("golden.safetensors");
        let h = parse_header(&path, &bytes).expect("golden header");
        let mut f32s = BTreeMap::new();
        let mut i32s = BTreeMap::new();
        for t in h.tensors {
            let b = &bytes[t.data_start as usize..(t.data_start + t.len) as usize];
            match t.dtype {
                DType::F32 => {
                    let v = b
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    f32s.insert(t.name, (t.shape, v));
                }
                DType::I32 => {
                    let v = b
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    i32s.insert(t.name, (t.shape, v));
                }
                other => panic!("unexpected golden dtype {other}"),
            }
        }
        let json =
            serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
        Self { f32s, i32s, json }
    }

    pub fn f(&self, name: &str) -> &[f32] {
        &self.f32s.get(name).unwrap_or_else(|| panic!("golden {name}")).1
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.i32s
            .get(name)
            .unwrap_or_else(|| panic!("golden {name}"))
            .1
            .iter()
            .map(|&v| v as u32)
            .collect()
    }
}

/// A golden's JSON array of token ids (the family goldens' `meta.json` fields).
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| u32::try_from(x.as_u64().unwrap()).unwrap()).collect()
}

/// Relative L2 distance ‖a − b‖ / ‖b‖ in f64.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Largest absolute difference.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
