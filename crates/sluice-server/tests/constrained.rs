//! Constrained output on the tiny K3 fixture through `run_turn`, with the grammars the server
//! builds ([`sluice_server::constrain`]): the reply always parses — JSON content valid against
//! its schema (a property test over generated schemas, checked with the `jsonschema` crate, on
//! K3 and on the Qwen3-MoE template family; their strings hold multi-byte characters and spelled
//! markers), or tool calls to the declared tools — and
//! speculative decoding changes nothing: with n-gram drafts the constrained tokens are
//! identical to plain decoding's, greedy and sampled.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_checkpoint::Checkpoint;
use sluice_engine::constraint::SharedConstraint;
use sluice_engine::turn::{run_turn, Turn, TurnOptions};
use sluice_engine::{Drafter, NgramDrafter, Sampling};
use sluice_models::Model;
use sluice_server::constrain::{Grammars, OutputConstraint};
use sluice_tokenizer::k3_output::{K3OutputParser, OutputEvent};
use sluice_tokenizer::{
    render_k3, ChatMessage, ChatOptions, PromptFormat, Reasoning, Role, Tokenizer,
};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

struct Fixture {
    model: Model,
    tok: Arc<Tokenizer>,
    fmt: PromptFormat,
    grammars: Grammars,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
        let model = sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap();
        let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
        let fmt = PromptFormat::from_dir(&dir).unwrap().unwrap();
        Fixture { model, tok, fmt, grammars: Grammars::default() }
    })
}

fn prompt(f: &Fixture, thinking: bool) -> Vec<u32> {
    let msgs = [ChatMessage::new(Role::User, "Reply with the record, please.".to_owned())];
    let opts = ChatOptions { thinking, ..ChatOptions::default() };
    render_k3(&f.tok, &msgs, &opts).unwrap()
}

/// One constrained turn; the reply's ids.
fn generate(c: &OutputConstraint, thinking: bool, sampling: Sampling, ngram: bool) -> Turn {
    let f = fixture();
    let reasoning = if thinking { Reasoning::Open } else { Reasoning::Off };
    let constraint: SharedConstraint = f.grammars.compile(&f.fmt, c, reasoning).unwrap();
    let opts = TurnOptions {
        stop_ids: vec![sluice_tokenizer::k3_stop_id(&f.tok).unwrap()],
        sampling,
        draft_max: 4,
        constraint: Some(constraint),
        ..TurnOptions::greedy(400)
    };
    let mut d = NgramDrafter::default();
    let drafter: Option<&mut dyn Drafter> = if ngram { Some(&mut d) } else { None };
    let p = prompt(f, thinking);
    run_turn(&f.model, None, &p, &opts, drafter, &|| false, &mut |_, _| true).unwrap()
}

/// The reply's content and tool calls (name, arguments), as the server parses them.
fn parse(ids: &[u32], thinking: bool, tools: bool) -> (String, Vec<(String, String)>) {
    let mut p = K3OutputParser::new(&fixture().tok, thinking, tools).unwrap();
    let (mut content, mut calls) = (String::new(), Vec::new());
    for e in p.parse_all(ids) {
        match e {
            OutputEvent::Content(t) => content.push_str(&t),
            OutputEvent::ToolCall(c) => calls.push((c.name, c.arguments)),
            OutputEvent::Reasoning(_) => {}
        }
    }
    (content, calls)
}

fn json_constraint(schema: Value) -> OutputConstraint {
    OutputConstraint::Json { schema, param: "response_format" }
}

#[test]
fn constrained_output_is_identical_with_and_without_drafts() {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
        "required": ["name", "n", "tags"], "additionalProperties": false});
    let tools = OutputConstraint::Tools {
        tools: vec![
            (
                "lookup".into(),
                json!({"type": "object", "properties": {"q": {"type": "string", "maxLength": 8}}, "required": ["q"], "additionalProperties": false}),
            ),
            (
                "count".into(),
                json!({"type": "object", "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["k"], "additionalProperties": false}),
            ),
        ],
        parallel: true,
        param: "tool_choice",
    };
    let sampled = Sampling { temperature: 0.9, top_k: 0, top_p: 1.0, seed: 7 };
    for (c, is_tools) in [(json_constraint(schema.clone()), false), (tools, true)] {
        for sampling in [Sampling::greedy(), sampled] {
            let plain = generate(&c, false, sampling, false);
            let drafted = generate(&c, false, sampling, true);
            assert_eq!(plain.tokens, drafted.tokens, "drafts changed constrained output");
            assert_eq!(plain.stats.finish_reason, "stop", "the grammar ended the reply");
            let (content, calls) = parse(&plain.tokens, false, is_tools);
            if is_tools {
                assert!(!calls.is_empty(), "a required tool call was made");
                for (name, args) in calls {
                    assert!(name == "lookup" || name == "count", "{name}");
                    let v: Value = serde_json::from_str(&args).unwrap();
                    assert!(v.is_object(), "{args}");
                }
            } else {
                let v: Value = serde_json::from_str(&content).unwrap();
                assert!(jsonschema::is_valid(&schema, &v), "{content}");
            }
        }
    }
}

#[test]
fn a_thinking_reply_reasons_then_answers_in_the_schema() {
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    let t = generate(&json_constraint(schema.clone()), true, Sampling::greedy(), false);
    if t.stats.finish_reason == "stop" {
        let (content, _) = parse(&t.tokens, true, false);
        let v: Value = serde_json::from_str(&content).unwrap();
        assert!(jsonschema::is_valid(&schema, &v), "{content}");
    } else {
        // The think channel is free text: a small random model may reason until max_tokens.
        assert_eq!(t.stats.finish_reason, "length");
    }
}

#[test]
fn a_schema_the_engine_cannot_compile_is_refused_naming_the_construct() {
    let f = fixture();
    let c = json_constraint(json!({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}));
    let e = f.grammars.compile(&f.fmt, &c, Reasoning::Off).expect_err("dangling $ref");
    let body = e.body();
    assert_eq!(body["error"]["param"], json!("response_format"));
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("nope"), "{msg}");
}

