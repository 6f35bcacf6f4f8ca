//! The prefill progress hook: called before the first pass and after every pass with the
//! positions done, through `generate` and `run_turn` (resumed positions count as done), and
//! never changing the output.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_checkpoint::Checkpoint;
use sluice_engine::session::{SessionCache, SessionConfig};
use sluice_engine::turn::{run_turn, TurnOptions};
use sluice_engine::{generate, GenerateOptions, PrefillHook, PrefillProgress};
use sluice_models::Model;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn model() -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
}

/// A hook that records every report.
fn recorder() -> (PrefillHook, Arc<Mutex<Vec<PrefillProgress>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    (PrefillHook::new(move |p| s2.lock().unwrap().push(*p)), seen)
}

#[test]
fn generate_reports_every_prefill_chunk_and_output_is_unchanged() {
    let m = model();
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 100).collect();
    let plain = GenerateOptions {
        max_new: 4,
        keep_logits: true,
        prefill_chunk: 4,
        ..GenerateOptions::default()
    };
    let a = generate(&m, &mut m.new_state(), &prompt, &plain, None, None).unwrap();
    let (hook, seen) = recorder();
    let with = GenerateOptions { on_prefill: Some(hook), ..plain.clone() };
    let b = generate(&m, &mut m.new_state(), &prompt, &with, None, None).unwrap();
    assert_eq!(a.tokens, b.tokens);
    let bits = |g: &sluice_engine::Generation| -> Vec<Vec<u32>> {
        g.logits.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
    };
    assert_eq!(bits(&a), bits(&b), "the hook never changes the logits");
    let seen = seen.lock().unwrap();
    let done: Vec<(usize, usize)> = seen.iter().map(|p| (p.done, p.total)).collect();
    assert_eq!(done, [(0, 11), (4, 11), (8, 11), (11, 11)]);
    assert!(seen.windows(2).all(|w| w[0].expert_bytes_read <= w[1].expert_bytes_read));
    assert!(seen.windows(2).all(|w| w[0].elapsed_s <= w[1].elapsed_s));
    assert_eq!(seen[0].eta_s(0), None, "no rate before a position ran");
    assert_eq!(seen[3].eta_s(0), Some(0.0), "nothing left at the end");
}

#[test]
fn run_turn_counts_resumed_positions_as_done() {
    let m = model();
    let mut cache =
        SessionCache::new(SessionConfig { checkpoint_every: 4, ..SessionConfig::default() });
    let prompt: Vec<u32> = (0..10).map(|i| (i * 5 + 1) % 100).collect();
    let (hook, seen) = recorder();
    let opts = TurnOptions { on_prefill: Some(hook), ..TurnOptions::greedy(2) };
    let mut cb = |_: u32, _: Option<&[f32]>| true;
    run_turn(&m, Some(&mut cache), &prompt, &opts, None, &|| false, &mut cb).unwrap();
    let first: Vec<usize> = seen.lock().unwrap().drain(..).map(|p| p.done).collect();
    // The checkpoints at 4 and 8 are captured inside one pass, not cut at.
    assert_eq!(first, [0, 10]);
    // The same prompt plus more: the stored prefix is resumed, not prefilled again.
    let longer: Vec<u32> = prompt.iter().copied().chain([9, 9, 9]).collect();
    run_turn(&m, Some(&mut cache), &longer, &opts, None, &|| false, &mut cb).unwrap();
    let second: Vec<(usize, usize)> =
        seen.lock().unwrap().iter().map(|p| (p.done, p.total)).collect();
    assert!(second[0].0 > 0 && second[0].1 == 13, "{second:?}");
    assert_eq!(second.last(), Some(&(13, 13)));
}
