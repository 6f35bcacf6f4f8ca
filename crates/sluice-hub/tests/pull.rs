//! End-to-end pulls against a real HTTP hub on 127.0.0.1: full, stream, resume, cache
//! reuse, capacity refusal, disk full and authentication errors.

mod common;

use std::fs;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use common::*;
use sluice_hub::testhub::TestHub;
use sluice_hub::{
    Bars, FileOutcome, FileState, HfCache, HubError, InstallManifest, LocalState, Mode,
    ModeRequest, NoProgress, PlanOptions, PullOptions, ShardHeader, StatvfsFreeSpace, Verdict,
};

#[test]
fn resolve_pins_commit_and_lists_sizes_and_hashes() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    hub.set_tree_page_size(2);
    let info = client(&hub, None).resolve(&repo.id, "main").expect("resolve");
    assert_eq!(info.commit, repo.commit);
    assert_eq!(info.files.len(), repo.files.len());
    for f in &repo.files {
        let r = info.files.iter().find(|r| r.path == f.path).expect("listed");
        assert_eq!(r.size, f.data.len() as u64);
        assert_eq!(r.sha256, f.lfs.then(|| f.sha256()), "{}", f.path);
        assert_eq!(r.git_oid.as_deref(), Some(f.git_oid().as_str()));
    }
    // The tree listing took several pages.
    assert!(hub.stats().api_requests > 3);
    let by_commit = client(&hub, None).resolve(&repo.id, &repo.commit).expect("by commit");
    assert_eq!(by_commit.files, info.files);
    let err = client(&hub, None).resolve(&repo.id, "v9").expect_err("no such revision");
    assert!(err.to_string().contains("revision not found"), "{err}");
}

#[test]
fn full_pull_of_fixture_is_byte_identical_and_verified() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    hub.require_token(Some("hf_secret"));
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client(&hub, Some("hf_secret"));
    let info = c.resolve(&repo.id, "main").expect("resolve");
    // The real volume: the fixture is tiny, so it fits anywhere with 1 GiB of headroom.
    let plan =
        c.plan(&info, &opts(dir.path(), ModeRequest::Full), &StatvfsFreeSpace).expect("plan");
    assert_eq!(plan.mode, Mode::Full);
    let report = c.pull(&plan, &PullOptions::default(), &NoProgress).expect("pull");
    assert_installed(&repo, dir.path());
    assert_eq!(report.bytes_downloaded, info.total_size());
    assert!(report
        .files
        .iter()
        .all(|f| matches!(f.outcome, FileOutcome::Downloaded { resumed_from: 0 })));
    let m = InstallManifest::read(&dir.path().join("sluice-install.json")).expect("manifest");
    assert!(m.complete);
    assert_eq!((m.commit.as_str(), m.mode), (repo.commit.as_str(), Mode::Full));
    for f in &repo.files {
        let e = m.file(&f.path).expect("entry");
        assert_eq!((e.state, e.size), (FileState::Full, f.data.len() as u64));
        assert_eq!(e.sha256.as_deref(), Some(f.sha256().as_str()), "{}", f.path);
    }
    let s = hub.stats();
    assert_eq!(s.cdn_auth_headers, 0, "the token must not follow the redirect to the CDN");
    assert!(s.authorized_requests > 0);

    // A second pull finds everything in place and downloads nothing.
    hub.reset_stats();
    let plan = c.plan(&info, &opts(dir.path(), ModeRequest::Full), &FakeSpace(0)).expect("plan");
    assert_eq!(plan.verdict, Verdict::Fits, "nothing to download needs no space");
    let again = c.pull(&plan, &PullOptions::default(), &NoProgress).expect("again");
    assert_eq!(again.bytes_downloaded, 0);
    assert_eq!(hub.stats().content_bytes, 0);
    assert!(again.files.iter().all(|f| matches!(f.outcome, FileOutcome::Present { .. })));
}

