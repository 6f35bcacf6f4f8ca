//! Stream installs of every family with an expert layout, not only Kimi K3: the committed tiny
//! Qwen3-MoE (whole bf16 tensors per expert), GPT-OSS (experts stacked `[E, ...]` in MXFP4
//! tensors) and DeepSeek-V3 fixtures (FP8 weights with block scales; Kimi K2 Thinking's INT4
//! pack-quantized experts) are served by a real HTTP hub on 127.0.0.1, pulled in full and in
//! stream mode with the routed experts the family's layout names (from `config.json` alone),
//! and run greedily: tokens and logits are bit-identical to the full install mapped in place,
//! also with the spine streamed layer by layer from the sparse shards, a warm run makes no
//! request, and a wrong-length range from the hub fails the run with an error naming the shard
//! it was for.

use sluice_engine::load::{self, ExpertMode, LoadOptions};
use sluice_engine::plan::SpineMode;
use sluice_engine::{generate, GenerateOptions, Generation};
use sluice_hub::testhub::{install, Faults, HubRepo, TestHub};
use sluice_hub::{FileState, InstallManifest, ModeRequest, MANIFEST_FILE};
use std::path::{Path, PathBuf};

const PROMPT: [u32; 6] = [1, 17, 42, 99, 5, 23];

/// The committed tiny fixture `name` of `family`, and the repository id it is served under.
fn fixture(family: &str, name: &str) -> (PathBuf, String) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/{family}/{name}"));
    (dir, format!("test/{family}-{name}"))
}

fn pull(hub: &TestHub, (family, name): (&str, &str), dir: &Path, mode: ModeRequest) {
    let (fixture, repo) = fixture(family, name);
    let routed = sluice_engine::install::routed_tensors_in(&fixture).expect("routed experts");
    assert!(!routed.is_empty(), "{family}: its layout names routed experts");
    install(hub, &repo, dir, mode, &routed).expect("pull");
}

fn options(experts: ExpertMode) -> LoadOptions {
    LoadOptions { memory: Some(1 << 30), experts, slots: Some(3), ..LoadOptions::default() }
}

fn run(dir: &Path, opts: &LoadOptions) -> Result<Generation, String> {
    let loaded = load::open(dir, opts).map_err(|e| e.to_string())?;
    let mut state = loaded.model.new_state();
    let g = GenerateOptions { max_new: 6, keep_logits: true, ..GenerateOptions::default() };
    generate(&loaded.model, &mut state, &PROMPT, &g, None, None).map_err(|e| e.to_string())
}

fn bits(g: &Generation) -> (Vec<u32>, Vec<Vec<u32>>) {
    let logits = g.logits.iter().map(|row| row.iter().map(|x| x.to_bits()).collect()).collect();
    (g.tokens.clone(), logits)
}

fn check_family(family: &str, name: &str) {
    let (dir, repo) = fixture(family, name);
    let which = (family, name);
    let hub = TestHub::start(vec![HubRepo::from_dir(&repo, &dir).expect("fixture")]).expect("hub");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (full, stream) = (tmp.path().join("full"), tmp.path().join("stream"));
    pull(&hub, which, &full, ModeRequest::Full);
    pull(&hub, which, &stream, ModeRequest::Stream);

    // Every expert shard is stream-installed with its routed experts left out.
    let m = InstallManifest::read(&stream.join(MANIFEST_FILE)).expect("manifest");
    let streamed: Vec<_> = m.files.iter().filter(|f| f.state == FileState::Stream).collect();
    assert!(!streamed.is_empty(), "{family}: no shard was stream-installed");
    for f in &streamed {
        let s = f.stream.as_ref().expect("stream record");
        assert!(s.expert_bytes > 0, "{family}: {} left no routed experts out", f.path);
        assert!(!stream.join(&f.path).exists(), "{family}: a full copy of {}", f.path);
    }

    let reference = bits(&run(&full, &options(ExpertMode::Mapped)).expect("full install runs"));
    hub.reset_stats();
    let cold = run(&stream, &options(ExpertMode::Auto)).expect("stream install runs");
    assert_eq!(bits(&cold), reference, "{family}: a cold stream run differs from mapped");
    assert!(hub.stats().range_requests > 0, "{family}: the cold run fetched no expert");

    hub.reset_stats();
    let warm = run(&stream, &options(ExpertMode::Auto)).expect("warm stream run");
    assert_eq!(bits(&warm), reference, "{family}: a warm stream run differs");
    let s = hub.stats();
    assert_eq!((s.api_requests, s.content_requests), (0, 0), "{family}: warm run: {s:?}");

    // The spine of a stream install is placed like a full install's: every layer streamed
    // from the sparse shards gives the same bits.
    let layers = LoadOptions { spine_placement: SpineMode::Layers(0), ..options(ExpertMode::Auto) };
    let loaded = load::open(&stream, &layers).expect("streamed spine opens");
    let streams = loaded.spine.as_ref().is_some_and(|s| s.streams());
    drop(loaded);
    assert!(streams, "{family}/{name}: every layer's spine streams");
    let placed = run(&stream, &layers).expect("a streamed spine runs");
    assert_eq!(bits(&placed), reference, "{family}/{name}: a streamed spine differs");

    // A wrong-length answer to a run-time fetch fails the run, naming the shard; afterwards the
    // same install runs right.
    let short = tmp.path().join("short");
    pull(&hub, which, &short, ModeRequest::Stream);
    hub.set_faults(Faults { short_ranges: 1, ..Faults::default() });
    let err = run(&short, &options(ExpertMode::Auto)).expect_err("a wrong-length answer fails");
    assert!(err.contains("from the hub failed") && err.contains(".safetensors"), "{family}: {err}");
    hub.set_faults(Faults::default());
    let again = run(&short, &options(ExpertMode::Auto)).expect("runs once the hub answers right");
    assert_eq!(bits(&again), reference, "{family}: output after a refused range");
}

#[test]
fn qwen3_moe_stream_install_matches_its_full_install_bit_for_bit() {
    check_family("qwen3_moe", "tiny-a");
}

#[test]
fn gpt_oss_stacked_experts_stream_install_matches_its_full_install_bit_for_bit() {
    check_family("gpt_oss", "tiny-a");
}

#[test]
fn deepseek_v3_fp8_stream_install_matches_its_full_install_bit_for_bit() {
    check_family("deepseek_v3", "tiny-a");
}

#[test]
fn kimi_k2_int4_experts_stream_install_matches_its_full_install_bit_for_bit() {
    check_family("deepseek_v3", "tiny-b");
}
