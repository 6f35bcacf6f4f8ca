//! `sluice serve --draft MODEL_DIR` and `sluice serve --spine int8` through real HTTP: a Qwen3
//! draft model is charged to the plan and changes no token of any reply (while it does draft),
//! its width policy's decision is in each reply's `sluice.policy` and in the `--stats` line,
//! another architecture is refused by name, and an int8-converted fixture serves with the lossy
//! spine named in the startup line and in `/v1/models`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{get, post, root, sluice_bin, tiny_a, Server};
use serde_json::{json, Value};
use sluice_checkpoint::convert::{convert_spine_int8, default_output, ConvertOptions};
use std::path::Path;
use std::process::Command;

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let r = post(server.addr, path, body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn draft_dir() -> String {
    root().join("tests/fixtures/qwen3/tiny-a").display().to_string()
}

#[test]
fn a_draft_model_drafts_and_changes_no_token() {
    let model = tiny_a();
    let draft = draft_dir();
    let plain = Server::start(&["--model", &model]);
    let spec =
        Server::start(&["--model", &model, "--draft", &draft, "--draft-max", "4", "--stats"]);
    let log = spec.log.lock().unwrap().clone();
    assert!(log.contains("; draft model "), "the plan charges the draft model: {log}");
    assert!(!plain.log.lock().unwrap().contains("draft model"));
    let card = &get(spec.addr, "/v1/models").json()["data"][0];
    assert_eq!(card["sluice"]["drafter"], format!("model:{draft}"), "{card}");

    let mut drafted = 0;
    let mut history = Vec::new();
    // Three turns of one conversation (the later ones resume stored state) and a completion.
    for text in ["Tell me about rivers.", "And the sea?", "Write it again, the same way."] {
        history.push(json!({"role": "user", "content": text}));
        let body = json!({"model": "tiny-a", "messages": history, "max_tokens": 12,
                          "temperature": 0});
        let want = ok(&plain, "/v1/chat/completions", &body);
        let got = ok(&spec, "/v1/chat/completions", &body);
        assert_eq!(got["sluice"]["generated_ids"], want["sluice"]["generated_ids"], "{text}");
        assert_eq!(got["choices"][0]["message"], want["choices"][0]["message"], "{text}");
        drafted += got["sluice"]["drafted"].as_u64().unwrap();
        assert_policy(&got, &want);
        history.push(want["choices"][0]["message"].clone());
    }
    let body = json!({"model": "tiny-a", "prompt": "The keeper opened the gate and the water",
                      "max_tokens": 16, "temperature": 0});
    let want = ok(&plain, "/v1/completions", &body);
    let got = ok(&spec, "/v1/completions", &body);
    assert_eq!(got["sluice"]["generated_ids"], want["sluice"]["generated_ids"]);
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    drafted += got["sluice"]["drafted"].as_u64().unwrap();
    assert_policy(&got, &want);
    assert!(drafted > 0, "the draft model proposed nothing: the test would prove nothing");
    let with_policy = |log: &str| {
        log.lines().filter(|l| l.starts_with("stats: job ")).any(|l| {
            l.contains(", finish ") && l.contains("; draft width: policy up to 4: next width ")
        })
    };
    let log = spec.log_when(with_policy);
    assert!(!log.contains("drafting stopped"), "{log}");
    assert!(with_policy(&log), "the --stats lines name the width policy: {log}");
}

/// A reply that decoded speculatively carries its width policy (up to `--draft-max 4`, with a
/// pass that verified drafts when some were drafted), one that ended at its first token has
/// none, and neither has the server without a drafter.
fn assert_policy(spec: &Value, plain: &Value) {
    assert!(plain["sluice"]["policy"].is_null(), "{plain}");
    let p = &spec["sluice"]["policy"];
    if spec["sluice"]["decode_passes"] == 0 {
        assert!(p.is_null(), "{spec}");
        return;
    }
    assert_eq!(p["max"], 4, "{spec}");
    assert_eq!(p["fixed"], false, "{spec}");
    let histogram: Vec<u64> =
        p["histogram"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(histogram.len(), 5, "{spec}");
    if spec["sluice"]["drafted"].as_u64().unwrap() > 0 {
        assert!(histogram[1..].iter().sum::<u64>() > 0, "a pass verified drafts: {spec}");
    }
}

#[test]
fn a_draft_that_is_not_qwen3_is_refused_by_name() {
    let out = Command::new(sluice_bin())
        .args(["serve", "--port", "0", "--model", &tiny_a(), "--draft", &tiny_a()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot draft") && err.contains("Qwen3ForCausalLM"), "{err}");
}

/// A copy of the tiny K3 fixture in `root/tiny-a` and its int8 conversion beside it.
fn converted(root: &Path) -> (String, String) {
    let src = root.join("tiny-a");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(tiny_a()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let dst = default_output(&src);
    convert_spine_int8(&src, &dst, &ConvertOptions::default(), |_, _| {}).unwrap();
    (src.display().to_string(), dst.display().to_string())
}

#[test]
fn an_int8_spine_serves_and_is_labelled_lossy() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, int8) = converted(tmp.path());
    // The original directory with --spine int8 reads its DIR-int8 sibling.
    let s = Server::start(&["--model", &src, "--spine", "int8"]);
    let log = s.log.lock().unwrap().clone();
    assert!(log.contains("sluice: spine int8 (row-int8 spine, LOSSY"), "{log}");
    let card = &get(s.addr, "/v1/models").json()["data"][0];
    assert_eq!(card["sluice"]["spine"], "int8", "{card}");
    assert_eq!(card["sluice"]["lossy"], true, "{card}");
    let body = json!({"model": "tiny-a", "messages": [{"role": "user", "content": "Hello"}],
                      "max_tokens": 8, "temperature": 0});
    let v = ok(&s, "/v1/chat/completions", &body);
    assert_eq!(v["sluice"]["generated_ids"].as_array().unwrap().len(), 8, "{v}");
    // The published spine is labelled exact.
    let b = Server::start(&["--model", &src]);
    let card = &get(b.addr, "/v1/models").json()["data"][0];
    assert_eq!(card["sluice"]["spine"], "bf16", "{card}");
    assert_eq!(card["sluice"]["lossy"], false, "{card}");
    // A converted directory is never served as the published model.
    let out = Command::new(sluice_bin())
        .args(["serve", "--port", "0", "--model", &int8])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--spine int8"), "{err}");
}