#[test]
fn full_pull_into_hf_cache_writes_blobs_snapshots_and_refs() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let root = tempfile::tempdir().expect("tempdir");
    let cache = HfCache::new(root.path());
    let c = client(&hub, None);
    let repo_dir = cache.repo_dir(&repo.id);
    let plan = plan(&c, &repo, &repo_dir, ModeRequest::Full);
    let report = c.pull(&plan, &PullOptions::default(), &NoProgress).expect("pull");
    let snap = cache.snapshot_dir(&repo.id, &repo.commit);
    assert_eq!(report.model_dir, snap);
    assert_installed(&repo, &snap);
    for f in &repo.files {
        let etag = if f.lfs { f.sha256() } else { f.git_oid() };
        assert!(cache.blob_path(&repo.id, &etag).is_file(), "blob of {}", f.path);
        let link = fs::read_link(snap.join(&f.path)).expect("snapshot entry is a symlink");
        assert!(
            link.is_relative() && link.ends_with(format!("blobs/{etag}")),
            "{}",
            link.display()
        );
    }
    assert_eq!(cache.read_ref(&repo.id, "main").as_deref(), Some(repo.commit.as_str()));
    assert!(snap.join("sluice-install.json").is_file());
}

#[test]
fn stream_pull_fetches_headers_and_spine_only() {
    let repo = synthetic_repo("org/moe", 64 * 1024, 7);
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client(&hub, None);
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Stream);
    assert_eq!(plan.mode, Mode::Stream);
    assert!(plan.stream.total < plan.full.total / 4, "{:?} vs {:?}", plan.stream, plan.full);
    hub.reset_stats();
    let report = c.pull(&plan, &PullOptions::default(), &NoProgress).expect("pull");
    assert_eq!(hub.stats().content_bytes, report.bytes_downloaded);
    assert_eq!(report.bytes_downloaded, plan.stream.to_download, "the plan predicted the bytes");

    let m = InstallManifest::read(&dir.path().join("sluice-install.json")).expect("manifest");
    assert!(m.complete && m.mode == Mode::Stream);
    for f in &repo.files {
        let e = m.file(&f.path).expect("entry");
        let has_experts = f.path.starts_with("model-0000") && !f.path.starts_with("model-00003");
        if !has_experts {
            // Config files and the shard without experts are installed whole.
            assert_eq!(e.state, FileState::Full, "{}", f.path);
            assert_eq!(fs::read(dir.path().join(&f.path)).expect("read"), *f.data);
            continue;
        }
        assert_eq!(e.state, FileState::Stream, "{}", f.path);
        assert!(!dir.path().join(&f.path).exists(), "no full copy of {}", f.path);
        let s = e.stream.as_ref().expect("stream record");
        let header = fs::read(dir.path().join(&s.header)).expect("header");
        let h = ShardHeader::parse(&f.path, header.clone(), f.data.len() as u64, &routed_in(&repo))
            .expect("parse");
        assert_eq!(header.as_slice(), &f.data[..header.len()]);
        let sparse = fs::read(dir.path().join(&s.sparse)).expect("sparse");
        assert_eq!(sparse.len(), f.data.len());
        assert_eq!(&sparse[..header.len()], &f.data[..header.len()]);
        // Every non-expert tensor is present at its offset; expert bytes are holes.
        for t in &h.tensors {
            let (a, b) = (ix(t.span.start), ix(t.span.end));
            if t.routed_expert {
                assert!(sparse[a..b].iter().all(|&x| x == 0), "{} was downloaded", t.name);
            } else {
                assert_eq!(&sparse[a..b], &f.data[a..b], "{}", t.name);
                assert!(s.ranges.iter().any(|r| r.start <= t.span.start && t.span.end <= r.end));
            }
        }
        assert_eq!(s.expert_bytes, h.expert_bytes());
        assert!(!t_name_contains(&h, "shared_experts", true));
    }
    assert!(report.bytes_downloaded < plan.full.total / 4);

    // Pulling again in stream mode downloads nothing.
    hub.reset_stats();
    let again = c
        .pull(
            &common::plan(&c, &repo, dir.path(), ModeRequest::Stream),
            &PullOptions::default(),
            &NoProgress,
        )
        .expect("again");
    assert_eq!((again.bytes_downloaded, hub.stats().content_bytes), (0, 0));
    assert!(again.files.iter().any(|f| f.outcome == FileOutcome::AlreadyStreamed));

    // Upgrading to full replaces the stream files with verified shards.
    let full = c
        .pull(
            &common::plan(&c, &repo, dir.path(), ModeRequest::Full),
            &PullOptions::default(),
            &NoProgress,
        )
        .expect("full");
    assert_eq!(full.mode, Mode::Full);
    assert_installed(&repo, dir.path());
    assert!(!dir.path().join("model-00001-of-00003.safetensors.sparse").exists());
}

