//! `sluice convert`, `sluice run --spine` and `sluice inspect` on a converted fixture, through
//! the binary: the summary, the lossy label in the plan line and in `--json`, and clear
//! refusals of corrupt sources and mismatched spine choices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::sluice;
use std::path::{Path, PathBuf};

/// A copy of K3 fixture `name` in `root/name`.
fn copy_fixture(root: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3").join(name);
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn convert_then_run_labelled_int8() {
    let root = tempfile::tempdir().unwrap();
    let src = copy_fixture(root.path(), "tiny-a");
    let s = src.to_str().unwrap();
    let o = sluice(&["convert", "--spine", "int8", s], root.path());
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("tiny-a-int8") && out.contains("row-int8") && out.contains("LOSSY"),
        "{out}"
    );
    assert!(root.path().join("tiny-a-int8/sluice-int8-manifest.json").is_file());

    // A second run reuses every file.
    let o = sluice(&["convert", "--spine", "int8", s], root.path());
    assert!(text(&o.stdout).contains("0 written"), "{}", text(&o.stdout));

    let run = |spine: &str, dir: &str| {
        sluice(
            &[
                "run",
                "--model",
                dir,
                "--spine",
                spine,
                "--prompt-ids",
                "1,2,3",
                "--max-new",
                "3",
                "--json",
            ],
            root.path(),
        )
    };
    let o = run("int8", s);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("spine int8") && text(&o.stderr).contains("LOSSY"));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["spine"], "int8");
    assert!(v["model"].as_str().unwrap().ends_with("tiny-a-int8"), "{v}");
    let o = run("bf16", s);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["spine"], "bf16");
    assert!(text(&o.stderr).contains("spine bf16"));

    // The converted directory needs the flag; a bad value is named.
    let int8 = root.path().join("tiny-a-int8");
    let o = run("bf16", int8.to_str().unwrap());
    assert!(!o.status.success() && text(&o.stderr).contains("--spine int8"), "{}", text(&o.stderr));
    let o = run("fp8", s);
    assert!(!o.status.success() && text(&o.stderr).contains("possible values: bf16, int8"));

    // inspect names the format.
    for (dir, want) in [(s, "bf16"), (int8.to_str().unwrap(), "int8")] {
        let o = sluice(&["inspect", dir, "--json"], root.path());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["spine_format"], want, "{dir}");
    }
    let o = sluice(&["inspect", int8.to_str().unwrap()], root.path());
    assert!(text(&o.stdout).contains("spine format   int8"), "{}", text(&o.stdout));
}

#[test]
fn convert_refuses_corrupt_sources_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    let shard = "model-00002-of-000003.safetensors";
    // A truncated shard, then a header length pointing past the end of the file.
    type Corrupt = (&'static str, fn(&Path));
    let cases: [Corrupt; 2] = [
        ("truncated", |p| {
            let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            f.set_len(f.metadata().unwrap().len() - 100).unwrap();
        }),
        ("bad header", |p| {
            let mut b = std::fs::read(p).unwrap();
            b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
            std::fs::write(p, b).unwrap();
        }),
    ];
    for (what, damage) in cases {
        let dir = copy_fixture(&root.path().join(what.replace(' ', "-")), "tiny-b");
        damage(&dir.join(shard));
        let out = root.path().join(format!("{}-out", what.replace(' ', "-")));
        let o = sluice(
            &["convert", "--spine", "int8", dir.to_str().unwrap(), "--out", out.to_str().unwrap()],
            root.path(),
        );
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{what}: must fail");
        assert!(err.contains(shard) && !err.contains("panicked"), "{what}: {err}");
        assert!(!out.join("sluice-int8-manifest.json").exists(), "{what}: no manifest");
    }
}
