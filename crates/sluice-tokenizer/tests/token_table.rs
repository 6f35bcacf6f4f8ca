//! The vocabulary a grammar engine indexes ([`AnyTokenizer::vocab_entries`]) checked against
//! each fixture tokenizer's own decoding, for every tokenizer kind the fixtures have (K3's and
//! Kimi K2's tiktoken ranks; the byte-level BPE `tokenizer.json` of Qwen3-MoE, GPT-OSS and
//! DeepSeek): every token's bytes are what the tokenizer decodes it to, byte for byte even when
//! a token ends inside a UTF-8 character, and every added token (each chat format's markers) is
//! flagged as one. Ordinary text ([`AnyTokenizer::encode_plain`], what a grammar forces) is
//! spelled by tokens whose bytes are exactly the text, and a marker spelled in it is never its
//! added token.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use sluice_tokenizer::AnyTokenizer;
use std::path::PathBuf;

/// Every tokenizer kind the fixtures have.
const FIXTURES: [&str; 5] = common::tokenizer_kinds::TOKENIZER_FIXTURES;

/// Every family's markers, spelled.
const MARKERS: [&str; 12] = [
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "<|call|>",
    "<|return|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<｜tool▁call▁end｜>",
    "<｜end▁of▁sentence｜>",
    "<|end_of_msg|>",
    "<|open|>",
];

fn load(family: &str) -> AnyTokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family);
    AnyTokenizer::from_dir(&dir).unwrap().unwrap()
}

/// The tokenizer's own decoding of `ids` (the `tokenizers` pipeline, or the tiktoken ranks), as
/// bytes; a `tokenizer.json` decodes to a `String`, so its partial characters are U+FFFD.
fn reference(tok: &AnyTokenizer, ids: &[u32]) -> Vec<u8> {
    match tok {
        AnyTokenizer::Tiktoken(t) => t.decode(ids).unwrap(),
        AnyTokenizer::Hf(t) => t.decode(ids, false).unwrap().into_bytes(),
    }
}

fn is_added(tok: &AnyTokenizer, id: u32) -> bool {
    match tok {
        AnyTokenizer::Tiktoken(t) => t.added_token(id).is_some(),
        AnyTokenizer::Hf(t) => t.is_added(id),
    }
}

/// The bytes `ids` spell in the table.
fn spelled(table: &[(Vec<u8>, bool)], ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|&id| table[usize::try_from(id).unwrap()].0.clone()).collect()
}

#[test]
fn every_token_spells_what_its_tokenizer_decodes_and_markers_are_flagged() {
    for family in FIXTURES {
        let tok = load(family);
        let table = tok.vocab_entries();
        let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned().into_bytes();
        // Tokens that are not whole characters: their bytes decide what a grammar sees.
        let mut partial = Vec::new();
        for (id, (bytes, added)) in table.iter().enumerate() {
            let id = u32::try_from(id).unwrap();
            assert_eq!(*added, is_added(&tok, id), "{family}: id {id} flagged wrongly");
            if bytes.is_empty() {
                continue;
            }
            assert_eq!(lossy(bytes), lossy(&reference(&tok, &[id])), "{family}: id {id}");
            if !*added && std::str::from_utf8(bytes).is_err() {
                partial.push(id);
            }
        }
        assert!(!partial.is_empty(), "{family}: a byte-level vocabulary has partial tokens");
        // A partial token followed by any other token decodes to the table's bytes: a table
        // built from lossy per-token text (U+FFFD) fails here.
        for &a in &partial {
            for (b, (bytes, added)) in table.iter().enumerate() {
                if *added || bytes.is_empty() {
                    continue;
                }
                let ids = [a, u32::try_from(b).unwrap()];
                assert_eq!(
                    lossy(&spelled(&table, &ids)),
                    lossy(&reference(&tok, &ids)),
                    "{family}"
                );
            }
        }
        // Every byte is one token's whole spelling, so any bytes can be spelled exactly.
        for byte in 0..=255u8 {
            let one = table.iter().any(|(b, added)| !added && b.as_slice() == [byte]);
            assert!(one, "{family}: no token for byte {byte:#04x}");
        }
        // Each format's markers that the tokenizer has as tokens are flagged added.
        for m in MARKERS {
            if let Some(id) = tok.added_id(m) {
                let (bytes, added) = &table[usize::try_from(id).unwrap()];
                assert!(added, "{family}: {m} not flagged");
                assert_eq!(bytes.as_slice(), m.as_bytes(), "{family}: {m}");
            }
        }
    }
}

#[test]
fn a_spelled_marker_in_ordinary_text_became_the_marker_token() {
    let text = format!("a｜b中文 🙂 é{}\"h\\i", MARKERS.join("x"));
    for family in FIXTURES {
        let tok = load(family);
        let table = tok.vocab_entries();
        let ids = tok.encode_plain(&text).unwrap();
        for &id in &ids {
            assert!(!table[usize::try_from(id).unwrap()].1, "{family}: added token {id} in text");
        }
        assert_eq!(spelled(&table, &ids), text.as_bytes(), "{family}");
        // One character at a time too (a grammar's literal may be one character).
        for c in text.chars() {
            let s = c.to_string();
            let ids = tok.encode_plain(&s).unwrap();
            assert_eq!(spelled(&table, &ids), s.as_bytes(), "{family}: {c:?}");
        }
    }
}
