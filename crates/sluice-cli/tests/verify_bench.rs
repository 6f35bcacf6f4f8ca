//! `sluice verify` on real checkpoint files (intact, truncated, a flipped byte with and without
//! an install manifest) and `sluice bench` end to end (fresh processes, interleaved
//! configurations, the oracle check failing loudly).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("spawn sluice")
}

fn synth(dir: &Path) {
    let o = sluice(&["synth", "--preset", "demo", "--seed", "2", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "synth: {}", String::from_utf8_lossy(&o.stderr));
}

fn shards(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// An install manifest as `sluice pull` writes it, with every file's SHA-256.
fn write_manifest(dir: &Path) {
    let mut files = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let bytes = std::fs::read(&p).unwrap();
        let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        files.push(serde_json::json!({
            "path": p.file_name().unwrap().to_str().unwrap(), "size": bytes.len(),
            "sha256": sha, "state": "full", "source": "downloaded"
        }));
    }
    let m = serde_json::json!({
        "format": 1, "repo": "test/demo", "revision": "main", "commit": "0".repeat(40),
        "endpoint": "http://127.0.0.1", "mode": "full", "layout": "dir",
        "created": "2026-11-29T00:00:00Z", "updated": "2026-11-29T00:00:00Z",
        "complete": true, "files": files
    });
    std::fs::write(dir.join("sluice-install.json"), m.to_string()).unwrap();
}

#[test]
fn verify_passes_an_intact_checkpoint_and_names_a_truncated_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth(&dir);
    let d = dir.to_str().unwrap();
    let ok = sluice(&["verify", d]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("OK"));
    let shard = shards(&dir)[0].clone();
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 1000).unwrap();
    let bad = sluice(&["verify", d, "--json"]);
    assert!(!bad.status.success());
    let v: serde_json::Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let name = shard.file_name().unwrap().to_str().unwrap();
    let f = v["files"].as_array().unwrap().iter().find(|f| f["file"] == name).unwrap();
    let problem = f["problems"][0].as_str().unwrap();
    assert!(problem.contains("truncated") && problem.contains("tensor "), "{problem}");
    let others_ok = v["files"].as_array().unwrap().iter().filter(|f| f["file"] != name);
    assert!(others_ok.clone().count() > 0 && others_ok.into_iter().all(|f| f["ok"] == true));
}

#[test]
fn verify_with_a_manifest_catches_one_flipped_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth(&dir);
    write_manifest(&dir);
    let d = dir.to_str().unwrap();
    let ok = sluice(&["verify", d]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("SHA-256 matches"));
    let shard = shards(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() - 10; // inside the last tensor's data, not the header
    bytes[at] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();
    let bad = sluice(&["verify", d]);
    assert!(!bad.status.success());
    let out = text(&bad);
    let name = shard.file_name().unwrap().to_str().unwrap();
    assert!(out.contains(&format!("BAD  {name}: altered: SHA-256")), "{out}");
    assert!(out.contains("1 of"), "{out}");
}

#[test]
fn bench_interleaves_fresh_runs_and_fails_loudly_on_a_token_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth(&dir);
    let d = dir.to_str().unwrap();
    let base = ["bench", "--model", d, "--max-new", "4", "--probe-bytes", "1M"];
    let cfgs = ["--config", "a=--experts stream", "--config", "b=--experts stream --no-prefetch"];
    let o = sluice(
        &[&base[..], &cfgs[..], &["--runs", "2", "--cold", "--fadvise-only", "--json"]].concat(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"], 0);
    let order: Vec<&str> =
        v["runs"].as_array().unwrap().iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(order, ["a", "b", "a", "b"], "configurations interleaved");
    assert!(v["storage_gbps"].as_f64().unwrap() > 0.0, "bandwidth probed in the same run");
    for r in v["runs"].as_array().unwrap() {
        assert_eq!(r["tokens_match"], true);
        assert!(r["decode_ratio"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
    }
    let s = &v["summary"][1]["metrics"]["s_per_pass"];
    assert!(s["min"].as_f64().unwrap() <= s["median"].as_f64().unwrap());
    let oracle = tmp.path().join("oracle.txt");
    std::fs::write(&oracle, "1, 2, 3, 4\n").unwrap();
    let o =
        sluice(&[&base[..], &["--runs", "1", "--oracle-ids", oracle.to_str().unwrap()]].concat());
    assert!(!o.status.success(), "a token mismatch must fail the benchmark");
    assert!(text(&o).contains("TOKEN MISMATCH"), "{}", text(&o));
}
