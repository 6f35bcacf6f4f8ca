//! `sluice serve` opens the model like `sluice run`: the same plan is printed, the stored
//! conversation states are charged to the `--memory` budget (a budget that cannot hold them is
//! refused naming them), and a server whose experts stream through a two-slot cache answers with
//! exactly the tokens of a mapped one, with snapshot bytes reported in /metrics and `--stats`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, sluice_bin, tiny_a, Server};
use serde_json::{json, Value};
use std::process::Command;

fn chat(server: &Server, body: &Value) -> Value {
    let r = post(server.addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn session_memory_is_part_of_the_plan_and_refused_when_it_does_not_fit() {
    let model = tiny_a();
    let out = Command::new(sluice_bin())
        .args(["serve", "--port", "0", "--model", &model, "--memory", "64M", "--session-memory"])
        .arg("1G")
        .output()
        .unwrap();
    assert!(!out.status.success(), "a 1 GiB session store cannot fit a 64 MiB budget");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stored conversation state 1073741824"), "{err}");
    assert!(err.contains("--session-memory"), "{err}");
    // The same budget with a small store plans and serves; the plan names the store.
    let s = Server::start(&["--model", &model, "--memory", "256M", "--session-memory", "8M"]);
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.contains("memory plan: budget 0.25 GiB")
            && log.contains("conversation states 0.01 GiB"),
        "{log}"
    );
}

#[test]
fn streamed_experts_serve_the_same_tokens_and_report_snapshots() {
    let model = tiny_a();
    let mapped = Server::start(&["--model", &model, "--experts", "mapped"]);
    let stream = Server::start(&[
        "--model",
        &model,
        "--experts",
        "stream",
        "--cache-slots",
        "2",
        "--buffered-io",
        "--checkpoint-every",
        "16",
        "--stats",
    ]);
    assert!(
        stream.log.lock().unwrap().contains("experts stream"),
        "{}",
        stream.log.lock().unwrap()
    );
    let body = json!({"model": "tiny-a", "messages": [{"role": "user", "content": "Stream it"}],
                      "max_tokens": 8, "temperature": 0});
    let want = chat(&mapped, &body)["sluice"]["generated_ids"].clone();
    let v = chat(&stream, &body);
    assert_eq!(v["sluice"]["generated_ids"], want);
    assert!(stream.metric("sluice_expert_bytes_read_total") > 0.0, "experts were read from disk");
    let snaps = v["sluice"]["snapshots"].as_u64().unwrap();
    let bytes = v["sluice"]["snapshot_bytes"].as_u64().unwrap();
    assert!(snaps >= 2 && bytes > 0, "{v}");
    #[allow(clippy::cast_precision_loss)]
    {
        assert_eq!(stream.metric("sluice_snapshots_total"), snaps as f64);
        assert_eq!(stream.metric("sluice_snapshot_bytes_total"), bytes as f64);
        assert!(stream.metric("sluice_session_bytes") >= bytes as f64);
    }
    stream.wait_idle();
    let line = format!("snapshots {snaps} (+{bytes} bytes)");
    let log = stream.log_when(|l| l.contains(&line));
    assert!(log.contains(&line), "{log}");
}
