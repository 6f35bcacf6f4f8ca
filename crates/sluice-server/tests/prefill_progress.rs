//! Per-request prefill progress of a real `sluice serve`: the `/metrics` gauges and the log
//! line of a prompt prefilled in several passes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, tiny_a, Server};
use serde_json::json;

#[test]
fn prefill_progress_is_in_metrics_and_the_log() {
    // Session reuse off so the whole prompt is prefilled; checkpoints every 8 positions split
    // the prefill into passes of 8.
    let s = Server::start(&["--model", &tiny_a(), "--checkpoint-every", "8"]);
    let text =
        "The keeper opened the gate and the water ran down the old stone channel. ".repeat(4);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"model": "tiny-a", "prompt": text, "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 16, "the prompt must take several passes: {prompt} tokens");
    // The gauges hold the finished request's prefill: every position done (set by the
    // prefill's last pass, before the reply).
    #[allow(clippy::cast_precision_loss)]
    let want = prompt as f64;
    assert_eq!(s.metric("sluice_prefill_positions_total"), want, "{}", s.metrics_text());
    assert_eq!(s.metric("sluice_prefill_positions_done"), want, "{}", s.metrics_text());
    assert!(s.metrics_text().contains("# TYPE sluice_prefill_expert_bytes_read gauge"));
    // And the multi-pass prefill was logged when it ended.
    let end = format!("prefill {prompt}/{prompt} positions, ");
    let log = s.log_when(|l| l.contains(&end));
    assert!(log.lines().any(|l| l.contains(": job ") && l.contains(&end)), "{log}");
}
