//! `sluice serve` for every family's chat format, over real HTTP against the committed tiny
//! checkpoints (Qwen3-MoE, GPT-OSS, DeepSeek with R1's template, Kimi K2's tiktoken model and
//! template): the server renders prompts with the checkpoint's own template (the ids equal
//! `PromptFormat`'s rendering, itself proven against transformers' `apply_chat_template`),
//! streams what it collects, keeps tool-call history and tool results, answers the Anthropic
//! endpoint and reuses state between turns (constrained output: `families_constrained.rs`).
//!
//! The tiny models are random, so their replies are gibberish: the prompt is checked by ids
//! (the chat reply's generated ids equal those of `/v1/completions` given the expected prompt
//! ids, greedy), the reply's parsing by the parser units in sluice-tokenizer.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, root, Server};
use serde_json::{json, Value};
use sluice_tokenizer::{ChatMessage, ChatOptions, PromptFormat, Role, ToolCall};

/// The fixtures (directories under tests/fixtures), shared with the other family test.
const FAMILIES: [&str; 4] = common::FAMILY_FIXTURES;

fn dir(family: &str) -> std::path::PathBuf {
    root().join("tests/fixtures").join(family)
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

/// A conversation with a system prompt, a tool call, its result and a follow-up, in the OpenAI
/// shape and as the renderer's messages.
fn conversation() -> (Value, Vec<ChatMessage>) {
    let args = r#"{"city": "Zürich"}"#;
    let openai = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]);
    let call =
        ToolCall { id: Some("call_1".into()), name: "get_weather".into(), arguments: args.into() };
    let msgs = vec![
        ChatMessage::new(Role::System, "You are terse."),
        ChatMessage::new(Role::User, "Weather in Zürich?"),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new(Role::Assistant, "") },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::new(Role::Tool, "sunny")
        },
        ChatMessage::new(Role::User, "And tomorrow?"),
    ];
    (openai, msgs)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("ids").iter().map(|i| i.as_u64().expect("id")).collect()
}

