//! `HfTokenizer` against Python `tokenizers`: the Qwen3-shaped `tokenizer.json` of each
//! `tests/fixtures/qwen3` fixture (the tiny random ones and the trained mini-draft) encodes and decodes every recorded string exactly as Python did
//! (`tokenizer_cases` in `golden.json`, written by `tools/gen_qwen3_goldens.py`).
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use serde_json::Value;
use sluice_tokenizer::{HfError, HfTokenizer};
use std::path::PathBuf;

const FIXTURES: [&str; 3] = ["tiny-a", "tiny-b", "mini-draft"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3").join(name)
}

fn golden(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("golden.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| u32::try_from(x.as_u64().unwrap()).unwrap()).collect()
}

#[test]
fn encode_and_decode_match_python_tokenizers() {
    for name in FIXTURES {
        let tok = HfTokenizer::from_dir(fixture(name)).expect("tokenizer.json loads");
        let g = golden(name);
        assert_eq!(tok.vocab_size() as u64, g["tokenizer_vocab_size"].as_u64().unwrap());
        let cases = g["tokenizer_cases"].as_array().unwrap();
        assert!(cases.len() >= 30, "{name}: only {} cases", cases.len());
        for case in cases {
            let case_name = case["name"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let got = tok.encode(text, true).unwrap();
            assert_eq!(got, want, "{name}/{case_name}: ids of {text:?}");
            let decoded = tok.decode(&want, false).unwrap();
            assert_eq!(decoded, case["decoded"].as_str().unwrap(), "{name}/{case_name}: decode");
            let skipped = tok.decode(&want, true).unwrap();
            assert_eq!(
                skipped,
                case["decoded_skip_special"].as_str().unwrap(),
                "{name}/{case_name}: decode skipping specials"
            );
        }
    }
}

#[test]
fn qwen_markers_are_single_ids() {
    let tok = HfTokenizer::from_dir(fixture("tiny-a")).unwrap();
    let start = tok.token_to_id("<|im_start|>").unwrap();
    let end = tok.token_to_id("<|im_end|>").unwrap();
    let think = tok.token_to_id("<think>").unwrap();
    assert!(tok.is_special(start) && tok.is_special(end));
    assert!(!tok.is_special(think), "<think> is a plain added token in Qwen3");
    let got = tok.encode("<|im_start|>user\nhi<|im_end|>", true).unwrap();
    assert_eq!(got.first(), Some(&start));
    assert_eq!(got.last(), Some(&end));
    assert_eq!(tok.id_to_token(end).as_deref(), Some("<|im_end|>"));
    // Decoding skips the specials but keeps <think>.
    let ids = tok.encode("<think>x</think><|im_end|>", true).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "<think>x</think>");
}

#[test]
fn round_trip_of_arbitrary_text() {
    let tok = HfTokenizer::from_dir(fixture("tiny-b")).unwrap();
    for text in ["", " ", "a\u{0}b", "tab\tnew\nline\r\n", "💡 ünïcödé ĳ 中文", "    x  "]
    {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "round trip of {text:?}");
    }
}

#[test]
fn errors_name_the_cause() {
    let tok = HfTokenizer::from_dir(fixture("tiny-b")).unwrap();
    let v = u32::try_from(tok.vocab_size()).unwrap();
    let e = tok.decode(&[1, v], false).unwrap_err();
    assert!(matches!(e, HfError::UnknownId { id, .. } if id == v), "{e}");

    let e = HfTokenizer::from_dir("/nonexistent/dir").unwrap_err();
    assert!(matches!(e, HfError::Io { .. }) && e.to_string().contains("tokenizer.json"), "{e}");

    let e = HfTokenizer::from_bytes(b"{\"version\": \"1.0\"}", "bad/tokenizer.json").unwrap_err();
    assert!(matches!(e, HfError::Parse { .. }) && e.to_string().contains("bad/tokenizer.json"));
    let e = HfTokenizer::from_bytes(b"\xff\xfe", "bin/tokenizer.json").unwrap_err();
    assert!(e.to_string().contains("bin/tokenizer.json"), "{e}");
}

#[test]
fn token_bytes_concatenate_to_the_text_even_across_split_characters() {
    for name in FIXTURES {
        let tok = HfTokenizer::from_dir(fixture(name)).unwrap();
        let g = golden(name);
        let mut split_chars = 0;
        for case in g["tokenizer_cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let mut bytes = Vec::new();
            for &id in &want {
                let b = tok.token_bytes(id).unwrap();
                split_chars += usize::from(std::str::from_utf8(&b).is_err());
                bytes.extend_from_slice(&b);
            }
            // The fixture tokenizer has an NFC normalizer: compare with the decoded text, which
            // equals the normalized input.
            let decoded = case["decoded"].as_str().unwrap();
            assert_eq!(bytes, decoded.as_bytes(), "{name}: bytes of {text:?}");
        }
        assert!(split_chars > 0, "{name}: some case splits a character between tokens");
        assert!(matches!(tok.token_bytes(100_000), Err(HfError::UnknownId { .. })));
    }
}
