//! The state after generation is kept (in the session cache and the on-disk state cache) only
//! where a follow-up request can start with it. It used to be written after every reply,
//! although a chat client sends the reply back as text that the chat format renders again
//! (often to other ids), so on the agent replay no later turn ever restored it: 0.6 GB of
//! writes per Kimi K3 turn for nothing. Where it is kept, restoring it still gives the logits
//! of a full prefill, bit for bit.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_engine::session::{SessionCache, SessionConfig};
use sluice_engine::state_cache::{StateCache, StateCacheConfig};
use sluice_engine::state_file::prefix_key;
use sluice_engine::turn::{run_turn, FollowUp, TurnOptions};
use sluice_engine::{generate, GenerateOptions};
use sluice_models::Model;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const FP: [u8; 32] = [0xE; 32];

mod common;
use common::load;

fn open(dir: &Path, m: &Model) -> Arc<StateCache> {
    let cfg = StateCacheConfig { dir: dir.to_path_buf(), max_bytes: u64::MAX, every: 0 };
    Arc::new(StateCache::open(cfg, FP, m.state_shape(), m.vocab_size()).unwrap())
}

fn file(dir: &Path, tokens: &[u32]) -> PathBuf {
    dir.join(format!("{}.state", prefix_key(&FP, tokens).hex()))
}

fn prompt() -> Vec<u32> {
    (0..17u32).map(|i| (i * 41 + 3) % 150).collect()
}

/// What one turn did: generated ids, every token's logits (bits), tokens restored from disk
/// and from memory or disk together.
struct Done {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
    restored: usize,
    cached: usize,
}

fn turn(
    m: &Model,
    cache: &mut SessionCache,
    disk: Option<&Arc<StateCache>>,
    p: &[u32],
    follow_up: Option<FollowUp>,
) -> Done {
    let opts = TurnOptions { per_token_logits: true, follow_up, ..TurnOptions::greedy(4) };
    let mut logits = Vec::new();
    let mut cb = |_t: u32, l: Option<&[f32]>| {
        logits.push(l.unwrap().iter().map(|x| x.to_bits()).collect());
        true
    };
    let t = run_turn(m, Some(cache), p, &opts, None, &|| false, &mut cb).unwrap();
    if let Some(d) = disk {
        d.flush();
    }
    let (restored, cached) = (t.stats.state_cache_tokens_restored, t.stats.cached_tokens);
    Done { tokens: t.tokens, logits, restored, cached }
}

fn memory(bytes: usize) -> SessionCache {
    SessionCache::new(SessionConfig { checkpoint_every: 0, max_bytes: bytes, max_entries: 8 })
}

/// A follow-up that renders the reply back as `render` says, after `prompt`.
fn rendering(prompt: Vec<u32>, render: fn(&[u32]) -> Vec<u32>) -> FollowUp {
    FollowUp::new(move |generated| {
        let mut ids = prompt.clone();
        ids.extend(render(generated));
        ids.push(7);
        Some(ids)
    })
}

#[test]
fn the_end_of_generation_state_was_written_where_no_follow_up_restores_it() {
    for (family, name) in [("kimi_k3", "tiny-a"), ("qwen3", "tiny-a")] {
        let m = load(family, name);
        let p = prompt();
        // The reply rendered to other ids than generated (here: each id + 1), and no follow-up
        // at all: the prompt's end is written, the state after generation is not.
        let other: fn(&[u32]) -> Vec<u32> = |g| g.iter().map(|t| t + 1).collect();
        for follow_up in [FollowUp::none(), rendering(p.clone(), other)] {
            let dir = tempfile::tempdir().unwrap();
            let disk = open(dir.path(), &m);
            let mut mem = memory(1 << 30).with_disk(Some(Arc::clone(&disk)));
            let first = turn(&m, &mut mem, Some(&disk), &p, Some(follow_up));
            let mut held = p.clone();
            held.extend_from_slice(&first.tokens[..3]);
            assert!(file(dir.path(), &p).exists(), "{family}: the prompt's end is written");
            assert!(!file(dir.path(), &held).exists(), "{family}: written for no follow-up");
            assert_eq!(disk.stats().files_written, 1, "{family}");
            // Nor kept in memory: a prompt continuing the generated ids resumes at the
            // prompt's end.
            let mut cont = held.clone();
            cont.push(first.tokens[3]);
            assert_eq!(mem.resume(&cont).reused, p.len(), "{family}: kept in memory");
        }
    }
}

#[test]
fn the_end_of_generation_state_a_follow_up_starts_with_is_restored_bit_identically() {
    for (family, name) in [("kimi_k3", "tiny-a"), ("kimi_k3", "tiny-b"), ("qwen3", "tiny-a")] {
        let m = load(family, name);
        let p = prompt();
        let dir = tempfile::tempdir().unwrap();
        let disk = open(dir.path(), &m);
        let same: fn(&[u32]) -> Vec<u32> = <[u32]>::to_vec;
        let first = turn(
            &m,
            &mut memory(0).with_disk(Some(Arc::clone(&disk))),
            Some(&disk),
            &p,
            Some(rendering(p.clone(), same)),
        );
        let mut held = p.clone();
        held.extend_from_slice(&first.tokens[..3]);
        assert!(file(dir.path(), &held).exists(), "{family}/{name}: the reply's state is kept");
        // The follow-up, in the next process: the reply as rendered, then new ids.
        let mut next = held.clone();
        next.extend([first.tokens[3], 7, 120, 33]);
        let disk = open(dir.path(), &m);
        let got =
            turn(&m, &mut memory(0).with_disk(Some(Arc::clone(&disk))), Some(&disk), &next, None);
        assert_eq!((got.restored, got.cached), (held.len(), held.len()), "{family}/{name}");
        let want = turn(&m, &mut memory(0), None, &next, None);
        assert_eq!(got.tokens, want.tokens, "{family}/{name}");
        assert!(got.logits == want.logits, "{family}/{name}: logits differ from a full prefill");
    }
}

#[test]
fn run_writes_no_end_of_generation_state_for_a_one_turn_chat() {
    let m = load("kimi_k3", "tiny-a");
    let p = prompt();
    for (follow_up, kept) in [(None, true), (Some(FollowUp::none()), false)] {
        let dir = tempfile::tempdir().unwrap();
        let disk = open(dir.path(), &m);
        let opts = GenerateOptions {
            max_new: 3,
            state_cache: Some(Arc::clone(&disk)),
            follow_up,
            ..GenerateOptions::default()
        };
        let g = generate(&m, &mut m.new_state(), &p, &opts, None, None).unwrap();
        disk.flush();
        let mut held = p.clone();
        held.extend_from_slice(&g.tokens[..2]);
        assert!(file(dir.path(), &p).exists());
        assert_eq!(file(dir.path(), &held).exists(), kept);
    }
}
