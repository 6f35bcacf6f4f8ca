//! The check of a model family's `chat_golden.json` (tools/gen_family_chat_goldens.py), shared by
//! `family_chat.rs` (Qwen3-MoE, GPT-OSS) and `deepseek_chat.rs` (DeepSeek R1, Kimi K2): the
//! fixture's tokenizer encodes each plain text as Python did, and its own chat template renders
//! each conversation byte for byte as transformers' `apply_chat_template` did, whose rendering
//! then encodes to the same ids. A failure names the family, the fixture and the case, and shows
//! the text around the first differing character.

use std::path::{Path, PathBuf};

use sluice_tokenizer::pyjson::PyValue;
use sluice_tokenizer::{AnyTokenizer, ChatTemplate, TemplateInputs};

/// 2026-01-15 09:30:00 UTC, the date the generator pins `strftime_now` to.
const GOLDEN_NOW: i64 = 1_768_469_400;

/// The fixture directory `tests/fixtures/{family}/{name}`.
pub fn fixture(family: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join(name)
}

/// Checks fixture `family/name`'s `chat_golden.json`; `hf`: whether the fixture's tokenizer is a
/// `tokenizer.json` (else a tiktoken model).
pub fn check(family: &str, name: &str, hf: bool) {
    let dir = fixture(family, name);
    let text = std::fs::read_to_string(dir.join("chat_golden.json")).expect("chat_golden.json");
    let golden = PyValue::parse(&text).expect("golden JSON");
    assert_eq!(string(get(&golden, "date")), "2026-01-15");
    let tok = AnyTokenizer::from_dir(&dir).expect("tokenizer loads").expect("tokenizer files");
    let is_hf = matches!(tok, AnyTokenizer::Hf(_));
    assert_eq!(is_hf, hf, "{family}/{name}: tokenizer.json or tiktoken.model");
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
                ("add_generation_prompt", PyValue::Bool(b)) => inputs.add_generation_prompt = *b,
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
