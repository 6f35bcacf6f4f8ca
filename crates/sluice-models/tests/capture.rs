//! In-pass state captures (`Model::forward_capturing`), for every family through the family
//! boundary: the snapshot captured after row k of a pass holds the same bits as the snapshot of
//! a state whose pass was cut at row k, restoring it continues with bit-identical logits, the
//! capturing pass itself gives the logits and the committed state of a plain pass, captures
//! share their cache rows along the chain, and a request the pass cannot honour is refused
//! before anything runs.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use common::{open_family, MOE_FIXTURES};
use sluice_models::{LogitRows, Model, ModelError, State, StateSnapshot, MAX_CAPTURES};

/// Every family's committed fixtures: the MoE ones, the second Kimi K3 (another layer mix and
/// widths) and the dense Qwen3.
fn fixtures() -> impl Iterator<Item = (&'static str, &'static str)> {
    MOE_FIXTURES.into_iter().chain([("kimi_k3", "tiny-b"), ("qwen3", "tiny-a")])
}

/// Rows committed before the capturing pass, so that captures start past a committed prefix.
const PREFIX: usize = 3;
/// Rows of the capturing pass: past one Kimi K3 KDA row block (64 rows), so that a capture
/// falls inside the second block too.
const PASS: usize = 70;
/// Rows inside the pass to capture after: early, at a block edge, inside the next block.
const OFFSETS: [usize; 3] = [5, 64, 67];

fn prompt(m: &Model) -> Vec<u32> {
    let vocab = m.vocab_size() as u32;
    (0..PREFIX + PASS + 4).map(|i| (i as u32 * 7 + 3) % vocab).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A snapshot's every byte: its layout and its arrays.
fn content(s: &StateSnapshot) -> (Vec<u8>, Vec<u32>) {
    let arrays = s.array_pieces().iter().flat_map(|p| bits(p)).collect();
    (s.layout_bytes().unwrap(), arrays)
}

fn feed(m: &Model, s: &mut State, toks: &[u32], rows: LogitRows) -> Vec<f32> {
    let l = m.forward(s, toks, rows, None).unwrap();
    s.commit(toks.len());
    l
}

/// A state of the prompt's first `n` positions, prefilled as the prefix then one pass.
fn cut_at(m: &Model, p: &[u32], n: usize) -> State {
    let mut s = m.new_state();
    feed(m, &mut s, &p[..PREFIX], LogitRows::Prefill);
    feed(m, &mut s, &p[PREFIX..n], LogitRows::Prefill);
    s
}

#[test]
fn a_capture_inside_a_pass_equals_cutting_the_pass_there_for_every_family() {
    for (family, name) in fixtures() {
        let (_, m) = open_family(family, name);
        let p = prompt(&m);
        let end = PREFIX + PASS;
        let mut st = m.new_state();
        feed(&m, &mut st, &p[..PREFIX], LogitRows::Prefill);
        assert!(st.can_capture(), "{family}/{name}");
        let base = st.snapshot(None);
        let (logits, caps) = m
            .forward_capturing(
                &mut st,
                &p[PREFIX..end],
                LogitRows::Prefill,
                None,
                &OFFSETS,
                Some(&base),
            )
            .unwrap();
        st.commit(PASS);
        assert_eq!(caps.len(), OFFSETS.len(), "{family}/{name}");
        // The capturing pass is the plain pass: same logits, same committed state.
        let plain = cut_at(&m, &p, end);
        let want_logits = {
            let mut s = m.new_state();
            feed(&m, &mut s, &p[..PREFIX], LogitRows::Prefill);
            feed(&m, &mut s, &p[PREFIX..end], LogitRows::Prefill)
        };
        assert_eq!(bits(&logits), bits(&want_logits), "{family}/{name}: pass logits");
        assert!(
            content(&st.snapshot(None)) == content(&plain.snapshot(None)),
            "{family}/{name}: the capturing pass committed another state"
        );
        for (&off, cap) in OFFSETS.iter().zip(&caps) {
            let n = PREFIX + off;
            assert_eq!(cap.len(), n, "{family}/{name}");
            let mut cut = cut_at(&m, &p, n);
            assert!(
                content(cap) == content(&cut.snapshot(None)),
                "{family}/{name}: the capture after row {off} differs from a cut there"
            );
            let rest = &p[n..];
            let want = feed(&m, &mut cut, rest, LogitRows::All);
            let got = feed(&m, &mut cap.restore(), rest, LogitRows::All);
            assert_eq!(bits(&got), bits(&want), "{family}/{name}: restored after row {off}");
        }
        // Each capture shares the cache rows of the one before it (the first, the base's).
        let fixed = fixed_bytes(&m);
        for (prev, cap) in std::iter::once(&base).chain(&caps).zip(&caps) {
            assert_eq!(
                cap.bytes_beyond(Some(prev)),
                cap.byte_len() - prev.byte_len() + fixed,
                "{family}/{name}: a capture copied rows its predecessor holds"
            );
        }
    }
}

/// Bytes of a snapshot that do not grow with positions (Kimi K3's KDA states, copied into
/// every snapshot; none for a family whose state is all cache rows).
fn fixed_bytes(m: &Model) -> usize {
    m.new_state().snapshot(None).byte_len()
}

#[test]
fn a_capture_request_outside_the_pass_is_refused_before_the_pass_runs() {
    for (family, name) in fixtures() {
        let (_, m) = open_family(family, name);
        let p = prompt(&m);
        let mut st = m.new_state();
        let too_many: Vec<usize> = (1..=MAX_CAPTURES + 1).collect();
        for bad in [&[0][..], &[8], &[12], &[3, 3], &[4, 2], &too_many] {
            let err = m.forward_capturing(&mut st, &p[..8], LogitRows::Prefill, None, bad, None);
            assert!(matches!(err, Err(ModelError::Capture { .. })), "{family}/{name}: {bad:?}");
            assert_eq!(st.len(), 0);
        }
        // Nothing was staged: a plain pass runs, and captures nothing.
        feed(&m, &mut st, &p[..8], LogitRows::Prefill);
        let (_, caps) =
            m.forward_capturing(&mut st, &p[8..10], LogitRows::Last, None, &[], None).unwrap();
        assert!(caps.is_empty());
        st.commit(2);
        assert_eq!(st.len(), 10, "{family}/{name}");
    }
}

#[test]
fn a_capturing_pass_rolled_back_leaves_no_capture_behind() {
    for (family, name) in fixtures() {
        let (_, m) = open_family(family, name);
        let p = prompt(&m);
        let mut st = m.new_state();
        m.forward_capturing(&mut st, &p[..8], LogitRows::Last, None, &[2, 5], None).unwrap();
        st.rollback();
        // A later plain pass with the same rows takes no capture and equals a fresh one.
        let (l, caps) =
            m.forward_capturing(&mut st, &p[..8], LogitRows::Last, None, &[], None).unwrap();
        st.commit(8);
        assert!(caps.is_empty());
        let want = feed(&m, &mut m.new_state(), &p[..8], LogitRows::Last);
        assert_eq!(bits(&l), bits(&want), "{family}/{name}");
    }
}
