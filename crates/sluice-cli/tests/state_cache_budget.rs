//! `--state-cache` inside `--memory` (rule 5), with real `sluice run` processes on a streamed
//! model three times larger than its budget: what the state cache holds in memory (the restored
//! snapshot, the writer's queue) is part of the memory plan, a budget that cannot hold it is
//! refused naming it, and a process that restores a prompt state stays under its budget.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// Memory no budget charges (the executable's code, the C library, thread stacks, allocator
/// slack), as in `streaming_budget.rs`.
const SLACK: u64 = 16 << 20;

fn synth(dir: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["synth", "--preset", "many-experts", "--layers", "6", "--experts", "256"])
        .args(["--seed", "5", "--out", dir.to_str().unwrap()])
        .output()
        .expect("spawn synth");
    assert!(o.status.success(), "synth: {}", String::from_utf8_lossy(&o.stderr));
}

/// `sluice run` on `model` with a 40-token prompt, `--memory memory`, and `--state-cache cache`
/// when given.
fn run(model: &Path, memory: &str, cache: Option<&Path>, context: &str) -> Output {
    let prompt: Vec<String> = (0..40u32).map(|i| ((i * 37 + 11) % 500).to_string()).collect();
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(["run", "--model", model.to_str().unwrap(), "--prompt-ids", &prompt.join(",")]).args([
        "--max-new",
        "6",
        "--json",
        "--memory",
        memory,
        "--context",
        context,
    ]);
    if let Some(d) = cache {
        c.arg("--state-cache").arg(d).args(["--state-cache-every", "8"]);
    }
    c.output().expect("spawn sluice")
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "sluice failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// The plan's minimum from a refusal ("… the minimum is N bytes …").
fn minimum(o: &Output) -> u64 {
    assert!(!o.status.success(), "a 1 MiB budget is refused");
    let err = String::from_utf8_lossy(&o.stderr);
    let at = err.find("the minimum is ").unwrap_or_else(|| panic!("no minimum in: {err}"));
    let rest = &err[at + "the minimum is ".len()..];
    rest[..rest.find(' ').unwrap()].parse().unwrap()
}

#[test]
fn state_cache_restore_was_not_charged_to_the_memory_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    synth(&model);
    // A long planned context makes the snapshots' share of the plan large enough to see.
    let ctx = "32768";
    let cache = tmp.path().join("states");
    let with = minimum(&run(&model, "1M", Some(&cache), ctx));
    let without = minimum(&run(&model, "1M", None, ctx));
    assert!(
        with > without + (16 << 20),
        "the plan charges the state cache's snapshots: minimum {with} with it, {without} without"
    );
    // A budget between the two minimums runs without the state cache and is refused with it,
    // naming what does not fit.
    let between = (without + with) / 2;
    let o = run(&model, &between.to_string(), Some(&cache), ctx);
    assert!(!o.status.success(), "refused: the state cache does not fit");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("prompt-state cache snapshots"), "{err}");
    assert!(err.contains("no --state-cache"), "{err}");
    json(&run(&model, &between.to_string(), None, ctx));
}

#[test]
fn a_restore_under_a_tight_memory_budget_stays_within_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    synth(&model);
    let budget: u64 = 96 << 20;
    let cache = tmp.path().join("states");
    let plain = json(&run(&model, "96M", None, "4096"));
    let first = json(&run(&model, "96M", Some(&cache), "4096"));
    let o = run(&model, "96M", Some(&cache), "4096");
    let second = json(&o);
    let plan = String::from_utf8_lossy(&o.stderr);
    assert!(plan.contains("prompt-state cache snapshots"), "the plan line names them: {plan}");
    assert_eq!(second["experts"], "stream", "the experts stream: the budget is tight");
    assert_eq!(first["stats"]["state_cache_tokens_restored"], 0);
    assert!(
        second["stats"]["state_cache_tokens_restored"].as_u64().unwrap() >= 40,
        "the second process restored the prompt: {}",
        second["stats"]
    );
    for (what, v) in [("writing", &first), ("restoring", &second)] {
        let peak = v["stats"]["peak_rss_bytes"].as_u64().unwrap();
        assert!(peak > 0, "VmHWM is reported");
        assert!(
            peak <= budget + SLACK,
            "the {what} run's peak RSS {peak} exceeds the {budget}-byte budget + {SLACK} slack"
        );
    }
    assert_eq!(first["generated_ids"], plain["generated_ids"]);
    assert_eq!(second["generated_ids"], plain["generated_ids"]);
}
