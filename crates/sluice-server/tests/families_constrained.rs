//! Constrained output for every template family's chat format, over real HTTP against the
//! committed tiny checkpoints (Qwen3-MoE, GPT-OSS's harmony, DeepSeek with R1's template, Kimi
//! K2's tiktoken model and template), through both APIs: a `json_schema` reply's content parses
//! and validates against its schema (checked with the `jsonschema` crate), a named
//! `tool_choice` gives exactly one call to that tool with arguments valid against its
//! parameters, `required` gives calls to declared tools only, n-gram drafts change no token of a
//! constrained reply, and a schema the grammar engine cannot compile is a 400 naming the
//! construct. The replies are parsed by the server's own parsers, so a pass here means the
//! grammar spells exactly what each format's parser reads.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, root, Server};
use serde_json::{json, Value};

/// The fixtures (directories under tests/fixtures), shared with the other family test.
const FAMILIES: [&str; 4] = common::FAMILY_FIXTURES;

/// The fixture directory; Qwen3-MoE's as a copy whose context is 2048 instead of 512, so a
/// prompt that declares tools leaves room for the reply (the tiny tokenizer spells about one
/// token per character; a random model runs at any position).
fn fixture(family: &str) -> (std::path::PathBuf, Option<tempfile::TempDir>) {
    let dir = root().join("tests/fixtures").join(family);
    if !family.starts_with("qwen3_moe") {
        return (dir, None);
    }
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let config = tmp.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(2048);
    std::fs::write(&config, c.to_string()).unwrap();
    (tmp.path().to_path_buf(), Some(tmp))
}

/// A server of `family` (and the copy it serves, kept while it runs).
fn start(family: &str, draft: &str) -> (Server, Option<tempfile::TempDir>) {
    let (dir, tmp) = fixture(family);
    let server = Server::start(&[
        "--model",
        &dir.display().to_string(),
        "--queue",
        "0",
        "--model-name",
        "m",
        "--draft",
        draft,
        "--draft-max",
        "4",
        "--context",
        "2048",
    ]);
    (server, tmp)
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"}},
        "required": ["name", "n", "ok"], "additionalProperties": false})
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
            "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
            "additionalProperties": false}}},
        {"type": "function", "function": {"name": "count", "description": "Count.",
            "parameters": {"type": "object",
            "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["k"],
            "additionalProperties": false}}},
    ])
}

/// A chat request with thinking off (a random model's free reasoning may not end within
/// `max_tokens`; R1's template opens the think block whatever the request says).
fn chat(extra: &Value) -> Value {
    let mut req = json!({"model": "m", "max_tokens": 160, "temperature": 0,
        "messages": [{"role": "user", "content": "Give me the record."}],
        "reasoning_effort": "none"});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    req
}

