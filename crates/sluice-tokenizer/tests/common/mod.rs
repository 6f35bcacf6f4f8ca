//! Helpers shared by the integration tests: fixture paths and JSON access; the check of a model
//! family's chat goldens ([`chat_golden`]); the fixtures of every tokenizer kind
//! ([`tokenizer_kinds`]).

#![allow(dead_code)]

pub mod chat_golden;
pub mod tokenizer_kinds;

use std::path::PathBuf;

use serde_json::Value;
use sluice_tokenizer::Tokenizer;

/// `tests/fixtures/tokenizer` at the workspace root.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

/// Reads and parses a JSON fixture.
pub fn read_json(name: &str) -> Value {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tokenizer written by tools/gen_tokenizer_goldens.py.
pub fn fixture_tokenizer() -> Tokenizer {
    Tokenizer::from_dir(fixture_dir()).expect("fixture tokenizer loads")
}

/// A JSON array of numbers as token ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an id array")
        .iter()
        .map(|v| u32::try_from(v.as_u64().expect("an id")).expect("id fits u32"))
        .collect()
}

/// FNV-1a 64 over the ids as little-endian u32, as the generator digests long id lists.
pub fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for id in ids {
        for byte in id.to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
    }
    format!("{h:016x}")
}

/// Compares ids with a golden record: a plain list, or `{len, fnv1a64, head, tail}`.
pub fn assert_ids(got: &[u32], want: &Value, what: &str) {
    if want.is_array() {
        let want = ids(want);
        if got != want.as_slice() {
            let at = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            panic!(
                "{what}: ids differ at {at} (got {} ids, want {}): got {:?} want {:?}",
                got.len(),
                want.len(),
                &got[at..got.len().min(at + 8)],
                &want[at..want.len().min(at + 8)]
            );
        }
        return;
    }
    let len = usize::try_from(want["len"].as_u64().expect("len")).expect("len fits");
    let head = ids(&want["head"]);
    let tail = ids(&want["tail"]);
    assert_eq!(got.len(), len, "{what}: id count");
    assert_eq!(&got[..head.len()], head.as_slice(), "{what}: first ids");
    assert_eq!(&got[got.len() - tail.len()..], tail.as_slice(), "{what}: last ids");
    assert_eq!(fnv1a64(got), want["fnv1a64"].as_str().expect("digest"), "{what}: digest");
}
