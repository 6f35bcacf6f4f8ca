//! Byte-exact agreement with Python tiktoken 0.14 (tests/fixtures/tokenizer/encode_goldens.json,
//! written by tools/gen_tokenizer_goldens.py over a 3,256-rank vocabulary it trains).
//!
//! Every case checks three things: `CoreBpe::encode_ordinary` equals plain tiktoken on the whole
//! string; `Tokenizer::encode_ordinary` equals tiktoken applied to `tokenization_kimi.py`'s
//! 400,000/25,000-character pieces (which differs from plain tiktoken only for long runs); and
//! decoding (whole and streamed) gives the text back.

mod common;

use common::{assert_ids, fixture_tokenizer, read_json};
use serde_json::Value;
use sluice_tokenizer::pretokenize::{kimi_chunks, python_isspace, K3_PATTERN};

/// The case's text: `text`, or `parts` = [[string, repeat], ...] for long inputs.
fn case_text(case: &Value) -> String {
    if let Some(text) = case["text"].as_str() {
        return text.to_owned();
    }
    let mut out = String::new();
    for part in case["parts"].as_array().expect("text or parts") {
        let s = part[0].as_str().expect("part string");
        let n = usize::try_from(part[1].as_u64().expect("part count")).expect("count fits");
        out.push_str(&s.repeat(n));
    }
    out
}

#[test]
fn fixture_matches_this_crate_pattern_and_layout() {
    let golden = read_json("encode_goldens.json");
    assert_eq!(golden["pattern"].as_str(), Some(K3_PATTERN));
    let tok = fixture_tokenizer();
    let n = u32::try_from(golden["num_ranks"].as_u64().expect("num_ranks")).expect("fits");
    assert_eq!(tok.num_ranks(), 3256);
    assert_eq!(tok.num_ranks(), usize::try_from(n).expect("fits"));
    assert_eq!(tok.vocab_size(), tok.num_ranks() + 256);
    let expected = [
        (0, "[BOS]"),
        (1, "[EOS]"),
        (2, "<|end_of_msg|>"),
        (3, "<|open|>"),
        (4, "<|close|>"),
        (5, "<|sep|>"),
        (6, "[start_header_id]"),
        (7, "[end_header_id]"),
        (9, "[EOT]"),
        (18, "<|media_begin|>"),
        (19, "<|media_content|>"),
        (20, "<|media_end|>"),
        (21, "<|media_pad|>"),
        (8, "<|reserved_token_8|>"),
        (253, "<|reserved_token_253|>"),
        (254, "[UNK]"),
        (255, "[PAD]"),
    ];
    for (offset, spelling) in expected {
        assert_eq!(tok.special_id(spelling), Some(n + offset), "{spelling}");
        assert!(tok.is_special(n + offset));
        assert_eq!(tok.decode(&[n + offset]).expect("special decodes"), spelling.as_bytes());
    }
    assert!(!tok.is_special(n - 1));
    assert!(!tok.is_special(n + 256));
    assert_eq!(tok.special_id("<|not_a_token|>"), None);
}

#[test]
fn python_isspace_matches_python_on_every_scalar_value() {
    let golden = read_json("encode_goldens.json");
    let ranges: Vec<(u32, u32)> = golden["python_isspace"]
        .as_array()
        .expect("ranges")
        .iter()
        .map(|r| {
            let lo = r[0].as_u64().and_then(|v| u32::try_from(v).ok()).expect("lo");
            let hi = r[1].as_u64().and_then(|v| u32::try_from(v).ok()).expect("hi");
            (lo, hi)
        })
        .collect();
    for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
        let want = ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&u32::from(c)));
        assert_eq!(python_isspace(c), want, "U+{:04X}", u32::from(c));
    }
}

#[test]
fn encodings_equal_python_tiktoken() {
    let golden = read_json("encode_goldens.json");
    let tok = fixture_tokenizer();
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut split_cases = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let text = case_text(case);
        let plain = tok.bpe().encode_ordinary(&text);
        assert_ids(&plain, &case["ids"], &format!("{name} (plain tiktoken)"));
        let kimi = tok.encode_ordinary(&text);
        let kimi_want =
            if case.get("kimi_ids").is_some() { &case["kimi_ids"] } else { &case["ids"] };
        assert_ids(&kimi, kimi_want, &format!("{name} (Kimi split)"));
        if case.get("kimi_ids").is_some() {
            split_cases += 1;
            assert_ne!(plain, kimi, "{name}: the split should matter here");
        }
        assert_eq!(tok.decode(&plain).expect("decode"), text.as_bytes(), "{name}");
        assert_eq!(tok.decode(&kimi).expect("decode"), text.as_bytes(), "{name}");
    }
    assert!(split_cases >= 3, "cases where Kimi's split changes ids: {split_cases}");
}

