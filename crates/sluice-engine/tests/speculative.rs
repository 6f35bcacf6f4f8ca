//! Speculative decoding never changes output: with any drafter and any width, the tokens and
//! the logits of every emitted token are bit-identical to plain greedy decoding.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use proptest::prelude::*;
use sluice_checkpoint::Checkpoint;
use sluice_engine::{
    generate, Drafter, GenerateOptions, Generation, NgramDrafter, Sampling, ScriptDrafter,
};
use sluice_models::Model;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn model(name: &str) -> &'static Model {
    static A: OnceLock<Model> = OnceLock::new();
    static B: OnceLock<Model> = OnceLock::new();
    let cell = if name == "tiny-a" { &A } else { &B };
    cell.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/kimi_k3")
            .join(name);
        sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
    })
}

fn run(
    m: &Model,
    prompt: &[u32],
    max_new: usize,
    draft_max: usize,
    d: Option<&mut dyn Drafter>,
) -> Generation {
    let opts =
        GenerateOptions { max_new, keep_logits: true, draft_max, ..GenerateOptions::default() };
    let mut st = m.new_state();
    generate(m, &mut st, prompt, &opts, d, None).unwrap()
}

fn bits(g: &Generation) -> Vec<Vec<u32>> {
    g.logits.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

fn assert_same(plain: &Generation, spec: &Generation, what: &str) {
    assert_eq!(spec.tokens, plain.tokens, "{what}: tokens differ");
    assert!(bits(spec) == bits(plain), "{what}: logits differ");
}

#[test]
fn replaying_the_targets_own_future_accepts_everything() {
    for name in ["tiny-a", "tiny-b"] {
        let m = model(name);
        let prompt = [5u32, 17, 300, 42, 99];
        let plain = run(m, &prompt, 20, 0, None);
        for width in 1..=16 {
            // The context holds prompt + emitted tokens; script position 0 is the token after
            // the first emitted one.
            let mut d =
                ScriptDrafter { base: prompt.len() + 1, script: plain.tokens[1..].to_vec() };
            let spec = run(m, &prompt, 20, width, Some(&mut d));
            assert_same(&plain, &spec, &format!("{name} width {width}"));
            assert_eq!(
                spec.stats.accepted, spec.stats.drafted,
                "{name} width {width}: all drafts are right"
            );
            assert!(spec.stats.passes < plain.stats.passes, "{name} width {width}: fewer passes");
        }
    }
}

#[test]
fn stop_tokens_and_max_new_apply_inside_the_accepted_prefix() {
    let m = model("tiny-a");
    let prompt = [60u32, 7, 126];
    let plain = run(m, &prompt, 12, 0, None);
    let stop = plain.tokens[5];
    let opts = |dm| GenerateOptions {
        max_new: 12,
        stop_ids: vec![stop],
        keep_logits: true,
        draft_max: dm,
        ..GenerateOptions::default()
    };
    let mut st = m.new_state();
    let p = generate(m, &mut st, &prompt, &opts(0), None, None).unwrap();
    let plain_len = st.len();
    let mut d = ScriptDrafter { base: prompt.len() + 1, script: plain.tokens[1..].to_vec() };
    let mut st2 = m.new_state();
    let s = generate(m, &mut st2, &prompt, &opts(8), Some(&mut d), None).unwrap();
    assert_same(&p, &s, "stop inside accepted drafts");
    assert_eq!(s.stats.finish_reason, "stop");
    assert_eq!(st2.len(), plain_len, "the state holds exactly what plain decoding holds");
    for max_new in 1..=7 {
        let a = run(m, &prompt, max_new, 0, None);
        let mut d = ScriptDrafter { base: prompt.len() + 1, script: plain.tokens[1..].to_vec() };
        let b = run(m, &prompt, max_new, 8, Some(&mut d));
        assert_same(&a, &b, &format!("max_new {max_new}"));
    }
}

#[test]
fn ngram_drafting_is_exact() {
    let m = model("tiny-b");
    let prompt: Vec<u32> = [10u32, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11].to_vec();
    let plain = run(m, &prompt, 16, 0, None);
    let mut d = NgramDrafter::default();
    let spec = run(m, &prompt, 16, 6, Some(&mut d));
    assert_same(&plain, &spec, "ngram");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Drafts that are right, wrong and partly right, at every width, on random prompts.
    #[test]
    fn any_drafts_any_width_equal_plain(
        prompt in proptest::collection::vec(0u32..400, 1..10),
        width in 1usize..=16,
        corrupt in proptest::collection::vec(proptest::option::of(0u32..400), 16),
        which in 0usize..2,
    ) {
        let m = model(["tiny-a", "tiny-b"][which]);
        let plain = run(m, &prompt, 10, 0, None);
        // Start from the true future and overwrite some positions with other tokens.
        let mut script = plain.tokens[1..].to_vec();
        for (s, c) in script.iter_mut().zip(&corrupt) {
            if let Some(t) = c {
                *s = *t;
            }
        }
        let mut d = ScriptDrafter { base: prompt.len() + 1, script };
        let spec = run(m, &prompt, 10, width, Some(&mut d));
        prop_assert_eq!(&spec.tokens, &plain.tokens);
        prop_assert!(bits(&spec) == bits(&plain));
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_unchanged_by_drafting() {
    let m = model("tiny-b");
    let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let sampling = Sampling { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 1234 };
    let opts = |dm| GenerateOptions {
        max_new: 16,
        keep_logits: true,
        draft_max: dm,
        sampling,
        ..GenerateOptions::default()
    };
    let gen = |dm, d: Option<&mut dyn Drafter>| {
        let mut st = m.new_state();
        generate(m, &mut st, &prompt, &opts(dm), d, None).unwrap()
    };
    let a = gen(0, None);
    let b = gen(0, None);
    assert_eq!(a.tokens, b.tokens, "same seed, same output");
    // Drafts replaying the sampled future are all accepted and change nothing.
    let mut d = ScriptDrafter { base: prompt.len() + 1, script: a.tokens[1..].to_vec() };
    let c = gen(8, Some(&mut d));
    assert_same(&a, &c, "sampled speculation");
    assert_eq!(c.stats.accepted, c.stats.drafted);
    let other = {
        let mut st = m.new_state();
        let o = GenerateOptions { sampling: Sampling { seed: 99, ..sampling }, ..opts(0) };
        generate(m, &mut st, &prompt, &o, None, None).unwrap()
    };
    assert_ne!(other.tokens, a.tokens, "a different seed gives a different sample");
}

#[test]
fn a_callback_cancels_and_the_state_holds_what_was_emitted() {
    let m = model("tiny-a");
    let prompt = [9u32, 8, 7];
    let mut seen = Vec::new();
    let mut cb = |t: u32| {
        seen.push(t);
        seen.len() < 4
    };
    let mut st = m.new_state();
    let opts = GenerateOptions { max_new: 20, ..GenerateOptions::default() };
    let g = generate(m, &mut st, &prompt, &opts, None, Some(&mut cb)).unwrap();
    assert_eq!(g.tokens.len(), 4);
    assert_eq!(g.stats.finish_reason, "cancelled");
    // Plain decoding feeds every emitted token but the last.
    assert_eq!(st.len(), prompt.len() + 3);
}

#[test]
fn an_interrupt_stops_at_the_next_pass_and_keeps_what_was_emitted() {
    let m = model("tiny-a");
    let prompt = [60u32, 7, 126, 3, 9];
    let plain = run(m, &prompt, 12, 0, None);
    for draft_max in [0, 4] {
        // Raised from the callback after the third token: no further pass runs.
        let flag: &'static std::sync::atomic::AtomicBool = Box::leak(Box::default());
        let opts = GenerateOptions {
            max_new: 12,
            draft_max,
            interrupt: Some(flag),
            ..GenerateOptions::default()
        };
        let mut seen = 0;
        let mut cb = |_: u32| {
            seen += 1;
            if seen == 3 {
                flag.store(true, std::sync::atomic::Ordering::Release);
            }
            true
        };
        let mut ngram = NgramDrafter::default();
        let d = (draft_max > 0).then_some(&mut ngram as &mut dyn Drafter);
        let mut st = m.new_state();
        let g = generate(m, &mut st, &prompt, &opts, d, Some(&mut cb)).unwrap();
        assert_eq!(g.stats.finish_reason, "interrupted");
        assert!(g.tokens.len() >= 3 && g.tokens.len() < 12, "{:?}", g.tokens);
        assert_eq!(g.tokens[..], plain.tokens[..g.tokens.len()], "the tokens emitted stand");
        assert_eq!(st.len(), prompt.len() + g.tokens.len() - 1, "the state holds exactly them");
    }
    // Raised before the start: not even the prefill runs (the prompt is in chunks of 2).
    let flag: &'static std::sync::atomic::AtomicBool =
        Box::leak(Box::new(std::sync::atomic::AtomicBool::new(true)));
    let opts = GenerateOptions {
        max_new: 12,
        prefill_chunk: 2,
        interrupt: Some(flag),
        ..GenerateOptions::default()
    };
    let g = generate(m, &mut m.new_state(), &prompt, &opts, None, None).unwrap();
    assert!(g.tokens.is_empty());
    assert_eq!((g.stats.finish_reason.as_str(), g.stats.prefill_passes), ("interrupted", 0));
}

#[test]
fn prefill_chunking_and_pass_row_limits_change_no_logit() {
    // The memory plan chunks the prompt and caps the rows of a decode pass (pending token and
    // drafts) at its chunk: neither may change a bit of any emitted token's logits.
    let prompt: Vec<u32> = (0..37u32).map(|i| (i * 53 + 11) % 400).collect();
    for name in ["tiny-a", "tiny-b"] {
        let m = model(name);
        let plain = run(m, &prompt, 12, 0, None);
        for chunk in [1usize, 2, 5, 16, 36, 37, 1000] {
            for draft_max in [0, 4] {
                let opts = GenerateOptions {
                    max_new: 12,
                    keep_logits: true,
                    draft_max,
                    prefill_chunk: chunk,
                    ..GenerateOptions::default()
                };
                let mut d = NgramDrafter::default();
                let drafter: Option<&mut dyn Drafter> =
                    if draft_max > 0 { Some(&mut d) } else { None };
                let mut st = m.new_state();
                let g = generate(m, &mut st, &prompt, &opts, drafter, None).unwrap();
                assert_eq!(g.stats.prefill_passes, prompt.len().div_ceil(chunk), "{name}");
                let wide = g.stats.width_histogram.iter().skip(chunk).sum::<usize>();
                assert_eq!(wide, 0, "{name}: a decode pass of more than {chunk} rows");
                assert_same(&plain, &g, &format!("{name} chunk {chunk} drafts {draft_max}"));
            }
        }
    }
}
