//! The on-disk prompt-state cache: a state restored from a file gives the logits of a full
//! prefill, bit for bit, for every family, at prompt ends, message boundaries, mid-message and
//! the interval edges, in a "next process" (a cache opened afresh on the same directory); a
//! corrupt, truncated, other-version or other-model file is refused and recomputed; the size
//! bound holds.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_engine::state_cache::{StateCache, StateCacheConfig};
use sluice_engine::state_file::prefix_key;
use sluice_engine::{generate, GenerateOptions, Generation};
use sluice_models::Model;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::load;

fn models() -> Vec<(String, Model)> {
    [
        ("kimi_k3", "tiny-a"),
        ("kimi_k3", "tiny-b"),
        ("qwen3", "tiny-a"),
        ("qwen3_moe", "tiny-a"),
        ("gpt_oss", "tiny-a"),
    ]
    .iter()
    .map(|(f, n)| (format!("{f}/{n}"), load(f, n)))
    .collect()
}

const FP_A: [u8; 32] = [0xA; 32];
const FP_B: [u8; 32] = [0xB; 32];

fn open(dir: &Path, m: &Model, fp: [u8; 32], every: usize, max_bytes: u64) -> Arc<StateCache> {
    let cfg = StateCacheConfig { dir: dir.to_path_buf(), max_bytes, every };
    Arc::new(StateCache::open(cfg, fp, m.new_state().shape(), m.vocab_size()).unwrap())
}

/// The prompt: 21 ids below 150 (every tail below starts at 190, so it never continues it).
fn prompt() -> Vec<u32> {
    (0..21u32).map(|i| (i * 37 + 5) % 150).collect()
}

fn gen(m: &Model, p: &[u32], cache: Option<&Arc<StateCache>>) -> Generation {
    let opts = GenerateOptions {
        max_new: 3,
        keep_logits: true,
        state_cache: cache.cloned(),
        ..GenerateOptions::default()
    };
    let g = generate(m, &mut m.new_state(), p, &opts, None, None).unwrap();
    if let Some(c) = cache {
        c.flush();
    }
    g
}

fn bits(g: &Generation) -> Vec<Vec<u32>> {
    g.logits.iter().map(|l| l.iter().map(|x| x.to_bits()).collect()).collect()
}

fn assert_same(name: &str, what: &str, got: &Generation, want: &Generation) {
    assert_eq!(got.tokens, want.tokens, "{name}: {what}: tokens");
    assert!(bits(got) == bits(want), "{name}: {what}: logits differ from a full prefill");
}

#[test]
fn a_restored_state_gives_the_logits_of_a_full_prefill_at_every_cut() {
    for (name, m) in models() {
        let dir = tempfile::tempdir().unwrap();
        let p = prompt();
        let first = gen(&m, &p, Some(&open(dir.path(), &m, FP_A, 4, u64::MAX)));
        assert_same(&name, "writing", &first, &gen(&m, &p, None));
        assert_eq!(first.stats.state_cache_tokens_restored, 0);
        // The next process: a cache opened afresh on the same directory.
        let c = open(dir.path(), &m, FP_A, 4, u64::MAX);
        // (cut, restored): interval edges (multiples of 4), mid-interval, the prompt's end.
        for (cut, restored) in [(3, 0), (4, 4), (5, 4), (7, 4), (8, 8), (9, 8), (20, 20), (21, 21)]
        {
            let mut q = p[..cut].to_vec();
            q.extend([190 + u32::try_from(cut).unwrap(), 191, 192]);
            let got = gen(&m, &q, Some(&c));
            assert_eq!(got.stats.state_cache_tokens_restored, restored, "{name}: cut {cut}");
            assert_same(&name, &format!("cut {cut}"), &got, &gen(&m, &q, None));
        }
        // The same prompt: its end was kept with its logits, so no pass at all.
        let again = gen(&m, &p, Some(&c));
        assert_eq!((again.stats.state_cache_tokens_restored, again.stats.prefill_passes), (21, 0));
        assert_same(&name, "same prompt", &again, &first);
        // A prompt continuing the generation resumes from the end-of-generation state.
        let mut cont = p.clone();
        cont.extend_from_slice(&first.tokens[..2]);
        cont.push(199);
        let got = gen(&m, &cont, Some(&c));
        assert_eq!(got.stats.state_cache_tokens_restored, 23, "{name}");
        assert_same(&name, "continuation", &got, &gen(&m, &cont, None));
    }
}

