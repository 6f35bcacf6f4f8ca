//! `sluice run` prefill progress, as a user sees it from a real process: progress lines go to
//! stderr, and with `--json` stdout is exactly the one JSON object.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::k3_fixture;
use std::process::Command;

/// A prompt of `n` ids of the tiny fixture's vocabulary.
fn prompt(n: usize) -> String {
    (0..n).map(|i| ((i * 7 + 3) % 100).to_string()).collect::<Vec<_>>().join(",")
}

#[test]
fn prefill_progress_reaches_stderr_and_never_stdout() {
    let cache = tempfile::tempdir().unwrap();
    let ids = prompt(40);
    let run = |chunk: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "--model", &k3_fixture("tiny-a"), "--prompt-ids", &ids, "--max-new", "4"])
            .args(["--prefill-chunk", chunk, "--json"])
            .env("SLUICE_CACHE", cache.path())
            .output()
            .expect("spawn sluice")
    };
    // Five passes of 8 positions: the end of the prefill is reported on stderr (a pipe, so a
    // plain line rather than a bar).
    let o = run("8");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("sluice: prefill 40/40 positions, "));
    assert!(line.is_some_and(|l| l.contains("of experts read")), "no progress line in:\n{err}");
    // stdout is exactly one JSON object: nothing of the progress leaked into it.
    let out = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object on stdout");
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    assert!(!out.contains(" positions"), "{out}");
    // A prefill of one pass prints no progress line, and progress never changes the output.
    let one = run("0");
    let err1 = String::from_utf8_lossy(&one.stderr);
    assert!(one.status.success(), "{err1}");
    // (The plan line names the prefill chunk; a progress line starts with `sluice: prefill `.)
    assert!(!err1.lines().any(|l| l.starts_with("sluice: prefill ")), "{err1}");
    let v1: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(v["generated_ids"], v1["generated_ids"]);
}
