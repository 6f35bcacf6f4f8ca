//! The model drafter: re-encoding draft text into the target's tokens (edge cases on the real
//! Kimi K3 fixture tokenizer and a Qwen3 `tokenizer.json`), incremental draft state, the memory
//! charge, and — through `generate` — output and logits bit-identical to plain decoding with a
//! Qwen3 draft whose tokenizer differs from the Kimi K3 target's.
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
use sluice_engine::load::{self, LoadOptions};
use sluice_engine::retok::{covered_tokens, TokenText};
use sluice_engine::{generate, DraftModel, Drafter, GenerateOptions, Generation, ModelDrafter};
use sluice_models::Model;
use sluice_tokenizer::{HfTokenizer, Tokenizer};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn k3_dir(name: &str) -> PathBuf {
    fixtures().join("kimi_k3").join(name)
}

fn qwen_dir(name: &str) -> PathBuf {
    fixtures().join("qwen3").join(name)
}

fn k3_tok() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| Arc::new(Tokenizer::from_dir(k3_dir("tiny-a")).unwrap())).clone()
}

fn bytes_of(t: &dyn TokenText, ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|&id| t.token_bytes(id).unwrap()).collect()
}

/// The invariants every proposal holds: no special ids, at most `max`, the bytes a prefix of
/// the draft text, and short of its end unless the draft ended on end-of-sequence.
fn check(t: &dyn TokenText, tail: &[u8], draft: &[u8], eos: bool, max: usize) -> Vec<u32> {
    let p = covered_tokens(t, tail, draft, eos, max);
    assert!(p.len() <= max);
    assert!(p.iter().all(|&id| !t.is_special(id)), "special id proposed for {draft:?}");
    let b = bytes_of(t, &p);
    assert!(draft.starts_with(&b), "{p:?} spells {b:?}, not a prefix of {draft:?}");
    if !eos {
        assert!(b.len() < draft.len() || draft.is_empty(), "the last token may still grow");
    }
    p
}

#[test]
fn draft_text_ending_inside_a_target_token_holds_it_back() {
    let t = k3_tok();
    let enc = |s: &str| t.encode_ordinary(s);
    // " keep" could still become " keeper".
    let p = check(t.as_ref(), b"The", b" mill keep", false, 8);
    assert_eq!(p, enc(" mill"));
    // With more text the held-back token is decided.
    let p = check(t.as_ref(), b"The", b" mill keeper by", false, 8);
    assert_eq!(p, enc(" mill keeper"));
    // Ending on end-of-sequence, the text is complete and its last token counts.
    let p = check(t.as_ref(), b"The", b" mill keeper", true, 8);
    assert_eq!(p, enc(" mill keeper"));
    assert_eq!(check(t.as_ref(), b"The", b" mill keeper", true, 1), enc(" mill"));
}

#[test]
fn committed_boundary_inside_a_target_token_reencodes_the_draft_alone() {
    let t = k3_tok();
    // The target committed " wat"; the draft continues "er is": " wat" + "er" would re-encode as
    // " water", so the proposal is the draft text's own encoding.
    let p = check(t.as_ref(), b" the wat", b"er is high", false, 8);
    let alone = t.encode_ordinary("er is high");
    assert_eq!(p, alone[..alone.len() - 1]);
}

#[test]
fn multi_byte_characters_split_between_draft_tokens() {
    let t = k3_tok();
    let text = "caf\u{e9} \u{1f600} na\u{ef}ve".as_bytes();
    let full = t.encode_ordinary("caf\u{e9} \u{1f600} na\u{ef}ve");
    for cut in 0..=text.len() {
        let p = check(t.as_ref(), b" the", &text[..cut], false, 32);
        let b = bytes_of(t.as_ref(), &p);
        // Only complete characters are re-encoded.
        let valid = std::str::from_utf8(&text[..cut]).map_or_else(|e| e.valid_up_to(), str::len);
        assert!(b.len() < valid.max(1), "cut {cut}: {b:?}");
    }
    // The whole text ending on end-of-sequence proposes its full encoding.
    assert_eq!(check(t.as_ref(), b"", text, true, 32), full);
    // A draft that only holds the first byte of a character proposes nothing.
    assert!(check(t.as_ref(), b"caf", &[0xc3], true, 8).is_empty());
}

