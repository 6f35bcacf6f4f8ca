//! `sluice run --prompt` / `--chat` on Qwen3-MoE and GPT-OSS checkpoints, which ship a
//! `tokenizer.json` and their own chat template: real processes over the golden fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(family)
        .join("tiny-a")
}

fn run(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let dir = dir.display().to_string();
    // `--no-warm-start`: the fixtures are read in place, so no run saves a hot set next to them.
    let mut args = vec!["run", "--model", dir.as_str(), "--json", "--no-warm-start"];
    args.extend_from_slice(extra);
    let o: Output =
        Command::new(env!("CARGO_BIN_EXE_sluice")).args(&args).output().expect("spawn sluice");
    assert!(o.status.success(), "sluice failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

fn read_json(path: PathBuf) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("golden file")).expect("golden JSON")
}

/// Text prompts failed for these families before (`run` only read `tiktoken.model`): now the
/// text encodes as Python `tokenizers` does (ids from tools/gen_family_chat_goldens.py), and the
/// run decodes exactly as the same prompt given as ids.
#[test]
fn text_prompts_failed_for_tokenizer_json_families() {
    for family in ["qwen3_moe", "gpt_oss"] {
        let dir = fixture(family);
        let golden = read_json(dir.join("chat_golden.json"));
        for case in golden["text_cases"].as_array().expect("text cases") {
            let text = case["text"].as_str().expect("text");
            let out = run(&dir, &["--prompt", text, "--max-new", "4"]);
            assert_eq!(out["prompt_ids"], case["ids"], "{family}: prompt ids of {text:?}");
            assert!(out["text"].is_string(), "{family}: decoded text");
            let ids: Vec<String> = case["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id").to_string())
                .collect();
            let by_ids = run(&dir, &["--prompt-ids", &ids.join(","), "--max-new", "4"]);
            assert_eq!(out["generated_ids"], by_ids["generated_ids"], "{family}: {text:?}");
        }
    }
}

/// `--chat` renders the checkpoint's own template: the ids equal transformers'
/// `apply_chat_template` of the same single user turn (Qwen3's template has no date in it).
#[test]
fn chat_prompt_uses_the_checkpoint_template() {
    let dir = fixture("qwen3_moe");
    let golden = read_json(dir.join("chat_golden.json"));
    let case = &golden["cases"][0];
    assert_eq!(case["name"], "user_only");
    let text = case["messages"][0]["content"].as_str().expect("content");
    let out = run(&dir, &["--prompt", text, "--chat", "--max-new", "2"]);
    assert_eq!(out["prompt_ids"], case["ids"]);
    assert!(out["message"]["content"].is_string(), "the parsed message is reported: {out}");
    // --no-think is the template's enable_thinking=false: an empty think block opens the turn.
    let out = run(&dir, &["--prompt", text, "--chat", "--no-think", "--max-new", "1"]);
    let ids = out["prompt_ids"].as_array().expect("ids").len();
    assert!(ids > case["ids"].as_array().expect("ids").len(), "the think block was added");
}
