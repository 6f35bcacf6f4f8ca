//! Every fault the hub can throw ends in a verified file or a clear error naming the file:
//! dropped connections, 5xx, 429 with Retry-After, wrong bytes, stalls, ignored ranges —
//! for whole-file pulls, stream pulls and the `RangeFetcher`.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::*;
use sluice_hub::testhub::{Faults, HubRepo, TestHub};
use sluice_hub::{FileOutcome, HubError, ModeRequest, NoProgress, PullOptions, RangeFetcher};

const SHARD: &str = "model-00001-of-00003.safetensors";

fn setup() -> (HubRepo, TestHub, tempfile::TempDir) {
    let repo = synthetic_repo("org/faulty", 256 * 1024, 11);
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    (repo, hub, tempfile::tempdir().expect("tempdir"))
}

fn faults(f: Faults) -> Faults {
    Faults { only_path: Some(SHARD.into()), ..f }
}

/// Pulls `repo` in full with the hub's faults set after planning.
fn pull_with(
    repo: &HubRepo,
    hub: &TestHub,
    dir: &std::path::Path,
    f: Faults,
) -> sluice_hub::Result<sluice_hub::InstallReport> {
    let c = client(hub, None);
    let plan = plan(&c, repo, dir, ModeRequest::Full);
    hub.set_faults(faults(f));
    hub.reset_stats();
    c.pull(&plan, &PullOptions::default(), &NoProgress)
}

fn assert_clean_failure(err: &HubError, dir: &std::path::Path, needle: &str) {
    let text = err.to_string();
    assert!(text.contains(SHARD) && text.contains(needle), "{text}");
    assert!(!dir.join(SHARD).exists(), "nothing unverified under the final name");
}

#[test]
fn connection_dropped_mid_body_resumes_with_range() {
    let (repo, hub, dir) = setup();
    let report = pull_with(
        &repo,
        &hub,
        dir.path(),
        Faults { drops: 2, drop_after: 300_000, ..Faults::default() },
    )
    .expect("pull survives two drops");
    assert_installed(&repo, dir.path());
    assert!(hub.stats().ranges_past_zero >= 2, "{:?}", hub.stats());
    let r = report.files.iter().find(|r| r.path == SHARD).expect("report");
    assert_eq!(
        r.downloaded,
        repo.file(SHARD).expect("file").data.len() as u64,
        "no byte fetched twice"
    );
}

#[test]
fn server_errors_are_retried() {
    let (repo, hub, dir) = setup();
    pull_with(&repo, &hub, dir.path(), Faults { status_500: 3, ..Faults::default() })
        .expect("pull");
    assert_installed(&repo, dir.path());
}

#[test]
fn persistent_server_errors_fail_clearly() {
    let (repo, hub, dir) = setup();
    let err = pull_with(&repo, &hub, dir.path(), Faults { status_500: 1000, ..Faults::default() })
        .expect_err("gives up");
    assert_clean_failure(&err, dir.path(), "HTTP 500");
    // The other files are unaffected.
    assert!(dir.path().join("config.json").is_file());
}

#[test]
fn rate_limit_waits_for_retry_after() {
    let (repo, hub, dir) = setup();
    let t = Instant::now();
    pull_with(&repo, &hub, dir.path(), Faults { status_429: 1, ..Faults::default() })
        .expect("pull");
    assert!(t.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was honoured");
    assert_installed(&repo, dir.path());
}

#[test]
fn wrong_bytes_are_rejected_and_fetched_again() {
    let (repo, hub, dir) = setup();
    pull_with(&repo, &hub, dir.path(), Faults { corrupt: 1, ..Faults::default() }).expect("pull");
    assert_installed(&repo, dir.path());

    let (repo, hub, dir) = setup();
    let err = pull_with(&repo, &hub, dir.path(), Faults { corrupt: 1000, ..Faults::default() })
        .expect_err("always corrupt");
    assert_clean_failure(&err, dir.path(), "SHA-256 mismatch");
    assert!(!dir.path().join(format!("{SHARD}.part")).exists(), "a bad part is deleted");
}

#[test]
fn stalled_response_times_out_and_resumes() {
    let (repo, hub, dir) = setup();
    let c = client_with_timeout(&hub, None, Duration::from_millis(700));
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Full);
    hub.set_faults(faults(Faults {
        stalls: 1,
        drop_after: 200_000,
        stall_for: Duration::from_secs(6),
        ..Faults::default()
    }));
    let t = Instant::now();
    c.pull(&plan, &PullOptions::default(), &NoProgress).expect("pull");
    assert!(t.elapsed() < Duration::from_secs(5), "the stall was cut short by the read timeout");
    assert_installed(&repo, dir.path());
    assert!(hub.stats().ranges_past_zero >= 1);
}

