//! The real `sluice serve` binary driven by the official `anthropic` Python package
//! (tools/anthropic_e2e.py): messages, thinking blocks, the streaming event sequence, stop
//! sequences, a tool round trip, `tool_choice` enforced by constrained decoding, and errors in
//! the Messages API's shape after which the server keeps serving.
//!
//! Skipped (with a message) only when `python3` or its `anthropic` package is missing on a
//! developer's machine; under CI (`CI` set) a missing package fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{python_has, root, tiny_a, Server};
use std::process::Command;

/// Whether this run is CI: `CI` set to anything but empty, `0` or `false`.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

#[test]
fn anthropic_python_client_end_to_end() {
    if !python_has("anthropic") {
        let why = "python3 with the `anthropic` package is not installed (pip install \
                   anthropic==2.15.0; .ci/run does this)";
        assert!(!in_ci(), "anthropic_python_client_end_to_end cannot run under CI: {why}");
        eprintln!("SKIPPED anthropic_python_client_end_to_end: {why}");
        return;
    }
    let server = Server::start(&["--model", &tiny_a(), "--queue", "0", "--checkpoint-every", "16"]);
    let base = format!("http://{}", server.addr);
    let out = Command::new("python3")
        .arg(root().join("tools/anthropic_e2e.py"))
        .args(["--base-url", &base, "--model", "tiny-a"])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all anthropic e2e checks passed"),
        "e2e failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log.lock().unwrap()
    );
}
