//! Qwen3 batch invariance and transactions: a T-row pass gives bit-identical logits to T
//! single-row passes, and `commit(n)` / `rollback()` leave the KV caches exactly as plain
//! decoding would, through both the typed API and the `Model` / `State` enums.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_checkpoint::Checkpoint;
use sluice_models::qwen3::{Qwen3, Qwen3State};
use sluice_models::{LogitRows, ModelError};
use std::path::PathBuf;
use std::sync::Arc;

const SEQ: [u32; 24] = [
    5, 17, 300, 42, 99, 7, 250, 301, 12, 88, 64, 3, 400, 222, 11, 190, 77, 150, 9, 333, 21, 260,
    45, 120,
];

fn checkpoint(name: &str) -> Arc<Checkpoint> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3").join(name);
    Arc::new(Checkpoint::open(&dir).expect("fixture opens"))
}

fn load(name: &str) -> Qwen3 {
    Qwen3::load(checkpoint(name)).expect("fixture loads")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of each token of `toks` fed one committed pass at a time after `state`.
fn single_rows(m: &Qwen3, state: &mut Qwen3State, toks: &[u32]) -> Vec<f32> {
    let mut out = Vec::new();
    for &t in toks {
        out.extend(m.forward(state, &[t], LogitRows::All, None).unwrap());
        state.commit(1);
    }
    out
}

#[test]
fn t_row_pass_is_bit_identical_to_single_rows() {
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name);
        for t in 2..=16usize {
            let rows = &SEQ[3..3 + t];
            let mut a = m.new_state();
            m.forward(&mut a, &SEQ[..3], LogitRows::Last, None).unwrap();
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
            let last = m.forward(&mut m.new_state(), &SEQ[..3 + t], LogitRows::Last, None).unwrap();
            let v = m.config().vocab_size;
            assert_eq!(bits(&last), bits(&batched[(t - 1) * v..]), "{name}: LogitRows::Last");
            // The caches agree afterwards: one more token gives identical logits.
            let na = m.forward(&mut a, &[SEQ[20]], LogitRows::All, None).unwrap();
            let nb = m.forward(&mut b, &[SEQ[20]], LogitRows::All, None).unwrap();
            assert_eq!(bits(&na), bits(&nb), "{name}: T={t} state after commit differs");
        }
    }
}

#[test]
fn commit_n_then_decode_equals_plain_decoding() {
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name);
        let v = m.config().vocab_size;
        for n in 0..=8usize {
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
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name);
        let mut a = m.new_state();
        m.forward(&mut a, &SEQ[..5], LogitRows::Last, None).unwrap();
        a.commit(5);
        let mut b = a.clone();
        m.forward(&mut a, &SEQ[5..12], LogitRows::All, None).unwrap();
        a.rollback();
        assert_eq!(a.len(), 5);
        let la = single_rows(&m, &mut a, &SEQ[12..15]);
        let lb = single_rows(&m, &mut b, &SEQ[12..15]);
        assert_eq!(bits(&la), bits(&lb), "{name}: rollback left a trace");
    }
}

#[test]
fn a_pending_pass_must_be_resolved_first() {
    let m = load("tiny-a");
    let mut s = m.new_state();
    m.forward(&mut s, &SEQ[..2], LogitRows::Last, None).unwrap();
    let err = m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap_err();
    assert!(matches!(err, ModelError::PendingPass(2)), "{err}");
    s.commit(2);
    m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap();
}

#[test]
fn model_enum_runs_transactions_like_the_typed_api() {
    let model = sluice_models::load(checkpoint("tiny-b")).unwrap();
    assert_eq!(model.family(), "qwen3");
    assert_eq!(model.store_stats(), sluice_store::StoreStats::default());
    let typed = load("tiny-b");
    let mut st = model.new_state();
    let mut ts = typed.new_state();
    let a = model.forward(&mut st, &SEQ[..9], LogitRows::All, None).unwrap();
    let b = typed.forward(&mut ts, &SEQ[..9], LogitRows::All, None).unwrap();
    assert_eq!(bits(&a), bits(&b));
    st.commit(4);
    ts.commit(4);
    assert_eq!((st.len(), st.is_empty()), (4, false));
    model.forward(&mut st, &SEQ[9..11], LogitRows::Last, None).unwrap();
    st.rollback();
    let a = model.forward(&mut st, &SEQ[4..6], LogitRows::All, None).unwrap();
    let b = typed.forward(&mut ts, &SEQ[4..6], LogitRows::All, None).unwrap();
    assert_eq!(bits(&a), bits(&b));
    assert!(st.byte_len() > 0);
    assert_eq!(model.vocab_size(), typed.config().vocab_size);
}

#[test]
fn bad_tokens_are_refused_without_staging() {
    let m = load("tiny-a");
    let v = u32::try_from(m.config().vocab_size).unwrap();
    let mut s = m.new_state();
    let e = m.forward(&mut s, &[1, v], LogitRows::Last, None).unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { id, .. } if id == v), "{e}");
    let e = m.forward(&mut s, &[], LogitRows::Last, None).unwrap_err();
    assert!(matches!(e, ModelError::EmptyInput), "{e}");
    assert_eq!(s.pending(), None);
    m.forward(&mut s, &[1], LogitRows::Last, None).unwrap();
    s.commit(1);
    let mut other = load("tiny-b").new_state();
    let e = m.forward(&mut other, &[1], LogitRows::Last, None).unwrap_err();
    assert!(e.to_string().contains("another shape"), "{e}");
    assert_eq!(other.pending(), None);
}

#[test]
fn truncate_then_decode_equals_a_sequence_that_stopped_there() {
    let m = load("tiny-b");
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