/// The Qwen3-MoE fixture: a template family, parsed on decoded text.
struct Template {
    model: Model,
    fmt: PromptFormat,
    grammars: Grammars,
}

fn qwen3() -> &'static Template {
    static F: OnceLock<Template> = OnceLock::new();
    F.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe/tiny-a");
        let model = sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap();
        let fmt = PromptFormat::from_dir(&dir).unwrap().unwrap();
        Template { model, fmt, grammars: Grammars::default() }
    })
}

/// One constrained Qwen3-MoE turn with thinking off: the reply's finish reason and content,
/// parsed by the format's own parser.
fn qwen3_json(schema: &Value, sampling: Sampling) -> (String, String) {
    let f = qwen3();
    let msgs = [ChatMessage::new(Role::User, "Reply with the record, please.".to_owned())];
    let opts = ChatOptions { thinking: false, thinking_explicit: true, ..ChatOptions::default() };
    let r = f.fmt.render_chat(&msgs, &opts).unwrap();
    let c = f.grammars.compile(&f.fmt, &json_constraint(schema.clone()), r.reasoning).unwrap();
    let opts = TurnOptions {
        stop_ids: f.fmt.stop_ids().to_vec(),
        sampling,
        draft_max: 4,
        constraint: Some(c),
        ..TurnOptions::greedy(400)
    };
    let t = run_turn(&f.model, None, &r.ids, &opts, None, &|| false, &mut |_, _| true).unwrap();
    let mut p = f.fmt.output_parser(r.reasoning_open, false).unwrap();
    let mut content = String::new();
    for e in p.parse_all(&t.tokens) {
        if let OutputEvent::Content(c) = e {
            content.push_str(&c);
        }
    }
    (t.stats.finish_reason, content)
}

/// A JSON schema of bounded size: objects of scalar, enum, bounded-string, bounded-array and
/// nested-object properties, every property required and nothing else allowed, so every
/// generated reply ends well within `max_new`.
fn schema_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "boolean"})),
        (0i64..50, 50i64..5000)
            .prop_map(|(lo, hi)| json!({"type": "integer", "minimum": lo, "maximum": hi})),
        (0usize..3, 3usize..8)
            .prop_map(|(lo, hi)| json!({"type": "string", "minLength": lo, "maxLength": hi})),
        prop::collection::vec(text(), 1..4).prop_map(|v| json!({"enum": v})),
        text().prop_map(|s| json!({"const": s})),
        Just(json!({"type": "null"})),
    ];
    let value = leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            (inner.clone(), 0usize..3)
                .prop_map(|(items, n)| json!({"type": "array", "items": items, "maxItems": n})),
            prop::collection::btree_map("[a-z]{1,6}", inner, 1..3).prop_map(object),
        ]
    });
    prop::collection::btree_map("[a-z]{1,6}", value, 1..4).prop_map(object)
}

/// A string for `enum` and `const`: letters, multi-byte characters (`｜` is EF BD 9C, split
/// over tokens by a byte-level vocabulary), quotes and backslashes, and every family's markers
/// spelled as text.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z]{1,4}",
        "[｜é中文🙂▁→]{1,3}",
        Just("\"\\".to_owned()),
        prop::sample::select(vec![
            "<|im_end|>",
            "</tool_call>",
            "<|end_of_msg|>",
            "<|close|>",
            "<｜tool▁call▁end｜>",
            "<|tool_call_end|>",
            "<|call|>",
            "</think>",
        ])
        .prop_map(str::to_owned),
    ];
    prop::collection::vec(piece, 1..4).prop_map(|p| p.concat())
}

fn object(props: std::collections::BTreeMap<String, Value>) -> Value {
    let required: Vec<&String> = props.keys().collect();
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn constrained_output_always_parses_and_validates(schema in schema_strategy(), seed in any::<u64>()) {
        let sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed };
        let t = generate(&json_constraint(schema.clone()), false, sampling, false);
        prop_assert_eq!(t.stats.finish_reason.as_str(), "stop");
        let (content, _) = parse(&t.tokens, false, false);
        let v: Value = serde_json::from_str(&content).map_err(|e| TestCaseError::fail(format!("{e}: {content}")))?;
        prop_assert!(jsonschema::is_valid(&schema, &v), "{} does not validate against {}", content, schema);
    }

    #[test]
    fn qwen3_constrained_output_always_parses_and_validates(schema in schema_strategy(), seed in any::<u64>()) {
        let sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed };
        let (finish, content) = qwen3_json(&schema, sampling);
        prop_assert_eq!(finish.as_str(), "stop");
        let v: Value = serde_json::from_str(&content).map_err(|e| TestCaseError::fail(format!("{e}: {content}")))?;
        prop_assert!(jsonschema::is_valid(&schema, &v), "{} does not validate against {}", content, schema);
    }
}
