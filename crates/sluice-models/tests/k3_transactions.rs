//! Batch invariance and transactions: a T-row pass gives bit-identical logits to T single-row
//! passes, and `commit(n)` / `rollback()` leave the state exactly as plain decoding would.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::load;
use sluice_models::kimi_k3::state::K3State;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;

const SEQ: [u32; 24] = [
    5, 17, 300, 42, 99, 7, 250, 301, 12, 88, 64, 3, 400, 222, 11, 190, 77, 150, 9, 333, 21, 260,
    45, 120,
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of each token of `toks` fed one pass at a time after `state`.
fn single_rows(m: &KimiK3, state: &mut K3State, toks: &[u32]) -> Vec<f32> {
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
    let m = load("tiny-a");
    let mut a = m.new_state();
    let all = m.forward(&mut a, &SEQ, LogitRows::All, None).unwrap();
    a.commit(SEQ.len());
    let mut b = m.new_state();
    let single = single_rows(&m, &mut b, &SEQ);
    assert_eq!(bits(&all), bits(&single));
}

#[test]
fn commit_n_then_decode_equals_plain_decoding() {
    let m = load("tiny-b");
    let v = m.config().vocab_size;
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
        assert_eq!(
            bits(&s_logits),
            bits(&p_logits),
            "commit({n}) of 8 diverges from plain decoding"
        );
    }
}

#[test]
fn rollback_discards_the_pass() {
    let m = load("tiny-a");
    let mut a = m.new_state();
    m.forward(&mut a, &SEQ[..5], LogitRows::Last, None).unwrap();
    a.commit(5);
    let mut b = a.clone();
    m.forward(&mut a, &SEQ[5..12], LogitRows::All, None).unwrap();
    a.rollback();
    assert_eq!(a.len(), 5);
    let la = single_rows(&m, &mut a, &SEQ[12..15]);
    let lb = single_rows(&m, &mut b, &SEQ[12..15]);
    assert_eq!(bits(&la), bits(&lb));
}

#[test]
fn a_pending_pass_must_be_resolved_first() {
    let m = load("tiny-a");
    let mut s = m.new_state();
    m.forward(&mut s, &SEQ[..2], LogitRows::Last, None).unwrap();
    let err = m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap_err();
    assert!(err.to_string().contains("pending"), "{err}");
    s.commit(2);
    m.forward(&mut s, &SEQ[2..3], LogitRows::Last, None).unwrap();
}
