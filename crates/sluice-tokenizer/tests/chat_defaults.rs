//! Defaults of the template chat formats that a request does not spell: the thinking switch
//! reaches a Jinja template only when the request set it (as in transformers'
//! `apply_chat_template` without the keyword argument), and tool-call markup is parsed as calls
//! only when the request declared tools.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::Value;
use sluice_tokenizer::{ChatMessage, ChatOptions, OutputEvent, PromptFormat, Reasoning, Role};
use std::path::PathBuf;

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family)
}

/// A checkpoint directory with DeepSeek's tiny tokenizer and a V3.1-style template, whose
/// generation prompt opens the think block only when `thinking` is true.
fn v31_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("deepseek_v3/tiny-a").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let template =
        "{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}\
        {% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% if thinking is \
        defined and thinking %}<think>{% else %}</think>{% endif %}{% endif %}";
    let config =
        serde_json::json!({"eos_token": "<｜end▁of▁sentence｜>", "chat_template": template});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn templates_were_rendered_in_thinking_mode_when_the_request_did_not_ask() {
    let dir = v31_dir();
    let fmt = PromptFormat::from_dir(dir.path()).unwrap().unwrap();
    let msgs = [ChatMessage::new(Role::User, "Hi")];
    let text = |o: &ChatOptions| fmt.decode_lossy(&fmt.render_chat(&msgs, o).unwrap().ids).unwrap();

    // Not asked: the template's own default, V3.1's non-thinking mode.
    let default = fmt.render_chat(&msgs, &ChatOptions::default()).unwrap();
    assert!(text(&ChatOptions::default()).ends_with("<｜Assistant｜></think>"));
    assert_eq!(default.reasoning, Reasoning::Off, "the prompt closed the think block");
    // Asked: the request's switch.
    let on = ChatOptions { thinking: true, thinking_explicit: true, ..ChatOptions::default() };
    assert!(text(&on).ends_with("<｜Assistant｜><think>"));
    assert_eq!(fmt.render_chat(&msgs, &on).unwrap().reasoning, Reasoning::Open);
    let off = ChatOptions { thinking: false, thinking_explicit: true, ..ChatOptions::default() };
    assert!(text(&off).ends_with("</think>"));
}

/// The goldens of transformers' `apply_chat_template` without thinking keyword arguments are
/// what a request that sets no thinking switch renders.
#[test]
fn a_request_without_a_thinking_switch_renders_the_golden_of_no_keyword_arguments() {
    // gpt-oss's template writes today's date, so its goldens are compared in family_chat.rs
    // with the date fixed; it reads no thinking variable.
    for family in ["qwen3_moe/tiny-a", "deepseek_v3/tiny-a", "deepseek_v3/tiny-b"] {
        let dir = fixture(family);
        let fmt = PromptFormat::from_dir(&dir).unwrap().unwrap();
        let golden: Value =
            serde_json::from_slice(&std::fs::read(dir.join("chat_golden.json")).unwrap()).unwrap();
        let mut checked = 0;
        for case in golden["cases"].as_array().unwrap() {
            let kwargs = case["kwargs"].as_object().unwrap();
            let plain_user = case["messages"].as_array().unwrap().iter().all(|m| {
                ["user", "system"].contains(&m["role"].as_str().unwrap())
                    && m["content"].is_string()
                    && m.as_object().unwrap().len() == 2
            });
            if kwargs.len() != 1
                || kwargs.get("add_generation_prompt") != Some(&Value::Bool(true))
                || !case["tools"].is_null()
                || !plain_user
            {
                continue;
            }
            let msgs: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let role = if m["role"] == "user" { Role::User } else { Role::System };
                    ChatMessage::new(role, m["content"].as_str().unwrap())
                })
                .collect();
            let got = fmt.render_chat(&msgs, &ChatOptions::default()).unwrap();
            let want: Vec<u64> =
                case["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
            let got: Vec<u64> = got.ids.iter().map(|&i| u64::from(i)).collect();
            assert_eq!(got, want, "{family}: {}", case["name"]);
            checked += 1;
        }
        assert!(checked > 0, "{family}: no golden case without thinking arguments");
    }
}

/// Content and tool calls of `text` parsed (decoded with special tokens spelled out) as a reply
/// to a request with or without declared tools.
fn parse(family: &str, text: &str, tools: bool) -> (String, usize) {
    let fmt = PromptFormat::from_dir(&fixture(family)).unwrap().unwrap();
    let ids = fmt.tokenizer().encode_rendered(text).unwrap();
    let mut p = fmt.output_parser(false, tools).unwrap();
    let (mut content, mut calls) = (String::new(), 0);
    for e in p.parse_all(&ids) {
        match e {
            OutputEvent::Content(t) => content.push_str(&t),
            OutputEvent::ToolCall(_) => calls += 1,
            OutputEvent::Reasoning(_) => {}
        }
    }
    (content, calls)
}

#[test]
fn tool_call_markup_was_parsed_as_calls_when_the_request_declared_no_tools() {
    let qwen = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    let k2 = "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
              <|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>";
    let harmony =
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>";
    for (family, text) in
        [("qwen3_moe/tiny-a", qwen), ("deepseek_v3/tiny-b", k2), ("gpt_oss/tiny-a", harmony)]
    {
        let (_, calls) = parse(family, text, true);
        assert_eq!(calls, 1, "{family}: with tools the markup is a call");
        let (content, calls) = parse(family, text, false);
        assert_eq!(calls, 0, "{family}: without tools nothing is a call");
        assert!(content.contains("{\"a\": 1}"), "{family}: the markup stays content: {content:?}");
    }
}
