//! The grammar engine glue ([`sluice_engine::constraint`]) on every fixture tokenizer kind,
//! driven without a model: at each step the mask is applied to a row of logits and a token the
//! mask allows is chosen by a policy that stands in for a model (shortest tokens first, longest
//! first, or a seeded pseudo-random choice), so a reply walks through every way of splitting a
//! string into tokens, partial UTF-8 characters included. The reply must spell the grammar's
//! text exactly, end with the end token only once complete, and leave the grammar engine without
//! an error.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{json, Value};
use sluice_engine::constraint::{Grammar, GrammarEnv};
use sluice_tokenizer::{AnyTokenizer, PromptFormat};
use std::path::PathBuf;
use std::sync::Arc;

#[path = "../../sluice-tokenizer/tests/common/tokenizer_kinds.rs"]
mod tokenizer_kinds;

/// Every tokenizer kind the fixtures have (shared with the tokenizer's `token_table.rs`).
const FIXTURES: [&str; 5] = tokenizer_kinds::TOKENIZER_FIXTURES;

/// A string with multi-byte characters (`｜` is EF BD 9C) and every family's markers spelled.
const MARKED: &str = "a｜b<｜tool▁call▁end｜>c</tool_call>d<|im_end|>e<|call|>f<|return|>\
                      g<|tool_call_end|>h<|end_of_msg|>i中文🙂é\"j\\k";

struct Vocab {
    env: GrammarEnv,
    tok: Arc<AnyTokenizer>,
    table: Vec<(Vec<u8>, bool)>,
}

fn vocab(family: &str) -> Vocab {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family);
    let fmt = PromptFormat::from_dir(&dir).unwrap().unwrap();
    let tok = fmt.shared_tokenizer();
    let env = GrammarEnv::new(Arc::clone(&tok), fmt.reply_end().unwrap()).unwrap();
    let table = tok.vocab_entries();
    Vocab { env, tok, table }
}

/// How the stand-in model chooses among the tokens the mask allows: a score per (step, id).
type Policy = fn(usize, u32, &[u8]) -> i64;

const POLICIES: [(&str, Policy); 3] = [
    ("shortest", |_, _, b| -i64::try_from(b.len()).unwrap()),
    ("longest", |_, _, b| i64::try_from(b.len()).unwrap()),
    ("hashed", |step, id, _| {
        let x = ((u64::try_from(step).unwrap() << 32) | u64::from(id))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        i64::try_from(x >> 33).unwrap()
    }),
];

/// One constrained reply: the bytes of the tokens before the end token.
fn reply(v: &Vocab, grammar: &Grammar, policy: Policy, what: &str) -> Vec<u8> {
    let mut c = v.env.compile(grammar).unwrap();
    let eos = v.env.eos();
    let mut out = Vec::new();
    for step in 0..2000 {
        // Two ids past the tokenizer, as a model that pads its embedding has.
        let mut logits = vec![0.0f32; v.table.len() + 2];
        c.mask(&mut logits);
        let allowed: Vec<u32> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .map(|i| u32::try_from(i).unwrap())
            .collect();
        assert!(!allowed.is_empty(), "{what}: nothing allowed after {:?}", lossy(&out));
        let ended = c.accepting();
        let id = *allowed
            .iter()
            .max_by_key(|&&id| {
                let b = v.table.get(usize::try_from(id).unwrap()).map_or(&[][..], |e| &e.0);
                (policy(step, id, b), std::cmp::Reverse(id))
            })
            .unwrap();
        if id == eos {
            assert!(ended, "{what}: the end token allowed inside {:?}", lossy(&out));
            assert_eq!(c.error(), None, "{what}");
            return out;
        }
        c.commit(id);
        assert_eq!(c.error(), None, "{what}: after {:?} then id {id}", lossy(&out));
        out.extend(v.tok.token_bytes(id).unwrap());
    }
    panic!("{what}: no end after 2000 tokens: {:?}", lossy(&out));
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// For every fixture tokenizer and policy, one reply to the JSON `grammar`, which must be valid
/// UTF-8 and JSON: `check` gets the vocabulary, the policy, a label, the text and its value.
fn each_reply(grammar: &Grammar, mut check: impl FnMut(&Vocab, Policy, &str, &str, Value)) {
    for family in FIXTURES {
        let v = vocab(family);
        for (name, policy) in POLICIES {
            let what = format!("{family}, {name}");
            let out = reply(&v, grammar, policy, &what);
            let text = String::from_utf8(out).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
            check(&v, policy, &what, &text, got);
        }
    }
}

fn compact(schema: Value) -> Value {
    let mut s = schema;
    s["x-guidance"] = json!({"whitespace_flexible": false});
    s
}

#[test]
fn a_non_ascii_const_string_emitted_invalid_utf8_and_let_the_end_marker_in() {
    let schema = compact(json!({"type": "object", "properties": {"s": {"const": MARKED}},
                                "required": ["s"], "additionalProperties": false}));
    let lark = format!("start: {} %json {}\n", Value::String("｜é→".into()), schema);
    each_reply(&Grammar::JsonSchema(schema), |v, policy, what, text, got| {
        assert_eq!(got, json!({"s": MARKED}), "{what}: {text}");

        // A grammar literal with multi-byte characters before the JSON.
        let out = reply(v, &Grammar::Lark(lark.clone()), policy, what);
        let text = String::from_utf8(out).unwrap_or_else(|e| panic!("{what}: {e}"));
        let rest = text.strip_prefix("｜é→").unwrap_or_else(|| panic!("{what}: {text}"));
        assert_eq!(serde_json::from_str::<Value>(rest).unwrap(), json!({"s": MARKED}));
    });
}

#[test]
fn free_json_strings_stay_valid_utf8_whatever_tokens_are_chosen() {
    let schema = compact(json!({"type": "object", "properties": {
        "s": {"type": "string", "minLength": 3, "maxLength": 12},
        "e": {"enum": ["｜", "中文", "<|im_end|>", "🙂"]}},
        "required": ["s", "e"], "additionalProperties": false}));
    each_reply(&Grammar::JsonSchema(schema), |_, _, what, text, got| {
        assert!(got["s"].as_str().unwrap().chars().count() >= 3, "{what}: {text}");
        assert!(got["e"].is_string(), "{what}: {text}");
    });
}
