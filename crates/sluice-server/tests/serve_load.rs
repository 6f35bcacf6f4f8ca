//! `sluice serve` opens the model like `sluice run`: the same plan is printed, the stored
//! conversation states are charged to the `--memory` budget (a budget that cannot hold them is
//! refused naming them), and a server whose experts stream through a two-slot cache answers with
//! exactly the tokens of a mapped one, with snapshot bytes reported in /metrics and `--stats`.
//! SIGTERM stops it promptly: the running generation is cancelled at its next pass and queued
//! requests are answered 503.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, sluice_bin, tiny_a, Server};
use serde_json::{json, Value};
use std::io::Read;
use std::process::Command;
use std::sync::mpsc;

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
    let line = format!("snapshots {snaps} (+{bytes} bytes)");
    let log = stream.log_when(|l| l.contains(&line));
    assert!(log.contains(&line), "{log}");
}

#[test]
fn sigterm_waited_for_the_running_generation() {
    // Greedy on tiny-a never emits the stop token: 30000 tokens run for minutes unless the
    // signal cancels them.
    let mut s = Server::start(&["--model", &tiny_a(), "--queue", "1", "--max-tokens", "30000"]);
    let long = json!({"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 30000, "reasoning_effort": "none", "temperature": 0.0});
    let mut body = long.clone();
    body["stream"] = json!(true);
    let mut c = common::send(s.addr, "/v1/chat/completions", &body);
    // The second event is the first token's: the engine runs the job.
    let mut streamed = common::read_events(&mut c, 2);
    // Two more requests: one is admitted behind the running one, the other refused at once.
    // The refusal is the event: the admitted one then holds the queue's slot (queued, or still
    // being tokenized, which the signal answers alike).
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (tx, addr, long) = (tx.clone(), s.addr, long.clone());
        std::thread::spawn(move || tx.send(post(addr, "/v1/chat/completions", &long)));
    }
    let refused = rx.recv().unwrap();
    assert_eq!(refused.status, 429, "{}", String::from_utf8_lossy(&refused.body));
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // The streamed reply ends with what was generated and finish_reason `cancelled`.
    c.read_to_end(&mut streamed).unwrap();
    let streamed = String::from_utf8_lossy(&streamed);
    assert!(streamed.contains(r#""finish_reason":"cancelled""#), "{streamed}");
    assert!(streamed.contains("data: [DONE]"), "{streamed}");
    // The admitted request never ran: a clean 503 naming the shutdown.
    let q = rx.recv().unwrap();
    assert_eq!(q.status, 503, "{}", String::from_utf8_lossy(&q.body));
    assert_eq!(q.json()["error"]["code"], "server_shutting_down");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "a clean stop after SIGTERM: {status}");
    let log = s.log_when(|l| l.contains("SIGTERM received"));
    assert!(log.contains("SIGTERM received") && !log.contains("panicked"), "{log}");
}
