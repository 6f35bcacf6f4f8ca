//! The real `sluice serve` binary driven by the official `openai` Python package
//! (tools/openai_e2e.py): models, completion, chat, streaming chat, tool-call history round trip,
//! seeded reproducibility, logprobs, OpenAI-shaped errors and a 429 under a concurrent request.
//!
//! Skipped (with a message) only when `python3` or its `openai` package is missing locally;
//! `.ci/run` installs the pinned package, so CI always runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{python_openai, root, tiny_a, Server};
use std::process::Command;

#[test]
fn openai_python_client_end_to_end() {
    if !python_openai() {
        eprintln!(
            "SKIPPED openai_python_client_end_to_end: python3 with the `openai` package is not \
             installed (pip install openai==3.57.0; .ci/run does this)"
        );
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
