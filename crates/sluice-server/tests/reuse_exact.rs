//! `sluice_engine::turn::run_turn` with the session cache is exact: resuming from any snapshot
//! (prompt end with stored logits, the state after generation, a mid-prompt checkpoint) gives
//! the same tokens and bit-identical logits as one uncached pass over the whole prompt, greedy
//! and seeded, with and without speculation.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_checkpoint::Checkpoint;
use sluice_engine::session::{SessionCache, SessionConfig};
use sluice_engine::turn::{run_turn, Turn, TurnOptions};
use sluice_engine::{Drafter, NgramDrafter, Sampling};
use sluice_models::Model;
use std::path::PathBuf;
use std::sync::Arc;

fn model() -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
}

/// Runs a turn, returning it and the bits of every token's logits (when asked for).
fn turn(
    m: &Model,
    cache: Option<&mut SessionCache>,
    prompt: &[u32],
    sampling: Sampling,
    logits: bool,
    ngram: bool,
) -> (Turn, Vec<Vec<u32>>) {
    let opts =
        TurnOptions { sampling, draft_max: 4, per_token_logits: logits, ..TurnOptions::greedy(6) };
    let mut rows = Vec::new();
    let mut d = NgramDrafter::default();
    let drafter: Option<&mut dyn Drafter> = if ngram { Some(&mut d) } else { None };
    let mut cb = |_: u32, l: Option<&[f32]>| {
        if let Some(l) = l {
            rows.push(l.iter().map(|x| x.to_bits()).collect());
        }
        true
    };
    let t = run_turn(m, cache, prompt, &opts, drafter, &|| false, &mut cb).unwrap();
    (t, rows)
}

#[test]
fn resumed_turns_equal_uncached_turns_bit_for_bit() {
    let m = model();
    let mut cache = SessionCache::new(SessionConfig {
        checkpoint_every: 8,
        max_bytes: 1 << 30,
        max_entries: 8,
    });
    let a: Vec<u32> = (0..37).map(|i| (i * 37 + 11) % 400).collect();
    let greedy = Sampling::greedy();
    let sampled = Sampling { temperature: 0.8, top_k: 50, top_p: 0.9, seed: 42 };
    for sampling in [greedy, sampled] {
        let (ref_a, ref_a_logits) = turn(&m, None, &a, sampling, true, false);
        let (t, l) = turn(&m, Some(&mut cache), &a, sampling, true, false);
        assert_eq!((t.tokens.clone(), l), (ref_a.tokens.clone(), ref_a_logits.clone()));
        // The same prompt again: resumed from the stored prompt end, no pass before token 0.
        let (t, l) = turn(&m, Some(&mut cache), &a, sampling, true, false);
        assert_eq!(t.stats.cached_tokens, a.len());
        assert_eq!(t.stats.prefill_tokens, 0);
        assert_eq!((t.tokens, l), (ref_a.tokens.clone(), ref_a_logits));
        // The conversation continued: resumed from the state after generation.
        let mut b = a.clone();
        b.extend_from_slice(&ref_a.tokens);
        b.extend_from_slice(&[5, 6, 7]);
        let (ref_b, ref_b_logits) = turn(&m, None, &b, sampling, true, false);
        let (t, l) = turn(&m, Some(&mut cache), &b, sampling, true, false);
        assert_eq!(t.stats.cached_tokens, a.len() + ref_a.tokens.len() - 1);
        assert_eq!((t.tokens, l), (ref_b.tokens, ref_b_logits));
        // Diverging at position 21: resumed from the checkpoint at 16.
        let mut c = a[..21].to_vec();
        c.extend_from_slice(&[9, 9, 9, 9]);
        let (ref_c, ref_c_logits) = turn(&m, None, &c, sampling, true, false);
        let (t, l) = turn(&m, Some(&mut cache), &c, sampling, true, false);
        assert_eq!(t.stats.cached_tokens, 16);
        assert_eq!((t.tokens, l), (ref_c.tokens.clone(), ref_c_logits));
        // Speculative decoding from a resumed state gives the same tokens.
        let (t, _) = turn(&m, Some(&mut cache), &c, sampling, false, true);
        assert_eq!(t.tokens, ref_c.tokens);
        cache.clear();
    }
}

#[test]
fn a_tiny_budget_keeps_nothing_and_changes_nothing() {
    let m = model();
    let mut cache =
        SessionCache::new(SessionConfig { checkpoint_every: 8, max_bytes: 1, max_entries: 8 });
    let a: Vec<u32> = (0..20).map(|i| (i * 13 + 5) % 400).collect();
    let (r, _) = turn(&m, None, &a, Sampling::greedy(), false, false);
    for _ in 0..2 {
        let (t, _) = turn(&m, Some(&mut cache), &a, Sampling::greedy(), false, false);
        assert_eq!(t.tokens, r.tokens);
        assert_eq!(t.stats.cached_tokens, 0);
    }
    assert!(cache.is_empty());
}

#[test]
fn snapshots_hold_the_committed_rows_once_and_are_counted() {
    let m = model();
    let mut cache = SessionCache::new(SessionConfig {
        checkpoint_every: 8,
        max_bytes: 1 << 30,
        max_entries: 8,
    });
    let a: Vec<u32> = (0..37).map(|i| (i * 29 + 3) % 400).collect();
    let (t, _) = turn(&m, Some(&mut cache), &a, Sampling::greedy(), false, false);
    // Checkpoints at 8, 16, 24, 32, the prompt end (37, with logits) and the generation end.
    assert_eq!(t.stats.snapshots, 6);
    let kda = m.new_state().snapshot(None).byte_len();
    let mut s = m.new_state();
    let fed: Vec<u32> = a.iter().chain(&t.tokens[..t.tokens.len() - 1]).copied().collect();
    m.forward(&mut s, &fed, sluice_models::LogitRows::Last, None).unwrap();
    s.commit(fed.len());
    let rows = s.snapshot_bytes() - kda;
    assert_eq!(
        t.stats.snapshot_bytes,
        6 * kda + rows,
        "each KDA state once per snapshot, rows once"
    );
    // Only the prompt end keeps logits: the checkpoints inside its one pass are captured, and a
    // capture keeps none.
    let logits = m.vocab_size() * 4;
    let tokens = 4 * (a.len() + t.tokens.len());
    assert_eq!(cache.bytes(), t.stats.snapshot_bytes + logits + tokens);
    assert_eq!(cache.snapshots(), 6);
    // Six clones of the live state would have held far more.
    assert!(cache.bytes() < 6 * s.byte_len());
}
