//! A model several times larger than its `--memory` budget runs as a real `sluice` process
//! with its peak resident memory (VmHWM, read by the process from /proc/self/status at the end
//! of generation) under the budget plus a stated slack, and generates exactly the tokens of an
//! unconstrained run that maps every expert.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

/// Memory no budget charges: the executable's own resident code and read-only data, the C
/// library, thread stacks and allocator slack. The budget charges the spine, the sequence
/// state, 64 MiB of I/O headroom and the expert arena; everything else must fit here.
const SLACK: u64 = 16 << 20;

fn sluice(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("spawn sluice");
    assert!(o.status.success(), "sluice {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

#[test]
fn peak_rss_stays_under_a_budget_a_third_of_the_model_and_tokens_are_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    let m = model.to_str().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["synth", "--preset", "many-experts", "--layers", "6", "--experts", "256"])
        .args(["--seed", "5", "--out", m])
        .output()
        .expect("spawn synth");
    assert!(o.status.success(), "synth: {}", String::from_utf8_lossy(&o.stderr));
    let budget: u64 = 96 << 20;
    let size = dir_bytes(&model);
    assert!(size >= 3 * budget, "the model ({size} bytes) is at least 3× the budget");
    let common = ["run", "--model", m, "--prompt-ids", "3,14,15,92,65,35", "--max-new", "16"];
    let streamed = sluice(&[&common[..], &["--memory", "96M", "--json"]].concat());
    assert_eq!(streamed["experts"], "stream");
    let stats = &streamed["stats"];
    let peak = stats["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak > 0, "VmHWM is reported");
    assert!(
        peak <= budget + SLACK,
        "peak RSS {peak} bytes exceeds the {budget}-byte budget + {SLACK} bytes of slack"
    );
    assert!(stats["expert_bytes_read"].as_u64().unwrap() > 0, "experts were read from disk");
    let mapped = sluice(&[&common[..], &["--experts", "mapped", "--json"]].concat());
    assert_eq!(streamed["generated_ids"], mapped["generated_ids"]);
    assert_eq!(streamed["generated_ids"].as_array().unwrap().len(), 16);
}