/// One `run_turn` with a session cache that keeps nothing in memory, so every reuse is from disk:
/// every token's logits as bits, the positions restored from disk and in all.
fn turn(
    m: &Model,
    disk: &Arc<StateCache>,
    p: &[u32],
    boundaries: Vec<usize>,
) -> (Vec<Vec<u32>>, usize, usize) {
    let (logits, t) = common::disk_turn(m, Some(disk), p, &boundaries);
    (logits, t.stats.state_cache_tokens_restored, t.stats.cached_tokens)
}

#[test]
fn run_turn_restores_message_boundaries_from_disk_bit_identically() {
    for (name, m) in models() {
        let dir = tempfile::tempdir().unwrap();
        let p = prompt();
        let c = open(dir.path(), &m, FP_A, 0, u64::MAX);
        // The "system prompt" ends at 6: a message boundary.
        let (want, restored, _) = turn(&m, &c, &p, vec![6]);
        assert_eq!(restored, 0);
        let c = open(dir.path(), &m, FP_A, 0, u64::MAX);
        let (got, restored, cached) = turn(&m, &c, &p, vec![6]);
        assert_eq!((restored, cached), (21, 21), "{name}: the prompt's end");
        assert_eq!(got, want, "{name}: same prompt");
        // Another conversation sharing the first 6 tokens (+1, mid-message) only.
        let mut q = p[..7].to_vec();
        q.extend([195, 196]);
        let plain = open(tempfile::tempdir().unwrap().path(), &m, FP_A, 0, u64::MAX);
        let (want, _, _) = turn(&m, &plain, &q, Vec::new());
        let (got, restored, _) = turn(&m, &c, &q, Vec::new());
        assert_eq!(restored, 6, "{name}: the message boundary");
        assert_eq!(got, want, "{name}: restored at the boundary");
    }
}

fn file(dir: &Path, fp: &[u8; 32], tokens: &[u32]) -> PathBuf {
    dir.join(format!("{}.state", prefix_key(fp, tokens).hex()))
}