#[test]
fn ignored_range_restarts_from_zero() {
    let (repo, hub, dir) = setup();
    let data = repo.file(SHARD).expect("file").data.clone();
    fs::write(dir.path().join(format!("{SHARD}.part")), &data[..100_000]).expect("part");
    let report =
        pull_with(&repo, &hub, dir.path(), Faults { ignore_range: 1, ..Faults::default() })
            .expect("pull");
    assert_installed(&repo, dir.path());
    let r = report.files.iter().find(|r| r.path == SHARD).expect("report");
    assert_eq!(r.outcome, FileOutcome::Downloaded { resumed_from: 0 }, "the part was discarded");
    assert_eq!(r.downloaded, data.len() as u64, "the whole file came again after the 200");
}

#[test]
fn stream_pull_survives_faults() {
    let (repo, hub, dir) = setup();
    let c = client(&hub, None);
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Stream);
    hub.set_faults(faults(Faults {
        status_500: 1,
        status_429: 1,
        drops: 1,
        drop_after: 1000,
        ..Faults::default()
    }));
    c.pull(&plan, &PullOptions::default(), &NoProgress).expect("stream pull");
    let sparse = fs::read(dir.path().join(format!("{SHARD}.sparse"))).expect("sparse");
    let data = &repo.file(SHARD).expect("file").data;
    let m = sluice_hub::InstallManifest::read(&dir.path().join("sluice-install.json"))
        .expect("manifest");
    let s = m.file(SHARD).and_then(|e| e.stream.as_ref()).expect("stream record");
    for r in &s.ranges {
        let (a, b) = (ix(r.start), ix(r.end));
        assert_eq!(&sparse[a..b], &data[a..b]);
    }
}

#[test]
fn range_fetcher_retries_and_checks_lengths() {
    let (repo, hub, _dir) = setup();
    let c = client(&hub, None);
    let f = RangeFetcher::new(c, &repo.id, &repo.commit).expect("fetcher");
    let data = &repo.file(SHARD).expect("file").data;
    hub.set_faults(faults(Faults { status_500: 2, drops: 1, drop_after: 10, ..Faults::default() }));
    assert_eq!(f.fetch_range(SHARD, 1000, 50_000).expect("range"), data[1000..51_000]);
    let t = Instant::now();
    hub.set_faults(faults(Faults { status_429: 1, ..Faults::default() }));
    assert_eq!(f.fetch_range(SHARD, 7, 9).expect("range"), data[7..16]);
    assert!(t.elapsed() >= Duration::from_secs(1));

    // Later ranges go straight to the remembered CDN URL: one request each, not two.
    hub.reset_stats();
    let before = hub.stats();
    f.fetch_range(SHARD, 0, 8).expect("range");
    assert_eq!(hub.stats().content_requests - before.content_requests, 1);

    let len = data.len() as u64;
    let err = f.fetch_range(SHARD, len - 4, 8).expect_err("past the end");
    assert!(err.to_string().contains(SHARD), "{err}");
    let err = f.fetch_range("missing.bin", 0, 1).expect_err("missing");
    assert!(err.to_string().contains("file not found"), "{err}");
    assert!(f.fetch_range("../x", 0, 1).is_err());
}
