//! Compact state snapshots: restoring one continues bit-identically to the state it was taken
//! from, a pass staged at snapshot time is left out, a chain of snapshots shares its cache rows,
//! and a snapshot costs less than a clone of the live state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_checkpoint::Checkpoint;
use sluice_models::{LogitRows, Model, State};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

const SEQ: [u32; 20] =
    [5, 17, 300, 42, 99, 7, 250, 301, 12, 88, 64, 3, 400, 222, 11, 190, 77, 150, 9, 333];

fn models() -> Vec<(String, Model)> {
    let mut out = Vec::new();
    for name in ["tiny-a", "tiny-b"] {
        let ckpt = Arc::new(Checkpoint::open(&common::fixture(name)).unwrap());
        out.push((format!("kimi_k3/{name}"), sluice_models::load(ckpt).unwrap()));
        let q =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3").join(name);
        let ckpt = Arc::new(Checkpoint::open(&q).unwrap());
        out.push((format!("qwen3/{name}"), sluice_models::load(ckpt).unwrap()));
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn feed(m: &Model, s: &mut State, toks: &[u32]) -> Vec<f32> {
    let l = m.forward(s, toks, LogitRows::Last, None).unwrap();
    s.commit(toks.len());
    l
}

#[test]
fn a_restored_snapshot_continues_bit_identically() {
    for (name, m) in models() {
        let mut live = m.new_state();
        feed(&m, &mut live, &SEQ[..6]);
        let first = live.snapshot(None);
        feed(&m, &mut live, &SEQ[6..13]);
        let second = live.snapshot(Some(&first));
        assert_eq!((first.len(), second.len()), (6, 13), "{name}");
        // A staged, uncommitted pass is not part of a snapshot.
        m.forward(&mut live, &SEQ[13..16], LogitRows::Last, None).unwrap();
        let staged = live.snapshot(Some(&second));
        live.rollback();
        let want = feed(&m, &mut live.clone(), &SEQ[13..]);
        for (what, snap) in [("second", &second), ("staged", &staged)] {
            let mut r = snap.restore();
            assert_eq!(r.len(), 13);
            assert_eq!(bits(&feed(&m, &mut r, &SEQ[13..])), bits(&want), "{name}: {what}");
        }
        // The first snapshot still resumes its own prefix.
        let mut r = first.restore();
        let mut fresh = m.new_state();
        feed(&m, &mut fresh, &SEQ[..6]);
        assert_eq!(bits(&feed(&m, &mut r, &SEQ[6..9])), bits(&feed(&m, &mut fresh, &SEQ[6..9])));
    }
}

#[test]
fn a_chain_shares_cache_rows_and_costs_less_than_a_clone() {
    for (name, m) in models() {
        let mut live = m.new_state();
        feed(&m, &mut live, &SEQ[..8]);
        let a = live.snapshot(None);
        feed(&m, &mut live, &SEQ[8..16]);
        let b = live.snapshot(Some(&a));
        let alone = live.snapshot(None);
        assert_eq!(alone.byte_len(), live.snapshot_bytes(), "{name}");
        assert_eq!(b.byte_len(), alone.byte_len(), "{name}: same content either way");
        let mut ids = HashSet::new();
        let mut distinct = 0;
        for s in [&a, &b] {
            s.for_each_part(&mut |id, bytes| {
                if ids.insert(id) {
                    distinct += bytes;
                }
            });
        }
        let cache_rows_of_a = a.byte_len() - m.new_state().snapshot(None).byte_len();
        assert_eq!(distinct, a.byte_len() + b.byte_len() - cache_rows_of_a, "{name}");
        assert!(alone.byte_len() <= live.byte_len(), "{name}: no larger than the live state");
        if name.starts_with("kimi_k3") {
            // The working copy of every KDA matrix is left out.
            assert!(alone.byte_len() < live.byte_len(), "{name}");
        }
    }
}
