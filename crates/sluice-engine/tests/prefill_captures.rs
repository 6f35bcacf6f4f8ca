//! In-pass captures in `run_turn`: a prompt with message boundaries and a state-cache interval
//! is prefilled in one pass per chunk (the checkpoint points inside a pass are captured, not
//! cut at; a pass is cut only past `MAX_CAPTURES` points), and every state captured and written
//! to disk restores to the logits of a full prefill, bit for bit, for every family.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_engine::state_cache::{StateCache, StateCacheConfig};
use sluice_models::{Model, MAX_CAPTURES};
use std::path::Path;
use std::sync::Arc;

mod common;
use common::{disk_turn as turn, load};

const FAMILIES: [(&str, &str); 6] = [
    ("kimi_k3", "tiny-a"),
    ("kimi_k3", "tiny-b"),
    ("qwen3", "tiny-a"),
    ("qwen3_moe", "tiny-a"),
    ("gpt_oss", "tiny-a"),
    ("deepseek_v3", "tiny-a"),
];

/// Message boundaries of the prompt; with the interval of 8 the checkpoint points inside the
/// prompt are 5, 8, 11, 16 and 24: one more than a pass captures, so the first pass is cut at 24.
const BOUNDARIES: [usize; 2] = [5, 11];
const EVERY: usize = 8;
const POINTS: [usize; 5] = [5, 8, 11, 16, 24];

fn prompt(m: &Model) -> Vec<u32> {
    let vocab = u32::try_from(m.vocab_size()).unwrap().min(150);
    (0..30u32).map(|i| (i * 37 + 5) % vocab).collect()
}

fn open(dir: &Path, m: &Model, every: usize) -> Arc<StateCache> {
    let cfg = StateCacheConfig { dir: dir.to_path_buf(), max_bytes: u64::MAX, every };
    Arc::new(StateCache::open(cfg, [0xC; 32], m.new_state().shape(), m.vocab_size()).unwrap())
}

#[test]
fn checkpoint_points_inside_a_pass_are_captured_and_restore_bit_identically() {
    assert_eq!(POINTS.len(), MAX_CAPTURES + 1, "the fixture's points overflow one pass by one");
    for (family, name) in FAMILIES {
        let m = load(family, name);
        let p = prompt(&m);
        let dir = tempfile::tempdir().unwrap();
        let (want, plain) = turn(&m, None, &p, &BOUNDARIES);
        assert_eq!(plain.stats.prefill_passes, 1, "{family}/{name}: no cache, nothing to keep");
        let (got, first) = turn(&m, Some(&open(dir.path(), &m, EVERY)), &p, &BOUNDARIES);
        assert_eq!(got, want, "{family}/{name}: capturing changed the logits");
        let s = &first.stats;
        // Cutting at every point took 6 passes; now the first 4 are captured in one pass,
        // cut at the fifth, and the rest of the prompt is the second pass.
        assert_eq!(
            (s.prefill_passes, s.prefill_captures, s.capture_cuts),
            (2, MAX_CAPTURES, 1),
            "{family}/{name}"
        );
        // Every point, the prompt's end and the end of generation were written (the
        // captures without logits).
        assert_eq!(s.snapshots, POINTS.len() + 2, "{family}/{name}");
        // The next process: each point restores to the logits of a full prefill.
        let c = open(dir.path(), &m, EVERY);
        for at in POINTS {
            let mut q = p[..at].to_vec();
            q.extend([190 % u32::try_from(m.vocab_size()).unwrap(), 3, 4]);
            let (want, _) = turn(&m, None, &q, &[]);
            let (got, t) = turn(&m, Some(&c), &q, &[]);
            assert_eq!(t.stats.state_cache_tokens_restored, at, "{family}/{name}: point {at}");
            assert_eq!(got, want, "{family}/{name}: restored at {at}");
        }
        // The prompt itself: its end kept its logits, so no pass at all.
        let (got, t) = turn(&m, Some(&c), &p, &BOUNDARIES);
        assert_eq!((t.stats.state_cache_tokens_restored, t.stats.prefill_passes), (30, 0));
        assert_eq!(got, want, "{family}/{name}: the prompt's end");
    }
}

#[test]
fn a_prompt_ending_at_a_capture_resumes_from_an_earlier_state_with_logits() {
    let m = load("kimi_k3", "tiny-a");
    let p = prompt(&m);
    let dir = tempfile::tempdir().unwrap();
    turn(&m, Some(&open(dir.path(), &m, EVERY)), &p, &BOUNDARIES);
    // The state at 16 was captured without logits: a prompt of exactly those 16 tokens
    // restores the state at 11 (captured too, but a shorter prefix it can extend) and
    // prefills the rest, with the logits of a full prefill.
    let c = open(dir.path(), &m, EVERY);
    let (want, _) = turn(&m, None, &p[..16], &[]);
    let (got, t) = turn(&m, Some(&c), &p[..16], &[]);
    assert_eq!(t.stats.state_cache_tokens_restored, 11);
    assert_eq!(got, want);
}

#[test]
fn generate_captures_the_state_cache_interval_edges_inside_a_pass() {
    use sluice_engine::{generate, GenerateOptions};
    for (family, name) in FAMILIES {
        let m = load(family, name);
        let p = prompt(&m);
        let dir = tempfile::tempdir().unwrap();
        let opts = |cache: Option<Arc<StateCache>>| GenerateOptions {
            max_new: 2,
            keep_logits: true,
            state_cache: cache,
            ..GenerateOptions::default()
        };
        let want = generate(&m, &mut m.new_state(), &p, &opts(None), None, None).unwrap();
        // Edges at 6, 12, 18, 24 inside the 30-token pass: all captured, one pass.
        let c = open(dir.path(), &m, 6);
        let g = generate(&m, &mut m.new_state(), &p, &opts(Some(Arc::clone(&c))), None, None);
        let g = g.unwrap();
        c.flush();
        let s = &g.stats;
        assert_eq!((s.prefill_passes, s.prefill_captures, s.capture_cuts), (1, 4, 0));
        assert_eq!(g.logits, want.logits, "{family}/{name}: capturing changed the logits");
        // The next process restores the edge at 18 and gives the logits of a full prefill.
        let c = open(dir.path(), &m, 6);
        let mut q = p[..19].to_vec();
        q.push(7);
        let want = generate(&m, &mut m.new_state(), &q, &opts(None), None, None).unwrap();
        let got = generate(&m, &mut m.new_state(), &q, &opts(Some(c)), None, None).unwrap();
        assert_eq!(got.stats.state_cache_tokens_restored, 18, "{family}/{name}");
        let bits = |g: &sluice_engine::Generation| -> Vec<Vec<u32>> {
            g.logits.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
        };
        assert_eq!(bits(&got), bits(&want), "{family}/{name}: restored at 18");
    }
}