#[test]
fn special_tokens_are_never_proposed_as_text() {
    let t = k3_tok();
    let eom = t.special_id("<|end_of_msg|>").unwrap();
    // The K3 target encodes a spelled marker as ordinary text.
    let p = check(t.as_ref(), b"", b" the<|end_of_msg|> river", false, 32);
    assert!(!p.contains(&eom));
    // A tokenizer.json target turns spelled added tokens into ids: the proposal stops there.
    let q = HfTokenizer::from_dir(qwen_dir("tiny-a")).unwrap();
    let end = q.token_to_id("<|im_end|>").unwrap();
    let p = check(&q, b"", b"hello there<|im_end|>world again", true, 32);
    assert!(!p.contains(&end));
    assert_eq!(bytes_of(&q, &p), b"hello there");
}

#[test]
fn whitespace_runs() {
    let t = k3_tok();
    // K3's pre-tokenizer gives a run before a word all but its last space; that space joins
    // the word. A run at the end of the draft could still split differently.
    let p = check(t.as_ref(), b"The", b" mill   ", false, 8);
    assert!(!p.is_empty());
    // Whatever comes next, the proposal stays a prefix of the extended text's encoding.
    for next in [" by", "\n", "x", "  "] {
        let ext = t.encode_ordinary(&format!(" mill   {next}"));
        assert!(ext.starts_with(&p), "{p:?} then {next:?}: {ext:?}");
    }
    let p = check(t.as_ref(), b"The", b" mill   by the", false, 8);
    assert_eq!(bytes_of(t.as_ref(), &p), b" mill   by");
    let p = check(t.as_ref(), b"The mill  ", b"  \n\n  the", false, 8);
    assert!(bytes_of(t.as_ref(), &p).len() < 6);
}

#[test]
fn empty_drafts_propose_nothing() {
    let t = k3_tok();
    assert!(check(t.as_ref(), b"The", b"", true, 8).is_empty());
    assert!(check(t.as_ref(), b"The", b" mill", true, 0).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any tail and draft (including broken UTF-8 and spelled markers) keep the invariants.
    #[test]
    fn proposals_keep_the_invariants(
        tail in proptest::collection::vec(any::<u8>(), 0..12),
        words in proptest::collection::vec(
            prop::sample::select(vec![" the", " keep", "er", "  ", "\n", "é", "😀", "<|end_of_msg|>", "wat", "\u{0}", " "]),
            0..10,
        ),
        cut in 0usize..64,
        eos in any::<bool>(),
        max in 0usize..12,
    ) {
        let t = k3_tok();
        let mut draft: Vec<u8> = words.concat().into_bytes();
        draft.truncate(cut.min(draft.len()));
        check(t.as_ref(), &tail, &draft, eos, max);
    }
}

fn k3(name: &str) -> &'static Model {
    static A: OnceLock<Model> = OnceLock::new();
    static B: OnceLock<Model> = OnceLock::new();
    let cell = if name == "tiny-a" { &A } else { &B };
    cell.get_or_init(|| {
        sluice_models::load(Arc::new(Checkpoint::open(&k3_dir(name)).unwrap())).unwrap()
    })
}

fn drafter(qwen: &str) -> ModelDrafter {
    ModelDrafter::new(DraftModel::open(&qwen_dir(qwen)).unwrap(), k3_tok(), 4096)
}

fn gen(m: &Model, prompt: &[u32], width: usize, d: Option<&mut dyn Drafter>) -> Generation {
    let opts = GenerateOptions {
        max_new: 24,
        keep_logits: true,
        draft_max: width,
        fixed_width: true,
        ..GenerateOptions::default()
    };
    generate(m, &mut m.new_state(), prompt, &opts, d, None).unwrap()
}