/// The greedy reply to `prompt` given as ids.
fn completion_ids(server: &Server, prompt: &[u32], max: usize) -> Vec<u64> {
    let r = post(
        server.addr,
        "/v1/completions",
        &json!({"model": "m", "prompt": prompt, "max_tokens": max, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    ids(&r.json()["sluice"]["generated_ids"])
}

/// Posts `req` and checks its prompt was `want`: the reply's generated ids equal the greedy
/// completion of `want` (the body is returned), or, when `want` and `max` tokens do not fit
/// the context, the refusal counts `want`'s tokens.
fn check_prompt(
    server: &Server,
    path: &str,
    req: &Value,
    want: &[u32],
    max: usize,
    family: &str,
) -> Option<Value> {
    let r = post(server.addr, path, req);
    if want.len() + max > 512 {
        assert_eq!(r.status, 400, "{family}: {}", String::from_utf8_lossy(&r.body));
        let msg = r.json()["error"]["message"].as_str().unwrap_or("").to_owned();
        assert!(msg.contains(&format!("({} in the messages", want.len())), "{family}: {msg}");
        return None;
    }
    assert_eq!(r.status, 200, "{family}: {}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["usage"]["prompt_tokens"], json!(want.len()), "{family}");
    let generated = ids(&body["sluice"]["generated_ids"]);
    assert_eq!(generated, completion_ids(server, want, max), "{family}: prompt ids");
    Some(body)
}

/// Reasoning, content and tool calls of a streamed chat reply, concatenated.
fn streamed(r: &common::Resp) -> (String, String, Vec<Value>) {
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for data in r.sse_data() {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).expect("chunk JSON");
        let Some(delta) = v["choices"][0].get("delta") else { continue };
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
        calls.extend(delta["tool_calls"].as_array().cloned().unwrap_or_default());
    }
    (reasoning, content, calls)
}

#[test]
fn every_family_is_served_through_its_own_chat_format() {
    for family in FAMILIES {
        let dir = dir(family);
        let fmt = PromptFormat::from_dir(&dir).unwrap().expect("tokenizer files");
        let server = Server::start(&[
            "--model",
            &dir.display().to_string(),
            "--queue",
            "0",
            "--model-name",
            "m",
            "--context",
            "512",
        ]);
        let (openai, msgs) = conversation();

        // Tool declarations: the tiny checkpoints' 512-token context cannot hold some formats'
        // tool preambles, so the rendered length is checked where it does not fit.
        let one = [ChatMessage::new(Role::User, "Hi")];
        let opts = ChatOptions { tools: Some(tools()), ..ChatOptions::default() };
        let want = fmt.render_chat(&one, &opts).unwrap();
        let req = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                         "tools": tools(), "max_tokens": 2, "temperature": 0});
        check_prompt(&server, "/v1/chat/completions", &req, &want.ids, 2, family);

        // The conversation (tool call and result in the history): the chat reply's ids equal
        // the completion of the expected prompt ids.
        let want = fmt.render_chat(&msgs, &ChatOptions::default()).unwrap();
        let req = json!({"model": "m", "messages": openai, "max_tokens": 8, "temperature": 0});
        let body = check_prompt(&server, "/v1/chat/completions", &req, &want.ids, 8, family)
            .expect("the conversation fits the context");
        let generated = ids(&body["sluice"]["generated_ids"]);

        // A prompt that opened the think block (R1's template) starts the reply in reasoning.
        let msg = &body["choices"][0]["message"];
        let gen32: Vec<u32> = generated.iter().map(|&i| u32::try_from(i).unwrap()).collect();
        let text = fmt.decode_lossy(&gen32).unwrap();
        if want.reasoning_open && !text.contains("</think>") {
            assert!(msg["content"].as_str().unwrap_or("").is_empty(), "{family}: {msg}");
            assert!(msg["reasoning_content"].is_string(), "{family}: {msg}");
        }

        // Streamed: the concatenated deltas equal the collected reply.
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let s = post(server.addr, "/v1/chat/completions", &sreq);
        assert_eq!(s.status, 200, "{family}");
        let (reasoning, content, calls) = streamed(&s);
        assert_eq!(reasoning, msg["reasoning_content"].as_str().unwrap_or(""), "{family}");
        assert_eq!(content, msg["content"].as_str().unwrap_or(""), "{family}");
        assert_eq!(calls.len(), msg["tool_calls"].as_array().map_or(0, Vec::len), "{family}");

        // Anthropic: thinking off unless asked.
        let a = json!({"model": "m", "max_tokens": 6, "temperature": 0, "system": "You are terse.",
            "messages": [{"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": "Let me see."},
                         {"role": "user", "content": "Go on."}]});
        let am = vec![
            ChatMessage::new(Role::System, "You are terse."),
            ChatMessage::new(Role::User, "Weather?"),
            ChatMessage::new(Role::Assistant, "Let me see."),
            ChatMessage::new(Role::User, "Go on."),
        ];
        let aopts =
            ChatOptions { thinking: false, thinking_explicit: true, ..ChatOptions::default() };
        let awant = fmt.render_chat(&am, &aopts).unwrap();
        let r = post(server.addr, "/v1/messages", &a);
        assert_eq!(r.status, 200, "{family}: {}", String::from_utf8_lossy(&r.body));
        let body = r.json();
        // Anthropic's `input_tokens` leaves out the tokens read from the reused state.
        let u = &body["usage"];
        let input = u["input_tokens"].as_u64().unwrap()
            + u["cache_read_input_tokens"].as_u64().unwrap_or(0);
        assert_eq!(input, awant.ids.len() as u64, "{family}: {u}");
        assert_eq!(
            ids(&body["sluice"]["generated_ids"]),
            completion_ids(&server, &awant.ids, 6),
            "{family}: Anthropic prompt ids"
        );
    }
}

/// The next turn of a conversation reuses the state the previous turn left (the prompt of
/// turn 2 starts with turn 1's rendered prompt for these templates).
#[test]
fn a_follow_up_turn_reuses_the_state_of_the_previous_one() {
    let dir = dir("qwen3_moe/tiny-a");
    let server = Server::start(&[
        "--model",
        &dir.display().to_string(),
        "--queue",
        "0",
        "--model-name",
        "m",
    ]);
    let first = json!([{"role": "system", "content": "You are terse."},
                       {"role": "user", "content": "Hi there, how are you today?"}]);
    let req = json!({"model": "m", "messages": first, "max_tokens": 4, "temperature": 0,
                     "chat_template_kwargs": {"enable_thinking": false}});
    let r = post(server.addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let reply = r.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned();
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": reply}));
    second.push(json!({"role": "user", "content": "And then?"}));
    let mut req2 = req.clone();
    req2["messages"] = Value::Array(second);
    let r = post(server.addr, "/v1/chat/completions", &req2);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let s = &r.json()["sluice"];
    assert!(s["cached_tokens"].as_u64().unwrap() > 0, "no reuse: {s}");
}
