//! The `sluice` binary as a user runs it: real processes, real files.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn sluice(args: &[&str], cache: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_CACHE", cache)
        .output()
        .expect("spawn sluice")
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/kimi_k3")
        .join(name)
        .display()
        .to_string()
}

fn json_out(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "sluice failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

fn golden_greedy(name: &str) -> Vec<(Vec<u64>, Vec<u64>)> {
    let g: serde_json::Value = serde_json::from_slice(
        &std::fs::read(PathBuf::from(fixture(name)).join("golden.json")).unwrap(),
    )
    .unwrap();
    g["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ids =
                |k: &str| r[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            (ids("prompt"), ids("tokens"))
        })
        .collect()
}

#[test]
fn run_json_reproduces_the_mlx_greedy_tokens() {
    let cache = tempfile::tempdir().unwrap();
    for name in ["tiny-a", "tiny-b"] {
        for (prompt, want) in golden_greedy(name) {
            let ids = prompt.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let n = want.len().to_string();
            let v = json_out(&sluice(
                &[
                    "run",
                    "--model",
                    &fixture(name),
                    "--prompt-ids",
                    &ids,
                    "--max-new",
                    &n,
                    "--json",
                ],
                cache.path(),
            ));
            let got: Vec<u64> = v["generated_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(got, want, "{name} prompt {ids}");
            assert_eq!(v["prompt_ids"].as_array().unwrap().len(), prompt.len());
            assert!(v["text"].is_string());
            assert!(v["stats"]["s_per_token"].is_number());
        }
    }
}

#[test]
fn dump_logits_writes_an_npy_of_steps_by_vocab() {
    let cache = tempfile::tempdir().unwrap();
    let out = cache.path().join("logits.npy");
    let o = sluice(
        &[
            "run",
            "--model",
            &fixture("tiny-a"),
            "--prompt-ids",
            "60",
            "--max-new",
            "3",
            "--dump-logits",
            out.to_str().unwrap(),
        ],
        cache.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b = std::fs::read(&out).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (3, 712)"), "{header}");
    assert_eq!((10 + hlen) % 64, 0);
    assert_eq!(b.len(), 10 + hlen + 3 * 712 * 4);
}

#[test]
fn text_prompts_and_chat_use_the_checkpoint_tokenizer() {
    let cache = tempfile::tempdir().unwrap();
    let v = json_out(&sluice(
        &[
            "run",
            "--model",
            &fixture("tiny-a"),
            "--prompt",
            "the model",
            "--max-new",
            "2",
            "--json",
        ],
        cache.path(),
    ));
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty());
    let c = json_out(&sluice(
        &[
            "run",
            "--model",
            &fixture("tiny-a"),
            "--prompt",
            "hi",
            "--chat",
            "--max-new",
            "2",
            "--json",
        ],
        cache.path(),
    ));
    // The chat prompt starts with <|open|> (first special id + 3) and is longer than the text.
    let open = 456 + 3;
    assert_eq!(c["prompt_ids"][0].as_u64().unwrap(), open);
}

#[test]
fn demo_model_runs_without_a_model_and_is_deterministic() {
    let cache = tempfile::tempdir().unwrap();
    let a = sluice(&["run", "--prompt", "Hello", "--max-new", "8", "--json"], cache.path());
    let b_cache = tempfile::tempdir().unwrap();
    let b = sluice(&["run", "--prompt", "Hello", "--max-new", "8", "--json"], b_cache.path());
    let (va, vb) = (json_out(&a), json_out(&b));
    assert_eq!(va["generated_ids"], vb["generated_ids"], "two fresh demo writes must agree");
    assert_eq!(va["demo_model"], true);
    assert!(String::from_utf8_lossy(&a.stderr).contains("RANDOM weights"));
    // The demo directory is a real checkpoint: inspect reads it.
    let dir = cache.path().join("demo-kimi-k3-v3");
    let i = sluice(&["inspect", dir.to_str().unwrap(), "--json"], cache.path());
    let iv = json_out(&i);
    assert_eq!(iv["architecture"], "KimiK3ForConditionalGeneration");
}

#[test]
fn bad_input_is_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let fx = fixture("tiny-a");
    let cases: [(&[&str], &str); 5] = [
        (&["run", "--model", &fx, "--prompt-ids", "1,99999"], "out of vocabulary"),
        (&["run", "--model", &fx, "--prompt", ""], "empty prompt"),
        (&["run", "--model", "/nonexistent/model", "--prompt", "x"], "/nonexistent/model"),
        (&["run", "--model", &fx], "--prompt"),
        (&["inspect", "/nonexistent/model"], "/nonexistent/model"),
    ];
    for (args, needle) in cases {
        let o = sluice(args, cache.path());
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}