fn bits(g: &Generation) -> Vec<Vec<u32>> {
    g.logits.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn model_drafter_through_generate_is_exact_at_every_width() {
    let t = k3_tok();
    let prompts = ["The miller and the water wheel", "When the river is high the keeper", "a"];
    for (target, draft) in [("tiny-a", "tiny-a"), ("tiny-b", "tiny-b"), ("tiny-a", "tiny-b")] {
        let m = k3(target);
        for text in prompts {
            let prompt = t.encode_ordinary(text);
            let plain = gen(m, &prompt, 0, None);
            let mut drafted = 0;
            for width in 1..=16 {
                let mut d = drafter(draft);
                let spec = gen(m, &prompt, width, Some(&mut d));
                let what = format!("{target}/{draft} {text:?} width {width}");
                assert_eq!(spec.tokens, plain.tokens, "{what}: tokens differ");
                assert!(bits(&spec) == bits(&plain), "{what}: logits differ");
                assert!(d.error().is_none(), "{what}: {:?}", d.error());
                assert!(d.counters.passes > 0, "{what}: the draft model never ran");
                drafted += spec.stats.drafted;
            }
            assert!(drafted > 0, "{target}/{draft} {text:?}: the drafter never proposed a token");
        }
    }
}

#[test]
fn the_draft_state_is_incremental_and_rolls_back() {
    let t = k3_tok();
    let mut d = drafter("tiny-a");
    let mut ctx = t.encode_ordinary("The miller and the water wheel by the river");
    d.propose(&ctx, 4);
    let after_prompt = d.counters.positions;
    assert!(after_prompt >= 10, "the prompt was fed");
    // The target emits a few tokens of its own: only their text (and the drafts) is fed.
    for next in t.encode_ordinary(" keeper is not here when the gate is open") {
        ctx.push(next);
        let before = d.counters.positions;
        d.propose(&ctx, 4);
        let fed = d.counters.positions - before;
        assert!(fed <= 8, "one new target token cost {fed} draft positions");
    }
    // A context that diverges early keeps the common part.
    let other = t.encode_ordinary("The miller sleeps");
    let before = d.counters.positions;
    d.propose(&other, 2);
    assert!(d.counters.positions - before < 8, "diverging re-fed the whole context");
    assert!(d.error().is_none());
}

#[test]
fn the_draft_is_charged_to_the_budget_before_the_target_plans() {
    let draft = DraftModel::open(&qwen_dir("tiny-b")).unwrap();
    let needs = draft.memory_needs(4096);
    assert!(
        needs > std::fs::metadata(qwen_dir("tiny-b").join("model.safetensors")).unwrap().len() / 2
    );
    let opts =
        |memory| LoadOptions { memory: Some(memory), draft_bytes: needs, ..LoadOptions::default() };
    let ok = load::open(&k3_dir("tiny-b"), &opts(256 << 20)).unwrap();
    assert_eq!(ok.plan.as_ref().unwrap().needs.draft, needs);
    assert!(ok.budget.used() >= needs);
    let err = load::open(&k3_dir("tiny-b"), &opts(needs / 2)).unwrap_err().to_string();
    assert!(err.contains("draft model"), "{err}");
    let err = load::open(&k3_dir("tiny-b"), &opts(needs + (1 << 20))).unwrap_err().to_string();
    assert!(err.contains("the draft model"), "{err}");
}

#[test]
fn a_draft_that_is_not_qwen3_is_refused_by_name() {
    let e = DraftModel::open(&k3_dir("tiny-a")).unwrap_err().to_string();
    assert!(e.contains("KimiK3ForConditionalGeneration") && e.contains("Qwen3ForCausalLM"), "{e}");
    let e = DraftModel::open(&fixtures().join("nope")).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}
