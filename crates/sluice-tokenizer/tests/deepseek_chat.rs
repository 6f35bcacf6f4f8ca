//! DeepSeek V3/R1 and Kimi K2 chat templates against transformers.
//!
//! `tests/fixtures/deepseek_v3/{tiny-a,tiny-b}/chat_golden.json` (tools/gen_family_chat_goldens.py)
//! hold conversations (system prompts, multi-turn with reasoning, tool calls and their outputs)
//! rendered by transformers 5.17 with the checkpoint's own template — DeepSeek R1's in tiny-a's
//! `tokenizer_config.json` (through `apply_chat_template`), Kimi K2's in tiny-b's
//! `chat_template.jinja` (through `render_jinja_template`, which `apply_chat_template` calls; a
//! tiktoken model has no transformers tokenizer class without Kimi's remote code) — and the ids
//! of each rendering: `tokenizers` for tiny-a's `tokenizer.json`, tiktoken for tiny-b.

use std::path::{Path, PathBuf};

use sluice_tokenizer::pyjson::PyValue;
use sluice_tokenizer::{AnyTokenizer, ChatTemplate, OutputFormat, PromptFormat, TemplateInputs};

fn fixture(family: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join(name)
}

fn get<'a>(value: &'a PyValue, key: &str) -> &'a PyValue {
    match value {
        PyValue::Dict(entries) => entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("golden entry has no {key:?}")),
        _ => panic!("expected an object around {key:?}"),
    }
}

fn list(value: &PyValue) -> &[PyValue] {
    match value {
        PyValue::List(items) => items,
        other => panic!("expected a list, got {other:?}"),
    }
}

fn string(value: &PyValue) -> &str {
    match value {
        PyValue::Str(s) => s,
        other => panic!("expected a string, got {other:?}"),
    }
}

fn ids(value: &PyValue) -> Vec<u32> {
    list(value)
        .iter()
        .map(|v| match v {
            PyValue::Int(i) => u32::try_from(*i).expect("id fits u32"),
            other => panic!("expected an id, got {other:?}"),
        })
        .collect()
}

/// 2026-01-15 09:30:00 UTC, the date the generator pins `strftime_now` to.
const GOLDEN_NOW: i64 = 1_768_469_400;

fn check_fixture(name: &str, hf: bool) {
    let family = "deepseek_v3";
    {
        let dir = fixture(family, name);
        let text = std::fs::read_to_string(dir.join("chat_golden.json")).expect("chat_golden.json");
        let golden = PyValue::parse(&text).expect("golden JSON");
        assert_eq!(string(get(&golden, "date")), "2026-01-15");
        let tok = AnyTokenizer::from_dir(&dir).expect("tokenizer loads").expect("tokenizer.json");
        assert_eq!(
            matches!(tok, AnyTokenizer::Hf(_)),
            hf,
            "{name}: tokenizer.json or tiktoken.model"
        );
        for case in list(get(&golden, "text_cases")) {
            let text = string(get(case, "text"));
            assert_eq!(tok.encode(text).expect("encode"), ids(get(case, "ids")), "{text:?}");
        }
        let template = ChatTemplate::from_dir(&dir).expect("template compiles").expect("template");
        for case in list(get(&golden, "cases")) {
            let case_name = string(get(case, "name"));
            let mut inputs = TemplateInputs { now_unix: Some(GOLDEN_NOW), ..Default::default() };
            if let tools @ PyValue::List(_) = get(case, "tools") {
                inputs.tools = Some(tools.clone());
            }
            let PyValue::Dict(kwargs) = get(case, "kwargs") else { panic!("kwargs") };
            for (key, value) in kwargs {
                match (key.as_str(), value) {
                    ("add_generation_prompt", PyValue::Bool(b)) => {
                        inputs.add_generation_prompt = *b
                    }
                    _ => inputs.extra.push((key.clone(), value.clone())),
                }
            }
            let rendered = template
                .render(get(case, "messages"), &inputs)
                .unwrap_or_else(|e| panic!("{family}/{name}/{case_name}: {e}"));
            let expected = string(get(case, "text"));
            if rendered != expected {
                let at = rendered.chars().zip(expected.chars()).take_while(|(a, b)| a == b).count();
                let tail =
                    |s: &str| s.chars().skip(at.saturating_sub(40)).take(120).collect::<String>();
                panic!(
                    "{family}/{name}/{case_name}: rendering differs at char {at}:\n sluice: {:?}\n python: {:?}",
                    tail(&rendered),
                    tail(expected)
                );
            }
            let encoded = tok.encode_rendered(&rendered).expect("encode");
            assert_eq!(encoded, ids(get(case, "ids")), "{family}/{name}/{case_name}: ids");
        }
    }
}

#[test]
fn deepseek_r1_chat_template_renders_as_transformers() {
    check_fixture("tiny-a", true);
}

#[test]
fn kimi_k2_chat_template_renders_as_transformers() {
    check_fixture("tiny-b", false);
}

#[test]
fn each_fixture_gets_its_family_output_format() {
    for (name, want) in [("tiny-a", OutputFormat::DeepSeek), ("tiny-b", OutputFormat::KimiK2)] {
        let dir = fixture("deepseek_v3", name);
        let f = PromptFormat::from_dir(&dir).expect("prompt format").expect("tokenizer files");
        assert_eq!(f.output_format(), want, "{name}");
    }
}
