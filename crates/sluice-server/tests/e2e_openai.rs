//! The real `sluice serve` binary driven by the official `openai` Python package
//! (tools/openai_e2e.py): models, completion, chat, streaming chat, tool-call history round trip,
//! seeded reproducibility, logprobs, OpenAI-shaped errors and a 429 under a concurrent request.
//!
//! Skipped (with a message) only when `python3` or its `openai` package is missing on a
//! developer's machine. Under CI (the `CI` environment variable set, as CI services and
//! `.ci/run` do) a missing interpreter or package is a failure, not a skip: `.ci/run` installs
//! the pinned package, so a CI run that cannot drive the server has lost this check.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{python_openai, root, tiny_a, Server};
use std::process::Command;

/// Whether this run is CI: `CI` set to anything but empty, `0` or `false` (CI services set
/// `CI=true`).
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

#[test]
fn openai_python_client_end_to_end() {
    if !python_openai() {
        let why = "python3 with the `openai` package is not installed (pip install \
                   openai==3.57.0; .ci/run does this)";
        assert!(!in_ci(), "openai_python_client_end_to_end cannot run under CI: {why}");
        eprintln!("SKIPPED openai_python_client_end_to_end: {why}");
        return;
    }
    let server = Server::start(&["--model", &tiny_a(), "--queue", "0", "--checkpoint-every", "16"]);
    let out = Command::new("python3")
        .arg(root().join("tools/openai_e2e.py"))
        .args(["--base-url", &server.base_url(), "--model", "tiny-a"])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all e2e checks passed"),
        "e2e failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log.lock().unwrap()
    );
}
