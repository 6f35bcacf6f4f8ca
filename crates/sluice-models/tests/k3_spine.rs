//! The spine placement never changes output: logits are bit-identical with the spine mapped,
//! resident, or streamed through two buffers with any split (no layer resident, one, all but
//! one, all), with the embedding read by rows or whole and the head resident or streamed, with
//! experts mapped or streamed through a 2-slot cache, for a prefill and several decode steps.
//! A read fault on a streamed layer fails that pass with the piece named, leaves the state as it
//! was, and the next pass gives the same logits as an unbroken run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{fixture, load, prefill_and_decode_bits, streamed_with, PROMPT};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;
use sluice_store::fault::{Fault, When};
use sluice_store::{
    CacheSize, FaultyReader, IoMode, Placement, ReadAt, ShardFiles, SpineStore, StreamingConfig,
};
use std::sync::Arc;

/// `EIO` on Linux.
const EIO: i32 = 5;

/// Logits (as bits) of a 9-token prefill (all rows) and 5 greedy single-token decode steps.
fn run(m: &KimiK3) -> Vec<u32> {
    prefill_and_decode_bits(m, 5)
}

/// `k` resident layers (a prefix), the rest streamed; embedding and head as given.
fn split(layers: usize, k: usize, embed: Placement, head: Placement) -> Vec<Placement> {
    let mut p = vec![embed];
    p.extend((0..layers).map(|i| if i < k { Placement::Resident } else { Placement::Streamed }));
    p.push(head);
    p
}

/// A model whose spine comes from a store with `placements`, read through `reader`, and whose
/// experts are mapped or (with `slots`) streamed.
fn placed(
    name: &str,
    placements: Vec<Placement>,
    reader: Arc<dyn ReadAt>,
    slots: Option<usize>,
) -> (KimiK3, Arc<SpineStore>) {
    let mut m = match slots {
        None => load(name),
        Some(slots) => {
            let config = StreamingConfig {
                cache: CacheSize::Slots(slots),
                readers: 2,
                ..StreamingConfig::default()
            };
            streamed_with(name, &config, true).0
        }
    };
    let index = m.spine_index().unwrap();
    let spine = Arc::new(
        SpineStore::open(index, reader, placements, 2, &MemoryBudget::unlimited()).unwrap(),
    );
    m.set_spine(spine.clone()).unwrap();
    (m, spine)
}

fn files(name: &str, io: IoMode) -> Arc<ShardFiles> {
    let ckpt = Checkpoint::open(&fixture(name)).unwrap();
    Arc::new(ShardFiles::open(ckpt.shard_paths(), io).unwrap())
}

#[test]
fn logits_are_bit_identical_for_every_spine_placement() {
    use Placement::{Resident as R, Rows as W, Streamed as S};
    for name in ["tiny-a", "tiny-b"] {
        let want = run(&load(name));
        let n = load(name).config().num_hidden_layers;
        let splits = [
            split(n, n, R, R),
            split(n, n, W, R),
            split(n, 0, W, S),
            split(n, 0, S, S),
            split(n, 1, W, R),
            split(n, 1, R, S),
            split(n, n - 1, W, S),
            split(n, n - 1, R, R),
        ];
        for placements in splits {
            for (io, slots) in [(IoMode::Direct, None), (IoMode::Buffered, Some(2))] {
                let (m, spine) = placed(name, placements.clone(), files(name, io), slots);
                assert!(
                    run(&m) == want,
                    "{name}: spine {placements:?}, experts {slots:?}, {io:?} changed the logits"
                );
                let s = spine.stats();
                let streamed = placements.iter().filter(|&&p| p == S).count() as u64;
                if streamed > 2 {
                    // Every pass re-reads the streamed pieces (6 passes here).
                    assert!(s.piece_reads >= 6 * streamed, "{placements:?}: {s:?}");
                }
                if placements[0] == W {
                    assert!(s.row_reads >= PROMPT.len() as u64 + 5, "{s:?}");
                }
            }
        }
    }
}

#[test]
fn a_read_fault_fails_the_pass_cleanly_and_the_next_pass_is_exact() {
    let name = "tiny-a";
    let want = run(&load(name));
    let n = load(name).config().num_hidden_layers;
    let faulty = Arc::new(FaultyReader::new(files(name, IoMode::Direct)));
    let placements = split(n, 2, Placement::Rows, Placement::Streamed);
    let (m, spine) = placed(name, placements, faulty.clone(), None);
    // The span of layer 5's spine; break every read that touches it.
    let layer5 = spine.index().piece(6).unwrap().spans()[0];
    let mut st = m.new_state();
    faulty.inject(
        When::Overlaps { file: layer5.file, start: layer5.offset, end: layer5.offset + layer5.len },
        Fault::Error(EIO),
        None,
    );
    let err = m.forward(&mut st, &PROMPT, LogitRows::All, None).expect_err("layer 5 unreadable");
    let msg = err.to_string();
    assert!(msg.contains("reading the spine of layer 5"), "{msg}");
    assert!(msg.contains("Input/output error") || msg.contains("os error 5"), "{msg}");
    assert_eq!(st.len(), 0, "nothing committed");
    assert!(st.pending().is_none(), "the failed pass was rolled back");
    // A file that ends inside the span is an error too, not garbage.
    faulty.clear();
    faulty.inject(When::File(layer5.file), Fault::Truncate(layer5.offset + 10), None);
    let err = m.forward(&mut st, &PROMPT, LogitRows::All, None).expect_err("truncated");
    assert!(err.to_string().contains("reading the spine of"), "{err}");
    // Fixed: the same model and state now give exactly the unbroken run's logits.
    faulty.clear();
    assert!(run(&m) == want, "the run after the faults differs");
}
