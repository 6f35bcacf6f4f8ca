//! Response snapshots: fixed greedy requests against the tiny fixture, with ids, timestamps and
//! timings redacted, compared with `tests/snapshots/*.json`. Set `SLUICE_UPDATE_SNAPSHOTS=1` to
//! rewrite them after an intended change (and review the diff).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{get, post, request, tiny_a, Server};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Keys whose values change from run to run (timings are redacted; other floats rounded).
const VOLATILE: [&str; 6] = ["id", "created", "queue_s", "ttft_s", "total_s", "system_fingerprint"];

fn redact(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if VOLATILE.contains(&k.as_str()) && !x.is_null() {
                    *x = json!("<redacted>");
                } else {
                    redact(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact),
        // Log-probabilities to 3 decimals: robust to last-bit differences between SIMD tiers.
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or_default();
            *v = json!((x * 1000.0).round() / 1000.0);
        }
        _ => {}
    }
}

fn check(name: &str, mut v: Value) {
    redact(&mut v);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&v).unwrap() + "\n";
    if std::env::var_os("SLUICE_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!("missing {}: run with SLUICE_UPDATE_SNAPSHOTS=1", path.display())
    });
    assert_eq!(text, want, "snapshot {name} differs (SLUICE_UPDATE_SNAPSHOTS=1 rewrites it)");
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn responses_match_their_snapshots() {
    let s = Server::start(&["--model", &tiny_a(), "--checkpoint-every", "0"]);
    let models = get(s.addr, "/v1/models").json();
    check("models", models);
    let c = post(
        s.addr,
        "/v1/completions",
        &json!({"model": "tiny-a", "prompt": "The capital of France is",
        "max_tokens": 6, "temperature": 0, "logprobs": 2}),
    );
    check("completion", c.json());
    let chat = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny-a", "messages": user("Hello"),
        "max_tokens": 6, "temperature": 0, "reasoning_effort": "none", "stop": ["zz"]}),
    );
    check("chat_no_think", chat.json());
    let think = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny-a", "messages": user("Hello"),
        "max_tokens": 6, "temperature": 0}),
    );
    check("chat_think", think.json());
    let stream = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny-a", "messages": user("Hello"),
        "max_tokens": 4, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(stream.header("content-type"), Some("text/event-stream"));
    let chunks: Vec<Value> = stream
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| json!(d)))
        .collect();
    check("chat_stream", Value::Array(chunks));
    let errors = json!({
        "unknown_field": post(s.addr, "/v1/chat/completions", &json!({"model": "tiny-a", "messages": user("x"), "frobnicate": 1})).json(),
        "unknown_model": post(s.addr, "/v1/completions", &json!({"model": "gpt-4", "prompt": "x"})).json(),
        "echo": post(s.addr, "/v1/completions", &json!({"model": "tiny-a", "prompt": "x", "echo": true})).json(),
        "image": post(s.addr, "/v1/chat/completions", &json!({"model": "tiny-a", "messages": [{"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]})).json(),
        "bad_json": request(s.addr, "POST", "/v1/chat/completions", &[], b"{\"model\": ").json(),
        "wrong_method": request(s.addr, "PUT", "/v1/chat/completions", &[], b"").json(),
        "unknown_path": get(s.addr, "/v1/engines").json(),
    });
    check("errors", errors);
}