#[test]
fn kimi_split_matches_python_piece_lengths() {
    let golden = read_json("encode_goldens.json");
    for case in golden["cases"].as_array().expect("cases") {
        let text = case_text(case);
        let got: Vec<u64> = kimi_chunks(&text).iter().map(|p| p.chars().count() as u64).collect();
        match case.get("kimi_chunks") {
            Some(want) => {
                let want: Vec<u64> =
                    want.as_array().expect("lengths").iter().filter_map(Value::as_u64).collect();
                assert_eq!(got, want, "{}", case["name"]);
            }
            None if text.is_empty() => assert!(got.is_empty()),
            None => assert_eq!(got.len(), 1, "{}", case["name"]),
        }
    }
}

#[test]
fn streamed_decoding_reassembles_every_case() {
    let golden = read_json("encode_goldens.json");
    let tok = fixture_tokenizer();
    let mut split_chars = 0usize;
    for case in golden["cases"].as_array().expect("cases") {
        let text = case_text(case);
        let ids = tok.encode_ordinary(&text);
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            let piece = dec.push(id).expect("known id");
            split_chars += usize::from(piece.is_empty() && dec.pending_len() > 0);
            out.push_str(&piece);
        }
        assert_eq!(dec.pending_len(), 0, "{}", case["name"]);
        out.push_str(&dec.finish());
        assert_eq!(out, text, "{}", case["name"]);
    }
    // The vocabulary has tokens that end inside a character, so buffering was exercised.
    assert!(split_chars > 100, "{split_chars}");
}

#[test]
fn special_spellings_are_ordinary_text() {
    let tok = fixture_tokenizer();
    for text in ["<|open|>", "[BOS]", "<|end_of_msg|>", "x<|sep|>y", "<|reserved_token_42|>"] {
        let ids = tok.encode_ordinary(text);
        assert!(ids.iter().all(|&id| !tok.is_special(id)), "{text}: {ids:?}");
        assert!(ids.iter().all(|&id| usize::try_from(id).is_ok_and(|i| i < tok.num_ranks())));
        assert_eq!(tok.decode(&ids).expect("decode"), text.as_bytes());
    }
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = fixture_tokenizer();
    let vocab = u32::try_from(tok.vocab_size()).expect("fits");
    for id in [vocab, vocab + 1, u32::MAX] {
        assert!(tok.decode(&[1, id]).is_err());
        assert!(tok.decode_lossy(&[id]).is_err());
        assert!(tok.token_bytes(id).is_err());
        assert!(!tok.is_special(id));
    }
    assert_eq!(tok.decode_lossy(&[0xE4, u32::from(b'a')]).expect("in range"), "\u{FFFD}a");
}

/// The tiny K3 checkpoint of tools/gen_k3_goldens.py ships its own tokenizer and tiktoken
/// encodings; they must agree too. Its last case was encoded with `allowed_special="all"`, which
/// sluice never does to text: here the trusted marker spellings are cut out and inserted by id.
#[test]
fn tiny_k3_checkpoint_tokenizer_agrees() {
    let root = common::fixture_dir().join("../kimi_k3");
    let Ok(text) = std::fs::read_to_string(root.join("tokenizer_golden.json")) else {
        eprintln!("skipped: {} has no tokenizer goldens", root.display());
        return;
    };
    let golden: Value = serde_json::from_str(&text).expect("json");
    let tok = sluice_tokenizer::Tokenizer::from_dir(root.join("tiny-a")).expect("tiny-a tokenizer");
    for case in golden["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want = common::ids(&case["ids"]);
        let got = if case.get("allowed_special").is_some() {
            encode_trusted(&tok, text)
        } else {
            tok.encode_ordinary(text)
        };
        assert_eq!(got, want, "{text}");
    }
}

/// Encodes trusted text in which the four XTML marker spellings are special tokens.
fn encode_trusted(tok: &sluice_tokenizer::Tokenizer, mut text: &str) -> Vec<u32> {
    let markers = sluice_tokenizer::Marker::ALL.map(|m| m.spelling());
    let mut out = Vec::new();
    while !text.is_empty() {
        let next = markers.iter().filter_map(|m| text.find(m).map(|at| (at, *m))).min();
        let Some((at, marker)) = next else {
            out.extend(tok.encode_ordinary(text));
            break;
        };
        out.extend(tok.encode_ordinary(&text[..at]));
        out.push(tok.special_id(marker).expect("marker"));
        text = &text[at + marker.len()..];
    }
    out
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<sluice_tokenizer::Tokenizer>();
}

#[test]
fn lookahead_rewrite_splits_every_golden_like_fancy_regex() {
    let golden = read_json("encode_goldens.json");
    let ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let path = std::path::Path::new("bytes");
    let fast = sluice_tokenizer::CoreBpe::new(ranks.clone(), K3_PATTERN, path).expect("vocab");
    let slow = sluice_tokenizer::CoreBpe::new_unoptimized(ranks, K3_PATTERN, path).expect("vocab");
    for case in golden["cases"].as_array().expect("cases") {
        let text = case_text(case);
        assert_eq!(fast.pieces(&text), slow.pieces(&text), "{}", case["name"]);
    }
}
