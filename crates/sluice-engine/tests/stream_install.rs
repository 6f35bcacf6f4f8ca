//! Stream installs run exactly like full installs: the tiny Kimi K3 fixture is served by a
//! real HTTP hub on 127.0.0.1, pulled once in full and once in stream mode, and both are run
//! greedily. Tokens and logits must be bit-identical; a second stream run must make no
//! request at all; faults during run-time fetches end in the right bytes or a clear error,
//! with nothing wrong ever recorded present; a tiny disk budget evicts and still matches.

use sluice_engine::load::{self, ExpertMode, LoadOptions};
use sluice_engine::{generate, GenerateOptions, Generation};
use sluice_hub::testhub::{Faults, HubRepo, TestHub};
use sluice_hub::{
    HubClient, HubConfig, ModeRequest, NoProgress, PlanOptions, PullOptions, RetryPolicy,
    StatvfsFreeSpace,
};
use sluice_store::remote::log::{self, LOG_FILE};
use sluice_store::ExpertStore;
use std::path::{Path, PathBuf};
use std::time::Duration;

const REPO: &str = "moonshotai/Kimi-K3-tiny";
const PROMPT: [u32; 6] = [1, 17, 42, 99, 5, 23];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a")
}

fn start_hub() -> TestHub {
    TestHub::start(vec![HubRepo::from_dir(REPO, &fixture()).expect("fixture repo")])
        .expect("test hub")
}

fn pull(hub: &TestHub, dir: &Path, mode: ModeRequest) {
    let mut cfg = HubConfig::new(hub.endpoint());
    cfg.retry = RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        max_retry_after: Duration::from_secs(5),
    };
    let client = HubClient::new(cfg).expect("client");
    let info = client.resolve(REPO, "main").expect("resolve");
    let opts = PlanOptions {
        mode,
        dir: Some(dir.to_path_buf()),
        reuse_cache: None,
        workers: 2,
        coalesce_gap: 4096,
    };
    let plan = client.plan(&info, &opts, &StatvfsFreeSpace).expect("plan");
    client.pull(&plan, &PullOptions::default(), &NoProgress).expect("pull");
}

fn options(disk_cache: Option<u64>) -> LoadOptions {
    LoadOptions {
        memory: Some(1 << 30),
        experts: ExpertMode::Auto,
        slots: Some(3),
        disk_cache,
        ..LoadOptions::default()
    }
}

fn run(dir: &Path, opts: &LoadOptions) -> Result<Generation, String> {
    let loaded = load::open(dir, opts).map_err(|e| e.to_string())?;
    let mut state = loaded.model.new_state();
    let g = GenerateOptions { max_new: 8, keep_logits: true, ..GenerateOptions::default() };
    generate(&loaded.model, &mut state, &PROMPT, &g, None, None).map_err(|e| e.to_string())
}

fn bits(g: &Generation) -> (Vec<u32>, Vec<Vec<u32>>) {
    let logits = g.logits.iter().map(|row| row.iter().map(|x| x.to_bits()).collect()).collect();
    (g.tokens.clone(), logits)
}

/// Every expert the log records present has exactly the published bytes (and SHA) in place.
fn assert_log_truthful(dir: &Path) -> usize {
    let st = log::read(&dir.join(LOG_FILE)).expect("read log").expect("log exists");
    for p in &st.present {
        let mut got = Vec::new();
        for s in &p.spans {
            let data = std::fs::read(dir.join(&s.shard)).expect("sparse shard");
            let orig = s.shard.trim_end_matches(".sparse");
            let want = std::fs::read(fixture().join(orig)).expect("fixture shard");
            let r = usize::try_from(s.offset).expect("offset")
                ..usize::try_from(s.offset + s.len).expect("end");
            assert!(
                data[r.clone()] == want[r],
                "expert {}/{} recorded but wrong",
                p.layer,
                p.expert
            );
            got.extend_from_slice(
                &data[usize::try_from(s.offset).expect("o")..]
                    [..usize::try_from(s.len).expect("l")],
            );
        }
        use sha2::Digest;
        let sha: String = sha2::Sha256::digest(&got).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha, p.sha256, "recorded SHA-256 of {}/{}", p.layer, p.expert);
    }
    st.present.len()
}

#[test]
fn stream_install_matches_full_install_bit_for_bit_and_warm_runs_stay_offline() {
    let hub = start_hub();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (full, stream) = (tmp.path().join("full"), tmp.path().join("stream"));
    pull(&hub, &full, ModeRequest::Full);
    pull(&hub, &stream, ModeRequest::Stream);
    assert!(
        stream.join("model-00001-of-000003.safetensors.sparse").exists()
            || std::fs::read_dir(&stream)
                .expect("dir")
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".sparse"))
    );

    let reference = run(&full, &options(None)).expect("full install runs");
    hub.reset_stats();
    let cold = run(&stream, &options(None)).expect("stream install runs");
    assert_eq!(bits(&cold), bits(&reference), "cold stream run differs from the full install");
    let cold_stats = hub.stats();
    assert!(cold_stats.range_requests > 0, "the cold run fetched experts: {cold_stats:?}");
    assert!(assert_log_truthful(&stream) > 0);

    hub.reset_stats();
    let warm = run(&stream, &options(None)).expect("warm stream run");
    assert_eq!(bits(&warm), bits(&reference), "warm stream run differs");
    let s = hub.stats();
    assert_eq!((s.api_requests, s.content_requests), (0, 0), "a warm run touched the hub: {s:?}");
}

