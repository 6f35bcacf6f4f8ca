//! Batch invariance and transactions, for every family through the `Model` / `State` enums: a
//! T-row pass gives bit-identical logits to T single-row passes, and `commit(n)` /
//! `rollback()` leave the state exactly as plain decoding would. Each test runs over every
//! fixture (Kimi K3 tiny-a and tiny-b, Qwen3 tiny-a and tiny-b).
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_checkpoint::Checkpoint;
use sluice_models::{LogitRows, Model, ModelError, State};
use std::path::PathBuf;
use std::sync::Arc;

const SEQ: [u32; 24] = [
    5, 17, 300, 42, 99, 7, 250, 301, 12, 88, 64, 3, 400, 222, 11, 190, 77, 150, 9, 333, 21, 260,
    45, 120,
];

const FIXTURES: [(&str, &str); 4] =
    [("kimi_k3", "tiny-a"), ("kimi_k3", "tiny-b"), ("qwen3", "tiny-a"), ("qwen3", "tiny-b")];

fn load(family: &str, name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(family)
        .join(name);
    let ckpt = Arc::new(Checkpoint::open(&dir).expect("fixture opens"));
    sluice_models::load(ckpt).expect("fixture loads")
}

fn every_fixture() -> impl Iterator<Item = (String, Model)> {
    FIXTURES.iter().map(|(f, n)| (format!("{f}/{n}"), load(f, n)))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of each token of `toks` fed one pass at a time after `state`.
fn single_rows(m: &Model, state: &mut State, toks: &[u32]) -> Vec<f32> {
    let mut out = Vec::new();
    for &t in toks {
        out.extend(m.forward(state, &[t], LogitRows::All, None).unwrap());
        state.commit(1);
    }
    out
}

#[test]
fn t_row_pass_is_bit_identical_to_single_rows() {
    for (name, m) in every_fixture() {
        for t in 2..=16usize {
            let prefix = &SEQ[..3];
            let rows = &SEQ[3..3 + t];
            let mut a = m.new_state();
            m.forward(&mut a, prefix, LogitRows::Last, None).unwrap();
            a.commit(3);
            let mut b = a.clone();
            let batched = m.forward(&mut a, rows, LogitRows::All, None).unwrap();
            a.commit(t);
            let single = single_rows(&m, &mut b, rows);
            assert_eq!(
                bits(&batched),
                bits(&single),
                "{name}: T={t} pass differs from single rows"
            );
            // And the states agree afterwards: one more token gives identical logits.
            let na = m.forward(&mut a, &[SEQ[20]], LogitRows::All, None).unwrap();
            let nb = m.forward(&mut b, &[SEQ[20]], LogitRows::All, None).unwrap();
            assert_eq!(bits(&na), bits(&nb), "{name}: T={t} state after commit differs");
        }
    }
}

#[test]
fn prefill_in_one_pass_equals_token_by_token() {
    for (name, m) in every_fixture() {
        let mut a = m.new_state();
        let all = m.forward(&mut a, &SEQ, LogitRows::All, None).unwrap();
        a.commit(SEQ.len());
        let mut b = m.new_state();
        let single = single_rows(&m, &mut b, &SEQ);
        assert_eq!(bits(&all), bits(&single), "{name}");
    }
}

#[test]
fn commit_n_then_decode_equals_plain_decoding() {
    for (name, m) in every_fixture() {
        let v = m.vocab_size();
        for n in 1..=8usize {
            // Plain: feed SEQ[..6] then SEQ[6..6+n] one at a time, then two more tokens.
            let mut plain = m.new_state();
            m.forward(&mut plain, &SEQ[..6], LogitRows::Last, None).unwrap();
            plain.commit(6);
            let mut p_logits = single_rows(&m, &mut plain, &SEQ[6..6 + n]);
            p_logits.extend(single_rows(&m, &mut plain, &SEQ[16..18]));

            // Verify-style: one 8-row pass of which only the first n rows are accepted.
            let mut spec = m.new_state();
            m.forward(&mut spec, &SEQ[..6], LogitRows::Last, None).unwrap();
            spec.commit(6);
            let mut rows: Vec<u32> = SEQ[6..6 + n].to_vec();
            rows.extend([1u32, 2, 3, 4, 5, 6, 7, 8].iter().take(8 - n));
            let pass = m.forward(&mut spec, &rows, LogitRows::All, None).unwrap();
            spec.commit(n);
            assert_eq!(spec.len(), 6 + n);
            let mut s_logits = pass[..n * v].to_vec();
            s_logits.extend(single_rows(&m, &mut spec, &SEQ[16..18]));
            assert_eq!(bits(&s_logits), bits(&p_logits), "{name}: commit({n}) of 8 diverges");
        }
    }
}

#[test]
fn rollback_discards_the_pass() {
    for (name, m) in every_fixture() {
        let mut a = m.new_state();
        m.forward(&mut a, &SEQ[..5], LogitRows::Last, None).unwrap();
        a.commit(5);
        let mut b = a.clone();
        m.forward(&mut a, &SEQ[5..12], LogitRows::All, None).unwrap();
        a.rollback();
        assert_eq!((a.len(), a.is_empty()), (5, false), "{name}");
        let la = single_rows(&m, &mut a, &SEQ[12..15]);
        let lb = single_rows(&m, &mut b, &SEQ[12..15]);
        assert_eq!(bits(&la), bits(&lb), "{name}");
    }
}

#[test]
fn a_pending_pass_must_be_resolved_first() {
    for (name, m) in every_fixture() {
        let mut s = m.new_state();
        m.forward(&mut s, &SEQ[..2], LogitRows::Last, None).unwrap();
        let err = m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap_err();
        assert!(matches!(err, ModelError::PendingPass(2)), "{name}: {err}");
        s.commit(2);
        m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap();
    }
}

#[test]
fn bad_tokens_and_foreign_states_are_refused_without_staging() {
    for (name, m) in every_fixture() {
        let v = u32::try_from(m.vocab_size()).unwrap();
        let mut s = m.new_state();
        let e = m.forward(&mut s, &[1, v], LogitRows::Last, None).unwrap_err();
        assert!(matches!(e, ModelError::TokenOutOfRange { id, .. } if id == v), "{name}: {e}");
        let e = m.forward(&mut s, &[], LogitRows::Last, None).unwrap_err();
        assert!(matches!(e, ModelError::EmptyInput), "{name}: {e}");
        // Nothing was staged: a fresh pass is accepted.
        m.forward(&mut s, &[1], LogitRows::Last, None).unwrap();
        s.commit(1);
        assert!(s.byte_len() > 0, "{name}");
    }
    // A state of another family, or of another shape of the same family, is refused.
    let k3 = load("kimi_k3", "tiny-a");
    let qwen = load("qwen3", "tiny-a");
    let mut foreign = qwen.new_state();
    let e = k3.forward(&mut foreign, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
    let mut other = load("qwen3", "tiny-b").new_state();
    let e = qwen.forward(&mut other, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("another shape"), "{e}");
    // The refused pass staged nothing: the state still takes a pass of its own model.
    let b = load("qwen3", "tiny-b");
    b.forward(&mut other, &[1], LogitRows::Last, None).unwrap();
}

#[test]
fn qwen3_truncate_then_decode_equals_a_sequence_that_stopped_there() {
    let ckpt = Checkpoint::open(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3/tiny-b"),
    )
    .expect("fixture opens");
    let m = sluice_models::qwen3::Qwen3::load(Arc::new(ckpt)).expect("fixture loads");
    let mut long = m.new_state();
    m.forward(&mut long, &SEQ[..12], LogitRows::Last, None).unwrap();
    long.commit(12);
    // A staged pass is dropped with the positions.
    m.forward(&mut long, &SEQ[12..14], LogitRows::All, None).unwrap();
    long.truncate(7);
    assert_eq!((long.len(), long.pending()), (7, None));
    let mut short = m.new_state();
    m.forward(&mut short, &SEQ[..7], LogitRows::Last, None).unwrap();
    short.commit(7);
    let a = m.forward(&mut long, &SEQ[20..23], LogitRows::All, None).unwrap();
    let b = m.forward(&mut short, &SEQ[20..23], LogitRows::All, None).unwrap();
    assert_eq!(bits(&a), bits(&b), "truncated state differs from a fresh one");
    long.commit(3);
    long.truncate(99);
    assert_eq!(long.len(), 10, "truncating past the end keeps everything");
}
