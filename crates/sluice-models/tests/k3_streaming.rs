//! Streaming never changes output: logits are bit-identical whether experts are mapped in place
//! or streamed through a slot cache of any size (down to 2 slots), with prefetch on or off,
//! through O_DIRECT or buffered reads, on the io_uring and the pread backend, for a single pass
//! and for a whole prefill + decode; and on the read path macOS takes (the pread pool, no
//! O_DIRECT, pages dropped after each read), exercised here on Linux.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{fixture, load, prefill_and_decode_bits, streamed_with};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::KimiK3;
use sluice_store::fault::{Fault, When};
use sluice_store::{
    CacheSize, ExpertIndex, ExpertStore, FaultyReader, IoBackend, IoMode, ShardFiles,
    StreamingConfig, StreamingExperts,
};
use std::sync::Arc;
use std::time::Duration;

fn streamed(
    name: &str,
    slots: usize,
    prefetch: bool,
    (io, backend): (IoMode, IoBackend),
) -> (KimiK3, Arc<StreamingExperts>) {
    let config = StreamingConfig {
        cache: CacheSize::Slots(slots),
        io,
        backend,
        readers: 4,
        max_prefetch_slots: if prefetch { None } else { Some(0) },
        prefetch_min_precision: 0.0,
        ..StreamingConfig::default()
    };
    streamed_with(name, &config, prefetch)
}

/// Logits of a 9-token prefill (all rows) and 6 single-token decode steps.
fn run(m: &KimiK3) -> Vec<u32> {
    prefill_and_decode_bits(m, 6)
}

#[test]
fn streamed_logits_equal_mapped_for_any_cache_and_prefetch() {
    for name in ["tiny-a", "tiny-b"] {
        let want = run(&load(name));
        for slots in [2usize, 3, 7, 1000] {
            for prefetch in [false, true] {
                for io in [IoMode::Direct, IoMode::Buffered] {
                    for backend in IoBackend::usable() {
                        let (m, store) = streamed(name, slots, prefetch, (io, backend));
                        assert_eq!(store.io_backend(), backend.name());
                        assert!(
                            run(&m) == want,
                            "{name}: slots {slots} prefetch {prefetch} io {io:?} {backend:?} \
                             changed the logits"
                        );
                        let s = store.stats();
                        assert!(s.bytes_read > 0, "{name}: streaming must read from the shards");
                        if !prefetch {
                            assert_eq!(s.prefetch_issued, 0);
                        }
                        store.check_consistency(true).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn streamed_logits_equal_mapped_on_the_macos_read_path() {
    for name in ["tiny-a", "tiny-b"] {
        let want = run(&load(name));
        for slots in [2usize, 1000] {
            for prefetch in [false, true] {
                let path = (IoMode::BufferedDropCache, IoBackend::Pread);
                let (m, store) = streamed(name, slots, prefetch, path);
                assert_eq!(store.io_backend(), "pread");
                assert!(
                    run(&m) == want,
                    "{name}: slots {slots} prefetch {prefetch}: the pread pool without O_DIRECT \
                     changed the logits"
                );
                assert!(store.stats().bytes_read > 0, "{name}: streaming must read");
                store.check_consistency(true).unwrap();
            }
        }
    }
}

#[test]
fn prefetch_is_used_when_the_cache_is_large() {
    for backend in IoBackend::usable() {
        let (m, store) = streamed("tiny-a", 1000, true, (IoMode::Direct, backend));
        run(&m);
        let s = store.stats();
        assert!(s.prefetch_issued > 0);
        assert!(s.prefetch_used > 0, "some prefetched experts must be demanded: {s:?}");
    }
}

/// Every third expert read stalls, so reads finish out of order; the store still hands experts
/// to the MoE in ascending id order (one that finished early keeps its slot until its turn),
/// refilling each freed slot before the next one computes, and each is added into its rows'
/// running sums as it comes, so the logits stay bit-identical to the mapped experts'.
#[test]
fn streamed_logits_equal_mapped_when_reads_finish_out_of_order() {
    for name in ["tiny-a", "tiny-b"] {
        let want = run(&load(name));
        let ckpt = Arc::new(Checkpoint::open(&fixture(name)).unwrap());
        let cfg = K3Config::from_json(ckpt.config().text_config()).unwrap();
        for slots in [2usize, 3, 5] {
            let index = ExpertIndex::build(
                &ckpt,
                cfg.num_hidden_layers,
                &KimiK3::moe_layers(&cfg),
                cfg.num_experts,
                &KimiK3::expert_layout(&cfg),
            )
            .unwrap();
            let files = ShardFiles::open(index.paths(), IoMode::Direct).unwrap();
            let faulty = Arc::new(FaultyReader::new(files));
            for n in (1..400).step_by(3) {
                faulty.inject(When::Nth(n), Fault::Stall(Duration::from_millis(2)), Some(1));
            }
            let config = StreamingConfig {
                cache: CacheSize::Slots(slots),
                readers: 4,
                max_prefetch_slots: Some(0),
                ..StreamingConfig::default()
            };
            let store = Arc::new(
                StreamingExperts::new(index, faulty.clone(), &config, &MemoryBudget::unlimited())
                    .unwrap(),
            );
            let m = KimiK3::with_store(ckpt.clone(), store.clone()).unwrap();
            assert!(
                run(&m) == want,
                "{name}: {slots} slots, out-of-order reads changed the logits"
            );
            assert!(faulty.faults() > 0, "{name}: no read was stalled");
            store.check_consistency(true).unwrap();
        }
    }
}