/// Whether any tensor whose name contains `needle` is classified as a routed expert.
fn t_name_contains(h: &ShardHeader, needle: &str, routed: bool) -> bool {
    h.tensors.iter().any(|t| t.name.contains(needle) && t.routed_expert == routed)
}

#[test]
fn resume_from_partial_part_uses_range() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "model-00003-of-000003.safetensors";
    let f = repo.file(name).expect("file");
    let half = f.data.len() / 2;
    fs::write(dir.path().join(format!("{name}.part")), &f.data[..half]).expect("part");
    let c = client(&hub, None);
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Full);
    let p = plan.files.iter().find(|p| p.file.path == name).expect("planned");
    assert_eq!(p.local, LocalState::Partial(half as u64));
    assert_eq!(plan.full.to_download, plan.full.total - half as u64);
    hub.reset_stats();
    // The terminal bars (hidden here, as stderr is not a terminal) take the same events.
    let report = c.pull(&plan, &PullOptions::default(), &Bars::new()).expect("pull");
    assert_installed(&repo, dir.path());
    let r = report.files.iter().find(|r| r.path == name).expect("report");
    assert_eq!(r.outcome, FileOutcome::Downloaded { resumed_from: half as u64 });
    assert_eq!(r.downloaded, (f.data.len() - half) as u64);
    assert_eq!(hub.stats().ranges_past_zero, 1);
}

#[test]
fn corrupt_partial_part_is_rejected_then_fetched_clean() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "model-00001-of-000003.safetensors";
    fs::write(dir.path().join(format!("{name}.part")), vec![0xAB; 1000]).expect("part");
    let c = client(&hub, None);
    let report = c.pull(
        &plan(&c, &repo, dir.path(), ModeRequest::Full),
        &PullOptions::default(),
        &NoProgress,
    );
    report.expect("a SHA mismatch deletes the part and the retry starts from zero");
    assert_installed(&repo, dir.path());
}

#[test]
fn hf_cache_reuse_downloads_zero_bytes() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let cache_root = tempfile::tempdir().expect("cache");
    let cache = HfCache::new(cache_root.path());
    // Populate the cache the way huggingface_hub would have.
    for f in &repo.files {
        let etag = if f.lfs { f.sha256() } else { f.git_oid() };
        let blob = cache.blob_path(&repo.id, &etag);
        fs::create_dir_all(blob.parent().expect("parent")).expect("mkdir");
        fs::write(&blob, f.data.as_slice()).expect("blob");
        cache.link_snapshot(&repo.id, &repo.commit, &f.path, &etag).expect("link");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client(&hub, None);
    let info = c.resolve(&repo.id, "main").expect("resolve");
    let o = PlanOptions { reuse_cache: Some(cache.clone()), ..opts(dir.path(), ModeRequest::Full) };
    let plan = c.plan(&info, &o, &FakeSpace(0)).expect("plan");
    assert_eq!(plan.full.to_download, 0);
    assert!(plan.files.iter().all(|p| matches!(p.local, LocalState::InCache(_))));
    hub.reset_stats();
    let deep = PullOptions { deep_verify: true, ..PullOptions::default() };
    let report = c.pull(&plan, &deep, &NoProgress).expect("pull");
    assert_eq!((report.bytes_downloaded, hub.stats().content_bytes), (0, 0));
    assert_eq!(report.bytes_reused, info.total_size());
    assert!(report
        .files
        .iter()
        .all(|r| matches!(r.outcome, FileOutcome::Linked { hashed: true, .. })));
    assert_installed(&repo, dir.path());
}

