//! Eviction and prefetch races: many random requests, prefetches and cancellations from
//! several threads on a two-slot cache (and a few other small sizes), every expert checked
//! byte for byte against `MappedExperts`, and the cache invariants checked afterwards. Every
//! case runs on each read backend this kernel can run (io_uring where it may, and pread).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, collect, n32, reference, Fixture};

type Reference = BTreeMap<(usize, u32), Vec<u8>>;
use proptest::prelude::*;
use sluice_store::fault::{Fault, When};
use sluice_store::{
    CacheSize, ExpertStore, FaultyReader, IoBackend, IoMode, PolicyKind, ShardFiles, StoreError,
    StreamingConfig,
};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn fixture() -> &'static (Fixture, Reference) {
    static FX: OnceLock<(Fixture, Reference)> = OnceLock::new();
    FX.get_or_init(|| {
        let fx = Fixture::open("tiny-a");
        let want = reference(&fx);
        (fx, want)
    })
}

/// One step of a random workload.
#[derive(Debug, Clone)]
enum Op {
    /// Demand the experts of a bit mask from a layer (by position in the MoE layer list).
    ForEach(usize, u16),
    /// Prefetch the experts of a bit mask.
    Prefetch(usize, u16),
    /// Cancel a layer's prefetches.
    Cancel(usize),
}

/// A store of `slots` slots reading through `backend` with `readers` in flight, every guess read
/// (no precision gate), so prefetches race with the demands.
fn config(slots: usize, readers: usize, backend: IoBackend) -> StreamingConfig {
    StreamingConfig {
        cache: CacheSize::Slots(slots),
        readers,
        backend,
        prefetch_min_precision: 0.0,
        ..StreamingConfig::default()
    }
}

fn ids(mask: u16) -> Vec<u32> {
    let v: Vec<u32> = (0..16).filter(|i| mask & (1 << i) != 0).collect();
    if v.is_empty() {
        vec![u32::from(mask % 16)]
    } else {
        v
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..8, any::<u16>()).prop_map(|(l, m)| Op::ForEach(l, m)),
        2 => (0usize..8, any::<u16>()).prop_map(|(l, m)| Op::Prefetch(l, m)),
        1 => (0usize..8).prop_map(Op::Cancel),
    ]
}

/// Runs `ops` against `store`, checking every served expert.
fn run(store: &dyn ExpertStore, ops: &[Op], tolerate_read_errors: bool) {
    let (fx, want) = fixture();
    for o in ops {
        match *o {
            Op::ForEach(l, m) => {
                let layer = fx.moe_layers[l % fx.moe_layers.len()];
                match collect(store, layer, &ids(m)) {
                    Ok(got) => assert_same(want, layer, &got, "race"),
                    Err(StoreError::Read { .. }) if tolerate_read_errors => {}
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Op::Prefetch(l, m) => store.prefetch(fx.moe_layers[l % fx.moe_layers.len()], &ids(m)),
            Op::Cancel(l) => store.cancel_prefetch(fx.moe_layers[l % fx.moe_layers.len()]),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_requests_on_a_two_slot_cache_from_three_threads(
        a in prop::collection::vec(op(), 1..40),
        b in prop::collection::vec(op(), 1..40),
        c in prop::collection::vec(op(), 1..40),
        lru in any::<bool>(),
    ) {
        let (fx, _) = fixture();
        for backend in IoBackend::usable() {
            let cfg = StreamingConfig {
                policy: if lru { PolicyKind::Lru } else { PolicyKind::S3Fifo },
                ..config(2, 3, backend)
            };
            let store = fx.streaming(&cfg);
            prop_assert_eq!(store.io_backend(), backend.name());
            std::thread::scope(|s| {
                for ops in [&a, &b, &c] {
                    let st = &store;
                    s.spawn(move || run(st, ops, false));
                }
            });
            // Let unneeded prefetches that were already running land.
            prop_assert!(store.wait_reads_done(Duration::from_secs(30)), "reads never landed");
            prop_assert_eq!(store.check_consistency(true), Ok(()));
            let s = store.stats();
            prop_assert_eq!(s.hits + s.misses, s.requests);
        }
    }

    #[test]
    fn random_requests_with_random_read_faults(
        a in prop::collection::vec(op(), 1..30),
        b in prop::collection::vec(op(), 1..30),
        fail_every in 2u64..9,
        short in 1usize..5000,
        slots in 2usize..5,
    ) {
        let (fx, _) = fixture();
        for backend in IoBackend::usable() {
            let files = ShardFiles::open(fx.ckpt.shard_paths(), IoMode::Direct).expect("opens");
            let reader = Arc::new(FaultyReader::new(files));
            reader.inject(When::Always, Fault::Short(short), None);
            for k in 1..40 {
                reader.inject(When::Nth(k * fail_every), Fault::Error(libc::EIO), Some(1));
            }
            let store = fx.streaming_with(reader.clone(), &config(slots, 2, backend));
            prop_assert_eq!(store.io_backend(), backend.name());
            std::thread::scope(|s| {
                for ops in [&a, &b] {
                    let st = &store;
                    s.spawn(move || run(st, ops, true));
                }
            });
            prop_assert!(store.wait_reads_done(Duration::from_secs(30)), "reads never landed");
            prop_assert_eq!(store.check_consistency(true), Ok(()));
            reader.clear();
            run(&store, &[Op::ForEach(0, u16::MAX), Op::ForEach(7, 0x0f0f)], false);
            prop_assert_eq!(store.check_consistency(true), Ok(()));
        }
    }
}

#[test]
fn two_threads_sweeping_all_layers_with_prefetch_agree_with_the_mapped_store() {
    let (fx, want) = fixture();
    for backend in IoBackend::usable() {
        for slots in [2, 3, 5, 17] {
            sweep(fx, want, backend, slots);
        }
    }
}

fn sweep(fx: &Fixture, want: &Reference, backend: IoBackend, slots: usize) {
    let store = fx.streaming(&config(slots, 4, backend));
    assert_eq!(store.io_backend(), backend.name());
    std::thread::scope(|s| {
        for t in 0..2u32 {
            let st = &store;
            s.spawn(move || {
                for pass in 0..20u32 {
                    for (j, &l) in fx.moe_layers.iter().enumerate() {
                        let pick = |salt: u32| -> Vec<u32> {
                            (0..16)
                                .filter(|i| (i * 7 + pass * 3 + t + salt).is_multiple_of(4))
                                .collect()
                        };
                        if let Some(&next) = fx.moe_layers.get(j + 1) {
                            st.prefetch(next, &pick(n32(j) + 1));
                        }
                        let got = collect(st, l, &pick(n32(j))).expect("served");
                        assert_same(want, l, &got, &format!("sweep on {}", backend.name()));
                    }
                }
            });
        }
    });
    store.check_consistency(true).expect("consistent");
    let s = store.stats();
    assert_eq!(s.hits + s.misses, s.requests);
    assert!(s.prefetch_issued > 0);
}
