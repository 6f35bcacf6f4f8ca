//! A pull killed with SIGKILL mid-download, then run again, resumes from its `.part` and
//! ends byte-identical and verified.
//!
//! The test re-executes its own binary as the child (`--ignored --exact pull_child_process`)
//! with the hub's address in the environment, so the child is a real separate process that
//! dies without any chance to clean up.

mod common;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use common::*;
use sluice_hub::testhub::{Faults, TestHub};
use sluice_hub::{
    FileOutcome, HubClient, HubConfig, InstallManifest, LocalState, ModeRequest, NoProgress,
    Progress, PullOptions,
};

const ENV_ENDPOINT: &str = "SLUICE_HUB_CHILD_ENDPOINT";
const ENV_DIR: &str = "SLUICE_HUB_CHILD_DIR";
const REPO: &str = "org/killme";

/// Runs only as the child of `sigkill_mid_download_then_rerun_resumes_byte_identical`.
#[test]
#[ignore = "child process of sigkill_mid_download_then_rerun_resumes_byte_identical"]
fn pull_child_process() {
    let (Ok(endpoint), Ok(dir)) = (std::env::var(ENV_ENDPOINT), std::env::var(ENV_DIR)) else {
        return;
    };
    let c = HubClient::new(HubConfig::new(endpoint)).expect("client");
    let info = c.resolve(REPO, "main").expect("resolve");
    let o = opts(Path::new(&dir), ModeRequest::Full);
    let plan = c.plan(&info, &o, &FakeSpace(1 << 50)).expect("plan");
    let one = PullOptions { workers: 1, ..PullOptions::default() };
    c.pull(&plan, &one, &Announce::default()).expect("pull");
}

/// The line the child prints on stdout once a file has 1 MiB on disk.
const MIB_ON_DISK: &str = "sluice-hub child: 1 MiB of a file on disk";

/// Progress that prints [`MIB_ON_DISK`] once, when a file's bytes on disk (what was local at
/// its start plus what arrived: the pull reports bytes after writing them) reach 1 MiB.
#[derive(Default)]
struct Announce {
    files: Mutex<HashMap<String, u64>>,
    said: AtomicBool,
}

impl Progress for Announce {
    fn file_start(&self, path: &str, _len: u64, done: u64) {
        self.files.lock().expect("lock").insert(path.to_owned(), done);
    }

    fn bytes(&self, path: &str, n: u64) {
        let mut files = self.files.lock().expect("lock");
        let on_disk = files.entry(path.to_owned()).or_default();
        *on_disk += n;
        if *on_disk >= 1 << 20 && !self.said.swap(true, Ordering::Relaxed) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{MIB_ON_DISK}");
            let _ = out.flush();
        }
    }
}

fn part_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
                .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigkill_mid_download_then_rerun_resumes_byte_identical() {
    let repo = synthetic_repo(REPO, 512 * 1024, 21);
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    // Slow enough that the child is surely mid-file when killed.
    hub.set_faults(Faults { throttle: Some(4 << 20), ..Faults::default() });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", "pull_child_process", "--nocapture", "--test-threads=1"])
        .env(ENV_ENDPOINT, hub.endpoint())
        .env(ENV_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    // The event: the child's line on its stdout (a pipe); the end of the pipe first means it
    // finished (or failed) before it was killed. The timeout only keeps a regression from
    // hanging the suite.
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // The harness's `test pull_child_process ... ` may start the same line.
        let seen = stdout.lines().map_while(Result::ok).any(|l| l.ends_with(MIB_ON_DISK));
        let _ = tx.send(seen);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(true) => {}
        Ok(false) => panic!("the child finished before it got 1 MiB into a file"),
        Err(_) => {
            let _ = child.kill();
            panic!("the child never got 1 MiB into a file");
        }
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert!(!status.success());

    let parts = part_files(dir.path());
    assert!(!parts.is_empty());
    for (part, _) in &parts {
        let name =
            part.file_name().expect("name").to_string_lossy().trim_end_matches(".part").to_owned();
        assert!(!dir.path().join(&name).exists(), "{name} must not be published while partial");
    }
    let m =
        InstallManifest::read(&dir.path().join("sluice-install.json")).expect("pinned manifest");
    assert!(!m.complete);
    assert_eq!(m.commit, repo.commit);

    hub.set_faults(Faults::default());
    hub.reset_stats();
    let c = client(&hub, None);
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Full);
    assert!(plan.files.iter().any(|p| matches!(p.local, LocalState::Partial(n) if n >= 1 << 20)));
    let report = c.pull(&plan, &PullOptions::default(), &NoProgress).expect("resumed pull");
    assert_installed(&repo, dir.path());
    assert!(report.files.iter().any(
        |r| matches!(r.outcome, FileOutcome::Downloaded { resumed_from } if resumed_from >= 1 << 20)
    ));
    assert!(hub.stats().ranges_past_zero >= 1, "the rerun continued with a Range request");
    let total: u64 = repo.files.iter().map(|f| f.data.len() as u64).sum();
    assert!(report.bytes_downloaded < total, "bytes from before the kill were kept");
    let m = InstallManifest::read(&dir.path().join("sluice-install.json")).expect("manifest");
    assert!(m.complete);
    for f in repo.files.iter().filter(|f| f.lfs) {
        assert_eq!(m.file(&f.path).and_then(|e| e.sha256.clone()), Some(f.sha256()));
    }
}
