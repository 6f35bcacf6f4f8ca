//! Stream installs run exactly like full installs: the tiny Kimi K3 fixture is served by a
//! real HTTP hub on 127.0.0.1, pulled once in full and once in stream mode, and both are run
//! greedily. Tokens and logits must be bit-identical; a second stream run must make no
//! request at all; faults during run-time fetches end in the right bytes or a clear error,
//! with nothing wrong ever recorded present; a tiny disk budget evicts and still matches; the
//! spine of a stream install is placed (resident, streamed, a resident prefix) exactly as a
//! full install's, with the same output.

use sluice_engine::load::{self, ExpertMode, LoadOptions, Loaded};
use sluice_engine::plan::SpineMode;
use sluice_engine::{generate, GenerateOptions, Generation, Spine};
use sluice_hub::testhub::{install, k3_tiny_fixture, k3_tiny_hub, Faults, TestHub, K3_TINY_REPO};
use sluice_hub::ModeRequest;
use sluice_store::remote::log::{self, LOG_FILE};
use sluice_store::ExpertStore;
use std::path::{Path, PathBuf};

const PROMPT: [u32; 6] = [1, 17, 42, 99, 5, 23];

fn start_hub() -> TestHub {
    k3_tiny_hub().expect("test hub")
}

fn pull(hub: &TestHub, dir: &Path, mode: ModeRequest) {
    let routed = sluice_engine::install::routed_tensors_in(&k3_tiny_fixture()).expect("routed");
    install(hub, K3_TINY_REPO, dir, mode, &routed).expect("pull");
}

/// The tiny K3 fixture installed from `hub` in full and in stream mode, side by side in a
/// temporary directory (kept while the first value lives): (directory, full, stream).
fn installs(hub: &TestHub) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (full, stream) = (tmp.path().join("full"), tmp.path().join("stream"));
    pull(hub, &full, ModeRequest::Full);
    pull(hub, &stream, ModeRequest::Stream);
    (tmp, full, stream)
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
    generate_on(&loaded)
}

fn generate_on(loaded: &Loaded) -> Result<Generation, String> {
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
            let want = std::fs::read(k3_tiny_fixture().join(orig)).expect("fixture shard");
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
    let (_tmp, full, stream) = installs(&hub);
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
    // Guesses always pass the gate, so the prefetch below reaches the disk cache's decision.
    let opts = LoadOptions { prefetch_min_precision: 0.0, ..options(None) };
    let loaded = load::open(&dir, &opts).expect("opens");
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
    let (issued, skipped) = (store.stats().prefetch_issued, disk.stats().prefetch_skipped);
    store.prefetch(layer, &[far]);
    // The guess is settled inside `prefetch`: skipped because it is not on local disk, and no
    // read queued, so nothing left running could fetch it later.
    assert_eq!(disk.stats().prefetch_skipped, skipped + 1, "the guess was not skipped");
    assert_eq!(store.stats().prefetch_issued, issued, "a read was queued for a remote guess");
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
    let (_tmp, full, dir) = installs(&hub);
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

#[test]
fn stream_install_places_its_spine_like_a_full_install_with_identical_logits() {
    let hub = start_hub();
    let (_tmp, full, stream) = installs(&hub);
    let reference = bits(&run(&full, &options(None)).expect("full install runs"));

    // Every layer streamed, a resident prefix of 1 and of all but one, and all resident: the
    // same placement as the full install gets, and the same bits.
    let layers = 9;
    for (k, resident) in [(0, "0 of 9"), (1, "1 of 9"), (layers - 1, "8 of 9"), (layers, "9 of 9")]
    {
        let opts = LoadOptions { spine_placement: SpineMode::Layers(k), ..options(None) };
        let loaded = load::open(&stream, &opts).expect("stream install opens");
        let plan = loaded.plan.as_ref().expect("a plan").to_string();
        assert!(plan.contains(&format!("spine: {resident} layers resident")), "{k}: {plan}");
        // With no layer resident the head streams too (see `SpineMode::Layers`).
        let streamed = match k {
            0 => format!("{layers} streamed and the lm_head via 2×"),
            _ => format!("{} streamed via {}×", layers - k, (layers - k).min(2)),
        };
        assert_eq!(plan.contains(&streamed), k < layers, "{plan}");
        let want = load::open(&full, &opts).expect("full install opens");
        let (got_spine, want_spine) =
            (&loaded.plan.as_ref().expect("plan").spine, &want.plan.as_ref().expect("plan").spine);
        assert_eq!(
            got_spine.to_string(),
            want_spine.to_string(),
            "{k}: placed unlike a full install"
        );
        assert_eq!(got_spine.charged, want_spine.charged, "{k}: charged unlike a full install");
        drop(want);
        hub.reset_stats();
        let got = generate_on(&loaded).expect("stream install runs");
        assert_eq!(bits(&got), reference, "{k} resident layers: output differs");
        let spine = loaded.spine.as_ref().expect("a placed spine");
        let st = spine.stats();
        if k < layers {
            assert!(st.piece_reads > 0, "{k}: no streamed spine piece was read: {st:?}");
        }
        assert!(st.bytes_read > 0, "{k}: the spine store read nothing: {st:?}");
        if k > 0 {
            // Experts fetched by an earlier placement stay local; the spine never touches the
            // hub.
            let s = hub.stats();
            assert_eq!(s.content_requests, 0, "{k}: a warm run touched the hub: {s:?}");
        }
    }

    // The remote fetch buffers are planned as headroom beyond the full install's.
    let s = load::open(&stream, &options(None)).expect("opens");
    let f = load::open(&full, &options(None)).expect("opens");
    let (sp, fp) = (s.plan.as_ref().expect("plan"), f.plan.as_ref().expect("plan"));
    assert!(sp.needs.headroom > fp.needs.headroom, "{sp} vs {fp}");

    // Mapped in place from the sparse shards, as before.
    let opts = LoadOptions { spine_placement: SpineMode::Mapped, ..options(None) };
    let loaded = load::open(&stream, &opts).expect("opens mapped");
    assert!(loaded.spine.is_none());
    assert!(loaded.plan.as_ref().expect("plan").to_string().contains("spine mapped"));
    assert_eq!(bits(&generate_on(&loaded).expect("runs")), reference);

    // --spine int8 has nothing to run on a stream install: refused with the reason, both where
    // the CLI resolves the directory and where the loader opens it.
    let opts = LoadOptions { spine: Spine::Int8, ..options(None) };
    let e = sluice_engine::spine::resolve(&stream, Spine::Int8).expect_err("int8 refused");
    assert!(
        e.to_string().contains("is a stream install") && e.to_string().contains("--full"),
        "{e}"
    );
    let e = load::open(&stream, &opts).expect_err("int8 refused");
    assert!(e.to_string().contains("is a stream install"), "{e}");
}
