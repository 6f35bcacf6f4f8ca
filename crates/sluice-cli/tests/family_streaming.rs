//! `sluice run`, `inspect` and `verify` on Qwen3-MoE and GPT-OSS checkpoints through the family
//! boundary, as real processes over the golden fixtures: experts streamed through the memory
//! plan with a 2-slot cache generate exactly what experts mapped in place generate, and are
//! really read from the published shards; and a spine streamed layer by layer (every family
//! with routed experts places its spine) generates what a mapped spine does, its peak resident
//! memory under `--memory`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../sluice-models/tests/common/moe_fixtures.rs"]
mod moe_fixtures;

fn fixture(family: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(family)
        .join("tiny-a")
        .display()
        .to_string()
}

fn sluice(args: &[&str]) -> serde_json::Value {
    // Runs read the committed fixtures in place: `--no-warm-start` keeps them from saving a
    // hot set next to the fixture (they wrote `.sluice-hotset.json` into six fixture folders).
    let warm = ["--no-warm-start"];
    let args =
        if args.first() == Some(&"run") { [args, &warm[..]].concat() } else { args.to_vec() };
    let o = Command::new(env!("CARGO_BIN_EXE_sluice")).args(&args).output().expect("spawn sluice");
    assert!(o.status.success(), "sluice {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

/// Whether the fixture folder `dir` holds a saved hot set: runs over the committed fixtures
/// wrote `.sluice-hotset.json` into six of them before they passed `--no-warm-start`.
fn hot_set_in(dir: &str) -> bool {
    Path::new(dir).join(".sluice-hotset.json").exists()
}

#[test]
fn streamed_runs_generate_what_mapped_runs_generate_for_every_family() {
    for family in ["qwen3_moe", "gpt_oss"] {
        let dir = fixture(family);
        let had_hot_set = hot_set_in(&dir);
        let run = |experts: &str, extra: &[&str]| {
            let mut args = vec!["run", "--model", &dir, "--json", "--prompt-ids", "5,17,30,42"];
            args.extend_from_slice(&["--max-new", "8", "--memory", "1G", "--experts", experts]);
            args.extend_from_slice(extra);
            sluice(&args)
        };
        let mapped = run("mapped", &[]);
        let streamed = run("stream", &["--cache-slots", "2"]);
        assert_eq!(mapped["experts"], "mapped", "{family}");
        assert_eq!(streamed["experts"], "stream", "{family}");
        assert_eq!(streamed["generated_ids"], mapped["generated_ids"], "{family}: streamed ids");
        assert_eq!(streamed["plan"]["slots"], 2, "{family}: the plan has the slots asked for");
        let read = streamed["stats"]["expert_bytes_read"].as_u64().expect("bytes read");
        assert!(read > 0, "{family}: a streamed run reads its experts from the shards");
        let spec = run("stream", &["--cache-slots", "2", "--draft", "ngram"]);
        assert_eq!(spec["generated_ids"], mapped["generated_ids"], "{family}: n-gram drafts");
        assert!(had_hot_set || !hot_set_in(&dir), "{family}: a run saved a hot set in the fixture");
    }
}

#[test]
fn inspect_and_verify_read_every_family_through_the_boundary() {
    for (family, expert_bytes) in
        [("qwen3_moe", 3 * 32 * 64 * 2), ("gpt_oss", 12288 / 2 + 12288 / 32)]
    {
        let dir = fixture(family);
        let v = sluice(&["inspect", &dir, "--json"]);
        assert_eq!(v["family"], family);
        assert_eq!(v["experts_per_layer"], 8, "{family}");
        assert_eq!(v["expert_bytes"], expert_bytes, "{family}");
        let o = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["verify", &dir]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "verify {family}: {out}");
    }
}

/// Memory no budget charges (the executable's own code and data, the C library, thread stacks,
/// allocator slack), as in `streaming_budget.rs`.
const SLACK: u64 = 16 << 20;

#[test]
fn a_placed_spine_stays_within_memory_and_generates_what_a_mapped_spine_does() {
    for (family, name) in moe_fixtures::MOE_FIXTURES {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(family)
            .join(name)
            .display()
            .to_string();
        let had_hot_set = hot_set_in(&dir);
        let run = |placement: &str| {
            let args = ["run", "--model", &dir, "--json", "--prompt-ids", "5,17,30,42"];
            let more = ["--max-new", "8", "--memory", "96M", "--experts", "stream"];
            let place = ["--cache-slots", "2", "--spine-placement", placement];
            sluice(&[&args[..], &more, &place].concat())
        };
        let mapped = run("mapped");
        let placed = run("0");
        assert_eq!(mapped["plan"]["spine"]["mode"], "mapped", "{family}/{name}");
        let spine = &placed["plan"]["spine"];
        assert_eq!(spine["mode"], "placed", "{family}/{name}: {spine}");
        assert_eq!(spine["resident_layers"], 0, "{family}/{name}: {spine}");
        assert_eq!(placed["generated_ids"], mapped["generated_ids"], "{family}/{name}: ids");
        let read = placed["stats"]["spine_bytes_read"].as_u64().unwrap_or(0);
        assert!(read > 0, "{family}/{name}: a streamed spine is read every pass");
        let peak = placed["stats"]["peak_rss_bytes"].as_u64().expect("VmHWM is reported");
        let budget: u64 = 96 << 20;
        assert!(
            peak > 0 && peak <= budget + SLACK,
            "{family}/{name}: peak RSS {peak} exceeds the {budget}-byte budget + {SLACK} slack"
        );
        let saved = !had_hot_set && hot_set_in(&dir);
        assert!(!saved, "{family}/{name}: a run saved a hot set in the fixture");
    }
}