#[test]
fn a_corrupt_truncated_foreign_or_other_version_file_is_refused_and_recomputed() {
    let m = load("kimi_k3", "tiny-a");
    let p = prompt();
    let mut q = p.clone();
    q.push(190);
    let want = gen(&m, &q, None);
    type Damage = fn(&Path, &Path);
    let cases: [(&str, Damage); 4] = [
        ("corrupt", |f, _| {
            let mut b = std::fs::read(f).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0x40;
            std::fs::write(f, b).unwrap();
        }),
        ("truncated", |f, _| {
            let b = std::fs::read(f).unwrap();
            std::fs::write(f, &b[..b.len() - 50]).unwrap();
        }),
        ("other version", |f, _| {
            let mut b = std::fs::read(f).unwrap();
            b[8..12].copy_from_slice(&99u32.to_le_bytes());
            std::fs::write(f, b).unwrap();
        }),
        ("other model", |f, dir| {
            // Model A's file under model B's name and key: its fingerprint still says A.
            let key = prefix_key(&FP_B, &prompt());
            let mut b = std::fs::read(f).unwrap();
            b[52..84].copy_from_slice(&key.0);
            std::fs::remove_file(f).unwrap();
            std::fs::write(dir.join(format!("{}.state", key.hex())), b).unwrap();
        }),
    ];
    for (what, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        gen(&m, &p, Some(&open(dir.path(), &m, FP_A, 0, u64::MAX)));
        let f = file(dir.path(), &FP_A, &p);
        assert!(f.exists(), "{what}: the prompt's end was written");
        damage(&f, dir.path());
        let fp = if what == "other model" { FP_B } else { FP_A };
        let c = open(dir.path(), &m, fp, 0, u64::MAX);
        let got = gen(&m, &q, Some(&c));
        assert_eq!(got.stats.state_cache_tokens_restored, 0, "{what}: not used");
        assert_eq!(c.stats().refused, 1, "{what}: refused");
        assert_same("kimi_k3/tiny-a", what, &got, &want);
        // Refused files are deleted, and the recomputed state is written in their place.
        let again = gen(&m, &q, Some(&c));
        assert_eq!(again.stats.state_cache_tokens_restored, 22, "{what}: rewritten");
        assert_same("kimi_k3/tiny-a", what, &again, &want);
    }
    // A file of another model is simply never found: its key differs.
    let dir = tempfile::tempdir().unwrap();
    gen(&m, &p, Some(&open(dir.path(), &m, FP_A, 4, u64::MAX)));
    let got = gen(&m, &q, Some(&open(dir.path(), &m, FP_B, 4, u64::MAX)));
    assert_eq!(got.stats.state_cache_tokens_restored, 0);
}

#[test]
fn bytes_written_are_the_files_and_the_size_bound_evicts_least_recently_used() {
    let m = load("qwen3", "tiny-a");
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), &m, FP_A, 0, u64::MAX);
    let p = prompt();
    let g = gen(&m, &p, Some(&c));
    let on_disk: u64 =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(g.stats.state_cache_bytes_written > 0);
    assert_eq!(g.stats.state_cache_bytes_written, on_disk, "counted bytes are the files' bytes");
    assert_eq!(c.stats().bytes_written, on_disk);
    // Room for about three prompt-end files: older, unused ones go first.
    let one = std::fs::metadata(file(dir.path(), &FP_A, &p)).unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), &m, FP_A, 0, 3 * one + one / 2);
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|k| p.iter().map(|t| t + k).collect()).collect();
    let opts = GenerateOptions {
        max_new: 1,
        state_cache: Some(Arc::clone(&c)),
        ..GenerateOptions::default()
    };
    let run = |q: &[u32]| {
        let g = generate(&m, &mut m.new_state(), q, &opts, None, None).unwrap();
        c.flush();
        g.stats.state_cache_tokens_restored
    };
    for q in &prompts[..3] {
        run(q);
    }
    assert_eq!(run(&prompts[0]), 21, "restoring makes prompt 0 the most recently used");
    run(&prompts[3]);
    let s = c.stats();
    assert!(s.bytes_held <= 3 * one + one / 2, "{s:?}");
    assert!(s.evicted >= 1);
    assert_eq!(run(&prompts[1]), 0, "prompt 1 was the least recently used");
    assert_eq!(run(&prompts[0]), 21, "prompt 0 was kept");
}