#[test]
fn adjacent_missing_experts_are_one_request_and_prefetch_never_fetches() {
    let hub = start_hub();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("stream");
    pull(&hub, &dir, ModeRequest::Stream);
    let loaded = load::open(&dir, &options(None)).expect("opens");
    let store = loaded.streaming.as_ref().expect("streams");
    let disk = store.disk_cache().expect("disk cache").clone();
    let index = store.index();
    // Two experts adjacent on disk, and one that is not next to either.
    let layer = (0..index.num_layers()).find(|&l| index.experts(l) > 0).expect("a MoE layer");
    let end = |e: u32| index.get(layer, e).map(|l| l.spans()[0].offset + l.spans()[0].len);
    let start = |e: u32| index.get(layer, e).map(|l| l.spans()[0].offset);
    let n = u32::try_from(index.experts(layer)).expect("count");
    let (a, b) = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .find(|&(a, b)| a != b && end(a) == start(b))
        .expect("two adjacent experts");
    let far = (0..n).find(|&c| c != a && c != b && end(c) != start(a) && end(b) != start(c));
    let far = far.expect("a third expert");

    hub.reset_stats();
    store.prefetch(layer, &[far]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(hub.stats().content_requests, 0, "a prefetch guess was fetched remotely");
    assert!(!disk.is_present(layer, far));

    let mut seen = Vec::new();
    store
        .for_each(layer, &[a, b], &mut |id, _| {
            seen.push(id);
            Ok(())
        })
        .expect("served");
    seen.sort_unstable();
    assert_eq!(seen, {
        let mut v = vec![a, b];
        v.sort_unstable();
        v
    });
    let r = disk.stats();
    assert_eq!((r.requests, r.experts_fetched), (1, 2), "{r:?}");
    assert_eq!(hub.stats().range_requests, 1);
    assert!(disk.is_present(layer, a) && disk.is_present(layer, b));
}

#[test]
fn faults_during_run_time_fetches_end_right_or_in_a_clear_error() {
    let hub = start_hub();
    let tmp = tempfile::tempdir().expect("tempdir");
    let full = tmp.path().join("full");
    pull(&hub, &full, ModeRequest::Full);
    let reference = bits(&run(&full, &options(None)).expect("full install runs"));
    let recoverable = [
        ("5xx then success", Faults { status_500: 2, ..Faults::default() }),
        ("429 with Retry-After", Faults { status_429: 1, ..Faults::default() }),
        ("dropped connection", Faults { drops: 2, drop_after: 700, ..Faults::default() }),
    ];
    for (i, (what, faults)) in recoverable.into_iter().enumerate() {
        let dir = tmp.path().join(format!("s{i}"));
        pull(&hub, &dir, ModeRequest::Stream);
        hub.set_faults(faults);
        let got = run(&dir, &options(None)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(bits(&got), reference, "{what}: output differs");
        assert_log_truthful(&dir);
        hub.set_faults(Faults::default());
    }

    // A wrong-length answer is refused for that request; nothing of it is recorded.
    let dir = tmp.path().join("short");
    pull(&hub, &dir, ModeRequest::Stream);
    hub.set_faults(Faults { short_ranges: 1, ..Faults::default() });
    let err = run(&dir, &options(None)).expect_err("a wrong-length answer fails the run");
    assert!(err.contains("from the hub failed") && err.contains("Content-Length"), "{err}");
    assert_log_truthful(&dir);
    hub.set_faults(Faults::default());
    let again = run(&dir, &options(None)).expect("runs once the hub answers right");
    assert_eq!(bits(&again), reference);
    assert_log_truthful(&dir);
}

#[test]
fn a_tiny_disk_budget_evicts_and_keeps_output_identical() {
    let hub = start_hub();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (full, dir) = (tmp.path().join("full"), tmp.path().join("stream"));
    pull(&hub, &full, ModeRequest::Full);
    pull(&hub, &dir, ModeRequest::Stream);
    let reference = bits(&run(&full, &options(None)).expect("full install runs"));
    let probe = load::open(&dir, &options(None)).expect("opens");
    let expert = probe
        .streaming
        .as_ref()
        .and_then(|s| s.index().get(1, 0).or_else(|| s.index().get(2, 0)).map(|l| l.bytes()))
        .expect("an expert");
    drop(probe);
    let budget = expert * 3;
    let loaded = load::open(&dir, &options(Some(budget))).expect("opens with a tiny budget");
    let mut state = loaded.model.new_state();
    let g = GenerateOptions { max_new: 8, keep_logits: true, ..GenerateOptions::default() };
    let out = generate(&loaded.model, &mut state, &PROMPT, &g, None, None).expect("runs");
    assert_eq!(bits(&out), reference, "eviction changed the output");
    let disk = loaded.streaming.as_ref().and_then(|s| s.disk_cache()).expect("disk cache");
    let r = disk.stats();
    assert!(r.evictions > 0, "nothing was evicted: {r:?}");
    assert!(disk.present().1 <= budget);
    drop(loaded);
    assert!(assert_log_truthful(&dir) <= 3);

    // Smaller than one expert: refused at open, naming the flag.
    let err = load::open(&dir, &options(Some(expert - 1))).expect_err("too small");
    assert!(err.to_string().contains("--disk-cache"), "{err}");
}
