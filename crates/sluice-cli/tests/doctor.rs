//! `sluice doctor` on real installs pulled from a test hub on 127.0.0.1: healthy, a
//! truncated file, a missing file, a flipped byte (found only with `--deep`); and `sluice run`
//! naming a stream install, placing its spine as asked, and refusing `--spine int8` on it.

use sluice_hub::testhub::{install, k3_tiny_fixture, k3_tiny_hub, TestHub, K3_TINY_REPO};
use sluice_hub::ModeRequest;
use std::path::Path;
use std::process::{Command, Output};

fn pull(hub: &TestHub, dir: &Path, mode: ModeRequest) {
    let routed = sluice_engine::install::routed_tensors_in(&k3_tiny_fixture()).expect("routed");
    install(hub, K3_TINY_REPO, dir, mode, &routed).expect("pull");
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env_remove("HF_ENDPOINT")
        .output()
        .expect("runs sluice")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn doctor_finds_truncated_missing_and_flipped_files() {
    let hub = k3_tiny_hub().expect("hub");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("full");
    pull(&hub, &dir, ModeRequest::Full);
    let d = dir.to_str().expect("utf-8 path");

    let o = sluice(&["doctor", d, "--deep"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("verdict     healthy") && t.contains("full mode") && t.contains("kernels"),
        "{t}"
    );
    let o = sluice(&["doctor", d, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["healthy"], true);

    // A flipped byte keeps the size: only --deep sees it.
    let shard = dir.join("model-00002-of-000003.safetensors");
    let mut data = std::fs::read(&shard).expect("shard");
    let mid = data.len() / 2;
    data[mid] ^= 0x40;
    std::fs::write(&shard, &data).expect("write");
    assert!(sluice(&["doctor", d]).status.success(), "sizes alone cannot see a flipped byte");
    let o = sluice(&["doctor", d, "--deep"]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("does not match the manifest"), "{t}");
    assert!(
        t.contains("--deep to replace it") && t.contains("sluice pull moonshotai/Kimi-K3-tiny"),
        "{t}"
    );
    data[mid] ^= 0x40;
    std::fs::write(&shard, &data).expect("restore");

    // Truncated.
    std::fs::write(&shard, &data[..data.len() - 10]).expect("truncate");
    let o = sluice(&["doctor", d]);
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains(&format!("{} bytes, expected {}", data.len() - 10, data.len())),
        "{t}"
    );
    assert!(t.contains("to repair it"), "{t}");
    std::fs::write(&shard, &data).expect("restore");

    // Missing.
    std::fs::remove_file(dir.join("config.json")).expect("remove");
    let o = sluice(&["doctor", d]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("config.json: missing"), "{t}");

    // A plain checkpoint directory is checked as `run` checks it, and healthy.
    let o = sluice(&["doctor", k3_tiny_fixture().to_str().expect("utf-8")]);
    assert!(o.status.success() && text(&o).contains("a plain directory, no sluice-install.json"));
    // A directory that is neither an install nor a checkpoint is a problem.
    let empty = tempfile::tempdir().expect("tempdir");
    let o = sluice(&["doctor", empty.path().to_str().expect("utf-8")]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("not a checkpoint directory either"), "{t}");
}

#[test]
fn run_and_doctor_describe_a_stream_install() {
    let hub = k3_tiny_hub().expect("hub");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("stream");
    pull(&hub, &dir, ModeRequest::Stream);
    let d = dir.to_str().expect("utf-8 path");
    let o = sluice(&["run", "--model", d, "--prompt-ids", "1,2,3", "--max-new", "3", "--stats"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("install: stream (0 of "), "{t}");
    assert!(t.contains("remote: ") && t.contains("experts fetched"), "{t}");
    let o = sluice(&["doctor", d, "--deep"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("stream mode") && t.contains("cached locally") && t.contains("verified"),
        "{t}"
    );
    let o = sluice(&["run", "--model", d, "--prompt-ids", "1,2,3", "--max-new", "3"]);
    let t = text(&o);
    assert!(t.contains("install: stream (") && !t.contains("install: stream (0 of "), "{t}");

    // The spine is placed as for a full install, the plan says so, and the tokens are the same.
    let placed = sluice(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3",
        "--max-new",
        "3",
        "--spine-placement",
        "1",
    ]);
    let t = text(&placed);
    assert!(placed.status.success(), "{t}");
    assert!(t.contains("spine: 1 of 9 layers resident") && t.contains("8 streamed via 2×"), "{t}");
    assert_eq!(placed.stdout, o.stdout, "the placed spine changed the output");
    let o = sluice(&["run", "--model", d, "--prompt-ids", "1,2,3", "--spine", "int8"]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("is a stream install"), "{t}");
}
