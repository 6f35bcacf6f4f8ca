//! Qwen3-MoE and GPT-OSS: prompt text and chat templates against transformers.
//!
//! `tests/fixtures/{qwen3_moe,gpt_oss}/*/chat_golden.json` (tools/gen_family_chat_goldens.py)
//! hold conversations (system, multi-turn, tools, reasoning), transformers 5.17's
//! `apply_chat_template` rendering of each with the checkpoint's own template, the ids Python
//! `tokenizers` gives the rendering, and plain prompt texts with their ids.

mod common;

use common::chat_golden::{check, fixture};
use sluice_tokenizer::pyjson::PyValue;
use sluice_tokenizer::{ChatTemplate, TemplateInputs};

#[test]
fn qwen3_moe_chat_template_renders_as_transformers() {
    check("qwen3_moe", "tiny-a", true);
    check("qwen3_moe", "tiny-b", true);
}

#[test]
fn gpt_oss_chat_template_renders_as_transformers() {
    check("gpt_oss", "tiny-a", true);
    check("gpt_oss", "tiny-b", true);
}

#[test]
fn raise_exception_in_a_template_is_an_error_naming_the_file() {
    let dir = fixture("gpt_oss", "tiny-a");
    let template = ChatTemplate::from_dir(&dir).expect("compiles").expect("template");
    // gpt-oss refuses harmony markup inside assistant content.
    let messages = PyValue::parse(
        r#"[{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<|channel|>final<|message|>x"}]"#,
    )
    .expect("json");
    let err = template.render(&messages, &TemplateInputs::default()).expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("chat_template.jinja") && text.contains("<|channel|> tags"), "{text}");
}