#[test]
fn a_synthetic_k3_state_has_the_models_shape_and_round_trips_through_a_file() {
    // `sluice bench --snapshot-io` measures states built without the model: they must be the
    // states the model would write, byte for byte in size.
    use sluice_models::kimi_k3::{config::K3Config, state::K3State};
    let m = load("kimi_k3", "tiny-a");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let cfg = K3Config::from_json(&config["text_config"]).unwrap();
    let synthetic = sluice_models::State::new("kimi_k3", K3State::synthetic(&cfg, 9, 3));
    assert_eq!(synthetic.shape(), m.new_state().shape());
    assert_eq!(synthetic.len(), 9);
    let p = prompt();
    let mut real = m.new_state();
    m.forward(&mut real, &p[..9], sluice_models::LogitRows::Last, None).unwrap();
    real.commit(9);
    let (a, b) = (synthetic.snapshot(None), real.snapshot(None));
    assert_eq!(a.encoded_len(), b.encoded_len(), "same bytes on disk as a real state");
    let tmp = tempfile::tempdir().unwrap();
    let c = open(tmp.path(), &m, FP_A, 0, 1 << 30);
    let snap = Arc::new(a);
    c.submit(&p[..9], Arc::clone(&snap), None);
    c.flush();
    let r = c.lookup(&p[..10], 0).expect("restored");
    assert_eq!(r.pos, 9);
    let mut x = Vec::new();
    let mut y = Vec::new();
    r.snapshot.encode(&mut x).unwrap();
    snap.encode(&mut y).unwrap();
    assert!(x == y, "the restored state is the one written");
}

#[test]
fn a_version_1_state_file_is_refused_and_recomputed_never_misread() {
    // Version 1 files (one SHA-256 over the whole file, the snapshot's layout interleaved with
    // its arrays) are valid by their own rules; read with version 2's layout they would be
    // misread. One left in the directory, under the very name of the prompt's key, is refused
    // by its version when the cache opens, deleted, and the state recomputed.
    use sha2::{Digest, Sha256};
    let m = load("kimi_k3", "tiny-a");
    let p = prompt();
    let mut q = p.clone();
    q.push(190);
    let want = gen(&m, &q, None);
    let dir = tempfile::tempdir().unwrap();
    let mut b = Vec::new();
    b.extend_from_slice(b"SLUICEST");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&FP_A);
    b.extend_from_slice(&(p.len() as u64).to_le_bytes());
    b.extend_from_slice(&prefix_key(&FP_A, &p).0);
    b.extend_from_slice(&0u32.to_le_bytes());
    p.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
    b.extend((0..4096u32).map(|i| i.to_le_bytes()[0]));
    let sum = Sha256::digest(&b);
    b.extend_from_slice(&sum);
    let f = file(dir.path(), &FP_A, &p);
    std::fs::write(&f, &b).unwrap();
    let c = open(dir.path(), &m, FP_A, 0, u64::MAX);
    assert_eq!(c.stats().refused, 1, "refused when the cache opened");
    assert!(!f.exists(), "and deleted");
    let got = gen(&m, &q, Some(&c));
    assert_eq!(got.stats.state_cache_tokens_restored, 0);
    assert_same("kimi_k3/tiny-a", "after a version 1 file", &got, &want);
    let again = gen(&m, &q, Some(&c));
    assert_eq!(again.stats.state_cache_tokens_restored, 22, "recomputed and rewritten");
    assert_same("kimi_k3/tiny-a", "restored from version 2", &again, &want);
}

#[test]
fn a_filled_state_has_its_models_shape_and_file_size_for_every_family() {
    // `sluice bench --snapshot-io --model` measures a model's own state filled with drawn
    // values: it must be the state the model would write, byte for byte in size.
    let p = prompt();
    for (name, m) in models() {
        let mut filled = m.new_state();
        filled.fill_synthetic(9, 3);
        assert_eq!(filled.shape(), m.new_state().shape(), "{name}");
        assert_eq!(filled.len(), 9, "{name}");
        let mut real = m.new_state();
        m.forward(&mut real, &p[..9], sluice_models::LogitRows::Last, None).unwrap();
        real.commit(9);
        let (a, b) = (filled.snapshot(None), real.snapshot(None));
        assert_eq!(a.encoded_len(), b.encoded_len(), "{name}: same bytes as a real state");
        let tmp = tempfile::tempdir().unwrap();
        let c = open(tmp.path(), &m, FP_A, 0, 1 << 30);
        c.submit(&p[..9], Arc::new(a), None);
        c.flush();
        assert_eq!(c.lookup(&p[..10], 0).expect("restored").pos, 9, "{name}");
    }
}
