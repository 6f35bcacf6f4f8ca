//! The lazy working copy of the KDA state: a pass copies each head's committed state into the
//! working state inside the pooled work that steps the head, instead of the whole state up
//! front. These tests poison the working copy before every pass (what a stale copy left by the
//! last commit's swap, or by a rolled-back pass, could hold) and check that every pass,
//! capture, commit and rollback gives the bits of a state whose working copy equals its
//! committed state before the pass, as the eager copy made it.

use super::{K3State, KdaState, LayerState};
use crate::kimi_k3::KimiK3;
use crate::LogitRows;
use sluice_checkpoint::Checkpoint;
use std::path::PathBuf;
use std::sync::Arc;

fn tiny() -> KimiK3 {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    let ckpt = Checkpoint::open(&dir).expect("the tiny-a fixture opens");
    KimiK3::load(Arc::new(ckpt)).expect("the tiny-a fixture loads")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn kda_layers(s: &K3State) -> impl Iterator<Item = &super::KdaLayer> {
    s.layers.iter().filter_map(|l| match l {
        LayerState::Kda(k) => Some(k),
        LayerState::Mla(_) => None,
    })
}

fn kda_layers_mut(s: &mut K3State) -> impl Iterator<Item = &mut super::KdaLayer> {
    s.layers.iter_mut().filter_map(|l| match l {
        LayerState::Kda(k) => Some(k),
        LayerState::Mla(_) => None,
    })
}

/// Fills every KDA layer's working copy with NaN, as a stale copy nothing may read.
fn poison(s: &mut K3State) {
    for k in kda_layers_mut(s) {
        k.work.s.fill(f32::NAN);
        k.work.conv.fill(f32::NAN);
    }
}

/// Makes every KDA layer's working copy the committed state, as the eager copy in `begin` did.
fn eager(s: &mut K3State) {
    for k in kda_layers_mut(s) {
        k.work.clone_from(&k.committed);
    }
}

fn state_bits(st: &KdaState) -> (Vec<u32>, Vec<u32>) {
    (bits(&st.s), bits(&st.conv))
}

fn committed_bits(s: &K3State) -> Vec<(Vec<u32>, Vec<u32>)> {
    kda_layers(s).map(|k| state_bits(&k.committed)).collect()
}

/// A pass of `toks` on `lazy` (working copy poisoned first) and on `eager` (working copy equal
/// to the committed state first): the same logits.
fn pass(m: &KimiK3, lazy: &mut K3State, reference: &mut K3State, toks: &[u32], rows: LogitRows) {
    poison(lazy);
    eager(reference);
    let a = m.forward(lazy, toks, rows, None).expect("the lazy pass runs");
    let b = m.forward(reference, toks, rows, None).expect("the eager pass runs");
    assert_eq!(bits(&a), bits(&b), "a pass of {} rows read the stale working copy", toks.len());
}

#[test]
fn a_pass_never_reads_the_stale_working_kda_state() {
    let m = tiny();
    let (mut lazy, mut reference) = (m.new_state(), m.new_state());
    let both = |s: &mut K3State, r: &mut K3State, f: &dyn Fn(&mut K3State)| {
        f(s);
        f(r);
        assert_eq!(committed_bits(s), committed_bits(r), "the committed states differ");
    };
    // A whole prompt pass, then a decode pass (its commit swaps, leaving the prompt's
    // state as the stale working copy).
    pass(&m, &mut lazy, &mut reference, &[5, 17, 300, 42, 99], LogitRows::Prefill);
    both(&mut lazy, &mut reference, &|s| s.commit(5));
    pass(&m, &mut lazy, &mut reference, &[7], LogitRows::All);
    both(&mut lazy, &mut reference, &|s| s.commit(1));
    // A verification pass that captures the state after its second row and commits two of
    // its four rows (the replay from the committed state).
    lazy.request_captures(&[2]);
    reference.request_captures(&[2]);
    pass(&m, &mut lazy, &mut reference, &[250, 301, 12, 88], LogitRows::All);
    for (a, b) in kda_layers(&lazy).zip(kda_layers(&reference)) {
        assert_eq!(a.captured.len(), 1, "the capture was taken");
        assert_eq!(state_bits(&a.captured[0]), state_bits(&b.captured[0]), "captures differ");
    }
    both(&mut lazy, &mut reference, &|s| s.commit(2));
    // A rolled-back pass, then one that commits whole.
    pass(&m, &mut lazy, &mut reference, &[64, 3, 400], LogitRows::All);
    both(&mut lazy, &mut reference, &|s| s.rollback());
    pass(&m, &mut lazy, &mut reference, &[222, 11], LogitRows::All);
    both(&mut lazy, &mut reference, &|s| s.commit(2));
    pass(&m, &mut lazy, &mut reference, &[190], LogitRows::All);
}

#[test]
fn a_rolled_back_pass_leaves_the_committed_kda_state_unchanged() {
    let m = tiny();
    let mut s = m.new_state();
    m.forward(&mut s, &[5, 17, 300], LogitRows::Prefill, None).expect("the prompt runs");
    s.commit(3);
    let before = committed_bits(&s);
    let want = m.forward(&mut s.clone(), &[42], LogitRows::All, None).expect("a pass runs");
    m.forward(&mut s, &[99, 7], LogitRows::All, None).expect("a pass runs");
    s.rollback();
    assert_eq!(committed_bits(&s), before, "the rolled-back pass changed the committed state");
    poison(&mut s);
    let got = m.forward(&mut s, &[42], LogitRows::All, None).expect("a pass runs");
    assert_eq!(bits(&got), bits(&want), "the pass after a rollback did not start from the commit");
}

#[test]
fn a_commit_of_a_pass_the_kda_layer_never_ran_in_publishes_the_committed_state() {
    let m = tiny();
    let mut s = m.new_state();
    m.forward(&mut s, &[5, 17, 300], LogitRows::Prefill, None).expect("the prompt runs");
    s.commit(3);
    let before = committed_bits(&s);
    // Begun and committed whole without the layers running (as a pass that stopped before
    // them would be): the eager copy made the working state the committed one, so the swap
    // published the same bits; the stale working copy must not be published instead.
    poison(&mut s);
    s.begin(2, false);
    s.commit(2);
    assert_eq!(committed_bits(&s), before, "a stale working copy was published");
    for k in kda_layers(&s) {
        assert!(k.current().s.iter().all(|x| x.is_finite()), "the current state is the stale copy");
    }
}