fn ok(server: &Server, path: &str, req: &Value, family: &str) -> Value {
    let r = post(server.addr, path, req);
    assert_eq!(r.status, 200, "{family}: {}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Whether the reply ended by itself (the grammar completed) rather than at `max_tokens`: a
/// think block opened by the prompt is free text a random model may not close in time.
fn finished(body: &Value, family: &str) -> bool {
    let reason = body["choices"][0]["finish_reason"].as_str().unwrap_or("");
    if reason == "length" {
        assert!(family.starts_with("deepseek_v3/tiny-a"), "{family}: only R1 reasons: {body}");
        return false;
    }
    true
}

fn tool_schema(name: &str) -> Value {
    let t = tools();
    let t = t.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap();
    t["function"]["parameters"].clone()
}

#[test]
fn constrained_replies_parse_in_every_family_and_drafts_change_nothing() {
    for family in FAMILIES {
        let (plain, _a) = start(family, "none");
        let (spec, _b) = start(family, "ngram");
        let mut drafted = 0;

        // response_format json_schema: the content is JSON valid against the schema.
        let rf = json!({"type": "json_schema", "json_schema": {"name": "r", "schema": schema()}});
        let req = chat(&json!({"response_format": rf}));
        let body = ok(&plain, "/v1/chat/completions", &req, family);
        let same = ok(&spec, "/v1/chat/completions", &req, family);
        assert_eq!(same["sluice"]["generated_ids"], body["sluice"]["generated_ids"], "{family}");
        drafted += same["sluice"]["drafted"].as_u64().unwrap();
        if finished(&body, family) {
            let content = body["choices"][0]["message"]["content"].as_str().unwrap();
            let v: Value =
                serde_json::from_str(content).unwrap_or_else(|e| panic!("{family}: {e}: {body}"));
            assert!(jsonschema::is_valid(&schema(), &v), "{family}: {content}");
            assert_eq!(body["choices"][0]["finish_reason"], "stop", "{family}");
        }

        // json_object, sampled: still one JSON object.
        let req = chat(&json!({"response_format": {"type": "json_object"}, "temperature": 1.0,
                              "seed": 11, "max_tokens": 60}));
        let body = ok(&plain, "/v1/chat/completions", &req, family);
        let same = ok(&spec, "/v1/chat/completions", &req, family);
        assert_eq!(same["sluice"]["generated_ids"], body["sluice"]["generated_ids"], "{family}");
        drafted += same["sluice"]["drafted"].as_u64().unwrap();

        // A named tool: exactly one call to it, with valid arguments.
        let named = json!({"type": "function", "function": {"name": "count"}});
        let req = chat(&json!({"tools": tools(), "tool_choice": named}));
        let body = ok(&plain, "/v1/chat/completions", &req, family);
        let same = ok(&spec, "/v1/chat/completions", &req, family);
        assert_eq!(same["sluice"]["generated_ids"], body["sluice"]["generated_ids"], "{family}");
        drafted += same["sluice"]["drafted"].as_u64().unwrap();
        if finished(&body, family) {
            let calls = body["choices"][0]["message"]["tool_calls"].as_array().cloned();
            let calls = calls.unwrap_or_else(|| panic!("{family}: no calls: {body}"));
            assert_eq!(calls.len(), 1, "{family}: {body}");
            assert_eq!(calls[0]["function"]["name"], "count", "{family}");
            let args: Value =
                serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(jsonschema::is_valid(&tool_schema("count"), &args), "{family}: {args}");
            assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{family}");
        }

        // required: calls to declared tools only. The model may go on calling until
        // `max_tokens` (parallel calls are allowed); the calls it completed are returned.
        let req = chat(&json!({"tools": tools(), "tool_choice": "required"}));
        let body = ok(&plain, "/v1/chat/completions", &req, family);
        let calls = body["choices"][0]["message"]["tool_calls"].as_array().cloned();
        let calls = calls.unwrap_or_default();
        let r1 = family == "deepseek_v3/tiny-a";
        assert!(r1 || !calls.is_empty(), "{family}: no calls: {body}");
        {
            for c in calls {
                let name = c["function"]["name"].as_str().unwrap();
                let args: Value =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                assert!(jsonschema::is_valid(&tool_schema(name), &args), "{family}: {args}");
            }
        }

        // Anthropic: output_config.format and tool_choice tool.
        let a = json!({"model": "m", "max_tokens": 160, "temperature": 0,
            "messages": [{"role": "user", "content": "Give me the record."}],
            "output_config": {"format": {"type": "json_schema", "schema": schema()}}});
        let body = ok(&plain, "/v1/messages", &a, family);
        if body["stop_reason"] != "max_tokens" {
            let text = body["content"].as_array().unwrap().iter().find(|b| b["type"] == "text");
            let text = text.unwrap_or_else(|| panic!("{family}: {body}"))["text"].as_str().unwrap();
            let v: Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{family}: {e}: {body}"));
            assert!(jsonschema::is_valid(&schema(), &v), "{family}: {text}");
        }
        let anthropic_tools = json!([{"name": "count", "description": "Count.",
                                      "input_schema": tool_schema("count")}]);
        let a = json!({"model": "m", "max_tokens": 160, "temperature": 0,
            "messages": [{"role": "user", "content": "Count."}], "tools": anthropic_tools,
            "tool_choice": {"type": "tool", "name": "count"}});
        let body = ok(&plain, "/v1/messages", &a, family);
        if body["stop_reason"] != "max_tokens" {
            let uses: Vec<&Value> = body["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .collect();
            assert_eq!(uses.len(), 1, "{family}: {body}");
            assert_eq!(uses[0]["name"], "count", "{family}");
            assert!(jsonschema::is_valid(&tool_schema("count"), &uses[0]["input"]), "{family}");
            assert_eq!(body["stop_reason"], "tool_use", "{family}");
        }
        assert!(drafted > 0, "{family}: the n-gram drafter never drafted, so nothing was compared");
    }
}

#[test]
fn a_schema_the_engine_cannot_compile_is_refused_naming_the_construct_in_every_family() {
    for family in FAMILIES {
        let (server, _tmp) = start(family, "none");
        let bad = json!({"type": "object", "properties": {"a": {"$ref": "#/nope"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "r", "schema": bad}});
        let r = post(server.addr, "/v1/chat/completions", &chat(&json!({"response_format": rf})));
        assert_eq!(r.status, 400, "{family}: {}", String::from_utf8_lossy(&r.body));
        let body = r.json();
        assert_eq!(body["error"]["param"], "response_format", "{family}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains("nope"), "{family}: {msg}");
        // The server keeps serving.
        let rf = json!({"type": "json_object"});
        ok(&server, "/v1/chat/completions", &chat(&json!({"response_format": rf})), family);
    }
}

/// A constrained call whose argument value spells every family's call and turn markers (as
/// ordinary tokens: the grammar keeps added tokens out of JSON strings), with a quote and a
/// backslash: the parsers read the call as JSON, so it comes back whole, streamed and not.
#[test]
fn a_marker_inside_a_constrained_arguments_string_cut_the_call_short() {
    let marked = "a</tool_call>b<|tool_call_end|>c<|tool_calls_section_end|>d<｜tool▁call▁end｜>\
                  e<|call|>f<|im_end|>g\"h\\i";
    let tools = json!([{"type": "function", "function": {"name": "echo", "description": "Echo.",
        "parameters": {"type": "object", "properties": {"s": {"const": marked}},
                       "required": ["s"], "additionalProperties": false}}}]);
    let named = json!({"type": "function", "function": {"name": "echo"}});
    for family in FAMILIES {
        let (server, _tmp) = start(family, "none");
        let req = chat(&json!({"tools": tools, "tool_choice": named, "max_tokens": 400}));
        let body = ok(&server, "/v1/chat/completions", &req, family);
        if !finished(&body, family) {
            continue;
        }
        let calls = body["choices"][0]["message"]["tool_calls"].as_array().cloned();
        let calls = calls.unwrap_or_else(|| panic!("{family}: no calls: {body}"));
        assert_eq!(calls.len(), 1, "{family}: {body}");
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        let args: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{family}: {e}"));
        assert_eq!(args, json!({"s": marked}), "{family}");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{family}");

        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let s = post(server.addr, "/v1/chat/completions", &sreq);
        assert_eq!(s.status, 200, "{family}");
        let mut streamed = Vec::new();
        for data in s.sse_data().into_iter().filter(|d| d != "[DONE]") {
            let v: Value = serde_json::from_str(&data).unwrap();
            let delta = &v["choices"][0]["delta"];
            streamed.extend(delta["tool_calls"].as_array().cloned().unwrap_or_default());
        }
        assert_eq!(streamed.len(), 1, "{family}: {streamed:?}");
        let sargs = streamed[0]["function"]["arguments"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(sargs).unwrap(), args, "{family}: streamed");
    }
}
