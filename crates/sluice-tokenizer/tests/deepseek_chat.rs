//! DeepSeek V3/R1 and Kimi K2 chat templates against transformers.
//!
//! `tests/fixtures/deepseek_v3/{tiny-a,tiny-b}/chat_golden.json` (tools/gen_family_chat_goldens.py)
//! hold conversations (system prompts, multi-turn with reasoning, tool calls and their outputs)
//! rendered by transformers 5.17 with the checkpoint's own template — DeepSeek R1's in tiny-a's
//! `tokenizer_config.json` (through `apply_chat_template`), Kimi K2's in tiny-b's
//! `chat_template.jinja` (through `render_jinja_template`, which `apply_chat_template` calls; a
//! tiktoken model has no transformers tokenizer class without Kimi's remote code) — and the ids
//! of each rendering: `tokenizers` for tiny-a's `tokenizer.json`, tiktoken for tiny-b.

mod common;

use common::chat_golden::{check, fixture};
use sluice_tokenizer::{OutputFormat, PromptFormat};

#[test]
fn deepseek_r1_chat_template_renders_as_transformers() {
    check("deepseek_v3", "tiny-a", true);
}

#[test]
fn kimi_k2_chat_template_renders_as_transformers() {
    check("deepseek_v3", "tiny-b", false);
}

#[test]
fn each_fixture_gets_its_family_output_format() {
    for (name, want) in [("tiny-a", OutputFormat::DeepSeek), ("tiny-b", OutputFormat::KimiK2)] {
        let dir = fixture("deepseek_v3", name);
        let f = PromptFormat::from_dir(&dir).expect("prompt format").expect("tokenizer files");
        assert_eq!(f.output_format(), want, "{name}");
    }
}
