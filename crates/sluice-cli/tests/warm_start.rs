//! Warm starts end to end: `sluice run` saves the hot set next to a streamed model, the next
//! run reads it back, and neither that nor a corrupt hot-set file changes a single logit; a
//! corrupt file is named in a warning; `--no-warm-start` neither reads nor writes one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture_copy(to: &Path) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    let dir = to.join("tiny-a");
    std::fs::create_dir_all(&dir).expect("dir");
    for e in std::fs::read_dir(&from).expect("fixture") {
        let e = e.expect("entry");
        // The checkpoint's own files only: other tests run sluice on the committed fixture in
        // place, which leaves its hot set there (`.sluice-hotset.json`, git-ignored); copied,
        // it made this test's "no hot set yet" run find one (CI, session 15).
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    dir
}

fn run(model: &Path, cache: &Path, logits: &Path, extra: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--model", model.to_str().expect("utf-8")])
        .args(["--experts", "stream", "--cache-slots", "6", "--buffered-io"])
        .args(["--prompt-ids", "60,61,62,63", "--max-new", "6", "--dump-logits"])
        .arg(logits)
        .args(extra)
        .env("SLUICE_CACHE", cache)
        .output()
        .expect("runs sluice");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_hot_set_good_or_corrupt_never_changes_the_logits() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = fixture_copy(tmp.path());
    let cache = tmp.path().join("cache");
    let hot = model.join(".sluice-hotset.json");
    let l = |n: &str| tmp.path().join(format!("{n}.npy"));

    let o = run(&model, &cache, &l("off"), &["--no-warm-start"]);
    assert!(!hot.exists(), "--no-warm-start writes no hot set");
    assert!(!stderr(&o).contains("warm start"), "{}", stderr(&o));
    let cold = run(&model, &cache, &l("cold"), &[]);
    assert!(!stderr(&cold).contains("warm start"), "no file yet: {}", stderr(&cold));
    assert!(hot.exists(), "the first run saved its hot set");

    let warm = run(&model, &cache, &l("warm"), &[]);
    assert!(stderr(&warm).contains("sluice: warm start: reading"), "{}", stderr(&warm));

    std::fs::write(&hot, b"\x00\x01 not json").expect("corrupt it");
    let bad = run(&model, &cache, &l("corrupt"), &[]);
    let e = stderr(&bad);
    assert!(
        e.contains("warning: warm start") && e.contains("corrupt") && e.contains("ignored"),
        "{e}"
    );

    let off = std::fs::read(l("off")).expect("logits");
    for n in ["cold", "warm", "corrupt"] {
        assert!(std::fs::read(l(n)).expect("logits") == off, "{n} run's logits differ");
    }
}

#[test]
fn json_stdout_holds_only_the_object_and_machine_figures_go_to_stderr() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = fixture_copy(tmp.path());
    let o =
        run(&model, &tmp.path().join("cache"), &tmp.path().join("l.npy"), &["--json", "--stats"]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON object");
    let m = &v["machine"];
    assert!(m["expert_read_bytes"].as_u64().is_some_and(|b| b > 0), "{m}");
    assert!(m["budget_bytes"].is_u64() && m["seconds"].is_f64(), "{m}");
    if cfg!(target_os = "linux") {
        assert!(m["process_written_bytes"].is_u64() && m["major_faults"].is_u64(), "{m}");
    }
    assert!(stderr(&o).contains("\nmachine: "), "{}", stderr(&o));
}
