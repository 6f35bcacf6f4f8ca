//! `--state-cache` across real `sluice run` processes: a second process restores what the first
//! wrote (its counters say how many tokens) with unchanged output, and a process SIGKILLed while
//! a state file is being written leaves nothing that is used afterwards; the next start deletes
//! the temporary file.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::k3_fixture;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The line the state cache's test hook prints before it stops (`SLUICE_STATE_CACHE_PAUSE`).
const PAUSED: &str = "sluice: state cache paused before renaming ";

fn ids(v: &[u32]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 7 + 3) % 100).collect()
}

fn sluice(prompt: &[u32], cache: Option<&Path>, home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args([
        "run",
        "--model",
        &k3_fixture("tiny-a"),
        "--prompt-ids",
        &ids(prompt),
        "--max-new",
        "4",
        "--json",
    ])
    .env("SLUICE_CACHE", home);
    if let Some(d) = cache {
        c.arg("--state-cache").arg(d).args(["--state-cache-every", "8"]);
    }
    c
}

fn run(prompt: &[u32], cache: Option<&Path>, home: &Path) -> Value {
    let o = sluice(prompt, cache, home).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(suffix))
        .collect()
}

#[test]
fn a_second_process_restores_the_first_ones_prompt_state() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(30);
    let first = run(&p, Some(dir.path()), home.path());
    assert_eq!(first["stats"]["state_cache_tokens_restored"], 0);
    let written = first["stats"]["state_cache_bytes_written"].as_u64().unwrap();
    assert!(written > 0);
    let on_disk: u64 =
        files(dir.path(), ".state").iter().map(|f| f.metadata().unwrap().len()).sum();
    assert_eq!(written, on_disk, "the process waited for its writes before exiting");
    // A longer prompt that starts with the first: the first prompt's end is restored.
    let mut q = p.clone();
    q.extend([97, 98, 99]);
    let second = run(&q, Some(dir.path()), home.path());
    assert_eq!(second["stats"]["state_cache_tokens_restored"], 30);
    assert!(second["stats"]["state_cache_bytes_restored"].as_u64().unwrap() > 0);
    assert_eq!(second["generated_ids"], run(&q, None, home.path())["generated_ids"]);
    // Mid-prompt divergence: the last interval boundary (24) before it.
    let mut r = p[..27].to_vec();
    r.extend([98, 97]);
    let third = run(&r, Some(dir.path()), home.path());
    assert_eq!(third["stats"]["state_cache_tokens_restored"], 24);
    assert_eq!(third["generated_ids"], run(&r, None, home.path())["generated_ids"]);
}

#[cfg(unix)]
#[test]
fn sigkill_during_a_state_write_leaves_nothing_used_and_the_next_start_cleans_up() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(30);
    let mut child = sluice(&p, Some(dir.path()), home.path())
        .env("SLUICE_STATE_CACHE_PAUSE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The writer announces the fsynced temporary file on stderr, then stops before the rename;
    // the end of stderr first means the process exited without pausing.
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let tmp = stderr
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            let t = l.strip_prefix(PAUSED).map(PathBuf::from);
            seen.push_str(&l);
            seen.push('\n');
            t
        })
        .unwrap_or_else(|| panic!("sluice exited before pausing: {seen}"));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(tmp.exists(), "the temporary file is left behind");
    assert!(files(dir.path(), ".state").iter().all(|f| f.to_string_lossy().contains(".tmp-")));
    let out = run(&p, Some(dir.path()), home.path());
    assert_eq!(out["stats"]["state_cache_tokens_restored"], 0, "nothing of the killed run is used");
    assert!(!tmp.exists(), "the next start deleted the temporary file");
    assert!(files(dir.path(), ".tmp-").is_empty());
    assert_eq!(out["generated_ids"], run(&p, None, home.path())["generated_ids"]);
}
