//! Spine placement for every MoE family, through the family boundary only (the family table,
//! `Model`, its spine index and `set_spine`): no test here names a family's types. For each
//! committed fixture of each family whose table line says `places_spine`:
//! - prefill + decode logits are bit-identical with the spine mapped, every piece resident,
//!   every piece streamed through two buffers, the embedding read by rows, and a resident
//!   prefix with the rest streamed (O_DIRECT and buffered), and the store really read the
//!   streamed pieces;
//! - a read fault on a streamed layer fails that pass naming the piece, leaves the state as it
//!   was, and the next passes give the logits of an unbroken run.
//!
//! Kimi K3's own, finer test of the same is `k3_spine.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use common::{family_prefill_and_decode, open_family, FAMILY_PROMPT, MOE_FIXTURES};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::{LogitRows, Model};
use sluice_store::fault::{Fault, When};
use sluice_store::{FaultyReader, IoMode, Placement, ReadAt, ShardFiles, SpineStats, SpineStore};
use std::sync::Arc;

/// `EIO` on Linux.
const EIO: i32 = 5;

/// A fixture through the family table, whose line must place its spine.
fn open(family: &str, name: &str) -> (Arc<Checkpoint>, Model) {
    let (ckpt, model) = open_family(family, name);
    assert!(model.family_entry().places_spine, "{family}: its table line places its spine");
    (ckpt, model)
}

/// Logits bits of a prefill and 4 greedy single-token decode steps.
fn run(m: &Model) -> Vec<u32> {
    family_prefill_and_decode(m, 4)
}

/// Embedding, `k` resident layers (a prefix) and the rest streamed, head.
fn split(layers: usize, k: usize, embed: Placement, head: Placement) -> Vec<Placement> {
    let mut p = vec![embed];
    p.extend((0..layers).map(|i| if i < k { Placement::Resident } else { Placement::Streamed }));
    p.push(head);
    p
}

/// `model` with its spine placed by a store over `reader` with `placements`.
fn place(
    model: &mut Model,
    reader: Arc<dyn ReadAt>,
    placements: Vec<Placement>,
) -> Arc<SpineStore> {
    let index = model.spine_index().unwrap().expect("a family that places its spine lists pieces");
    let store = SpineStore::open(index, reader, placements, 2, &MemoryBudget::unlimited()).unwrap();
    let store = Arc::new(store);
    model.set_spine(store.clone()).unwrap();
    store
}

fn files(ckpt: &Checkpoint, io: IoMode) -> Arc<ShardFiles> {
    Arc::new(ShardFiles::open(ckpt.shard_paths(), io).unwrap())
}

/// Whether every counter of `s` lies between `lo`'s and `hi`'s.
fn within(lo: SpineStats, s: SpineStats, hi: SpineStats) -> bool {
    let fields = |x: SpineStats| {
        [x.bytes_read, x.resident_bytes_read, x.piece_reads, x.row_reads, x.wait_ns]
    };
    fields(lo).iter().zip(fields(s)).zip(fields(hi)).all(|((&l, v), h)| l <= v && v <= h)
}

#[test]
fn logits_are_bit_identical_for_every_spine_placement_of_every_family() {
    use Placement::{Resident as R, Rows as W, Streamed as S};
    for (family, name) in MOE_FIXTURES {
        let (ckpt, mapped) = open(family, name);
        let want = run(&mapped);
        let n = mapped.shape().layers;
        let splits = [
            split(n, n, R, R),
            split(n, 0, S, S),
            split(n, 0, W, S),
            split(n, 1, W, R),
            split(n, n - 1, R, S),
        ];
        for placements in splits {
            for io in [IoMode::Direct, IoMode::Buffered] {
                let (_, mut m) = open(family, name);
                let store = place(&mut m, files(&ckpt, io), placements.clone());
                assert!(
                    run(&m) == want,
                    "{family}/{name}: spine {placements:?} ({io:?}) changed the logits"
                );
                // The store's readers may still be reading the next pass's first piece (started
                // as the last pass ended) and count its bytes as they land: the model's report
                // of the store lies between two reads of the store's own counters.
                let before = store.stats();
                let s = m.spine_stats();
                let after = store.stats();
                assert!(
                    within(before, s, after),
                    "{family}/{name}: the model reports its store: {before:?} ≤ {s:?} ≤ {after:?}"
                );
                assert!(s.bytes_read > 0, "{family}/{name}: {placements:?} read nothing: {s:?}");
                let streamed = placements.iter().filter(|&&p| p == S).count() as u64;
                if streamed > 2 {
                    // Every pass re-reads the streamed pieces (5 passes here).
                    assert!(s.piece_reads >= 5 * streamed, "{family}/{name}: {s:?}");
                }
                if placements[0] == W {
                    assert!(
                        s.row_reads >= FAMILY_PROMPT.len() as u64 + 4,
                        "{family}/{name}: {s:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_spine_read_fault_fails_the_pass_cleanly_and_the_next_pass_is_exact() {
    for (family, name) in MOE_FIXTURES {
        let (ckpt, mapped) = open(family, name);
        let want = run(&mapped);
        let n = mapped.shape().layers;
        let (_, mut m) = open(family, name);
        let faulty = Arc::new(FaultyReader::new(files(&ckpt, IoMode::Direct)));
        let store =
            place(&mut m, faulty.clone(), split(n, 0, Placement::Rows, Placement::Streamed));
        // Break every read of the last layer's spine.
        let last = store.index().piece(n).unwrap().spans()[0];
        let mut st = m.new_state();
        faulty.inject(
            When::Overlaps { file: last.file, start: last.offset, end: last.offset + last.len },
            Fault::Error(EIO),
            None,
        );
        let vocab = m.vocab_size() as u32;
        let prompt: Vec<u32> = FAMILY_PROMPT.iter().map(|t| t % vocab).collect();
        let err = m.forward(&mut st, &prompt, LogitRows::All, None).expect_err("unreadable");
        let msg = err.to_string();
        // The piece is named (a neighbour's aligned read may overlap the broken span first).
        assert!(msg.contains("reading the spine of layer"), "{family}/{name}: {msg}");
        assert!(msg.contains("os error 5") || msg.contains("Input/output"), "{family}/{name}");
        assert_eq!(st.len(), 0, "{family}/{name}: nothing committed");
        faulty.clear();
        // The failed pass was rolled back: the same state takes the prompt again (a pending
        // pass would be refused) and gives the unbroken run's prefill logits.
        let l = m.forward(&mut st, &prompt, LogitRows::All, None).expect("rolled back");
        let bits: Vec<u32> = l.iter().map(|x| x.to_bits()).collect();
        assert!(bits[..] == want[..bits.len()], "{family}/{name}: the prefill after the fault");
        assert!(run(&m) == want, "{family}/{name}: the run after the fault differs");
    }
}