#[test]
fn capacity_refusal_names_the_shortfall() {
    let repo = synthetic_repo("org/moe", 256 * 1024, 3);
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("model");
    let c = client(&hub, None);
    let info = c.resolve(&repo.id, "main").expect("resolve");
    let probe = c
        .plan(&info, &opts_for(&repo, &target, ModeRequest::Auto), &FakeSpace(u64::MAX))
        .expect("plan");
    let (full, stream) = (probe.full.required, probe.stream.required);
    assert!(stream < full);

    let free = stream + 10;
    let refused = c
        .plan(&info, &opts_for(&repo, &target, ModeRequest::Full), &FakeSpace(free))
        .expect("plan");
    assert_eq!(refused.verdict, Verdict::Refused { shortfall: full - free });
    let shown = refused.to_string();
    assert!(shown.contains("short by"), "{shown}");
    let err = c.pull(&refused, &PullOptions::default(), &NoProgress).expect_err("refused");
    assert!(
        matches!(err, HubError::InsufficientSpace { shortfall, .. } if shortfall == full - free)
    );
    assert!(err.to_string().contains("short by"), "{err}");
    assert!(!target.exists(), "a refused plan writes nothing");

    let auto = c
        .plan(&info, &opts_for(&repo, &target, ModeRequest::Auto), &FakeSpace(free))
        .expect("plan");
    assert_eq!(auto.mode, Mode::Stream);
    assert_eq!(auto.verdict, Verdict::StreamFallback { full_shortfall: full - free });
    assert!(auto.to_string().contains("mode        stream"), "{auto}");
    let fits = c
        .plan(&info, &opts_for(&repo, &target, ModeRequest::Auto), &FakeSpace(full))
        .expect("plan");
    assert_eq!((fits.mode, fits.verdict), (Mode::Full, Verdict::Fits));
    let none = c
        .plan(&info, &opts_for(&repo, &target, ModeRequest::Auto), &FakeSpace(stream - 1))
        .expect("plan");
    assert_eq!(none.verdict, Verdict::Refused { shortfall: 1 });
}

#[test]
fn disk_full_leaves_no_published_file() {
    let repo = synthetic_repo("org/moe", 256 * 1024, 5);
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client(&hub, None);
    let plan = plan(&c, &repo, dir.path(), ModeRequest::Full);
    let sinks = Arc::new(FullDisk { budget: Arc::new(AtomicU64::new(600 * 1024)) });
    let o = PullOptions { sinks, workers: 1, ..PullOptions::default() };
    let err = c.pull(&plan, &o, &NoProgress).expect_err("disk full");
    let HubError::Incomplete { failures } = &err else { panic!("{err}") };
    assert!(matches!(failures[0].error, HubError::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk full while writing model-0000"), "{err}");
    for f in &repo.files {
        let path = dir.path().join(&f.path);
        if path.exists() {
            assert_eq!(
                fs::read(&path).expect("read"),
                *f.data,
                "only verified files are published"
            );
        }
    }
    let failed = &failures[0].file;
    assert!(!dir.path().join(failed).exists(), "{failed} must not be published");
    assert!(dir.path().join(format!("{failed}.part")).exists(), "{failed}.part is kept for resume");
    let m = InstallManifest::read(&dir.path().join("sluice-install.json")).expect("manifest");
    assert!(!m.complete);

    // With space again, the same pull finishes from where it stopped.
    let again = c.pull(
        &common::plan(&c, &repo, dir.path(), ModeRequest::Full),
        &PullOptions::default(),
        &NoProgress,
    );
    again.expect("resumed");
    assert_installed(&repo, dir.path());
}

#[test]
fn auth_errors_are_clear() {
    let repo = fixture_repo();
    let hub = TestHub::start(vec![repo.clone()]).expect("hub");
    hub.require_token(Some("hf_good"));
    let msg = |token: Option<&str>, id: &str| {
        client(&hub, token).resolve(id, "main").expect_err("must fail").to_string()
    };
    let m = msg(None, &repo.id);
    assert!(m.contains("401") && m.contains("set HF_TOKEN"), "{m}");
    let m = msg(Some("hf_bad"), &repo.id);
    assert!(m.contains("401") && m.contains("rejected"), "{m}");
    let m = msg(Some("hf_good"), "org/missing");
    assert!(m.contains("404") && m.contains("repository not found"), "{m}");
    hub.set_gated(true);
    let m = msg(Some("hf_good"), &repo.id);
    assert!(m.contains("403") && m.contains("gated"), "{m}");
    let bad = client(&hub, None).resolve("../etc", "main").expect_err("bad id");
    assert!(matches!(bad, HubError::InvalidRepo { .. }));
}
