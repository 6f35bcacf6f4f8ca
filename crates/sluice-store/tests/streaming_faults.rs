//! Injected read faults (EIO, short reads, early end of file, stalls), consumer errors and
//! budget refusals: each gives the right error or timing, the cache stays consistent, and the
//! next request works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, collect, n32, reference, Fixture};
use sluice_core::MemoryBudget;
use sluice_store::fault::{Fault, When};
use sluice_store::index::Span;
use sluice_store::{
    CacheSize, ExpertStore, FaultyReader, IoBackend, IoMode, ShardFiles, StoreError,
    StreamingConfig, StreamingExperts,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Faulty = Arc<FaultyReader<ShardFiles>>;

fn faulty(
    fx: &Fixture,
    slots: usize,
    readers: usize,
    backend: IoBackend,
) -> (Faulty, StreamingExperts) {
    let files = ShardFiles::open(fx.ckpt.shard_paths(), IoMode::Direct).expect("opens");
    let reader = Arc::new(FaultyReader::new(files));
    let cfg = StreamingConfig {
        cache: CacheSize::Slots(slots),
        readers,
        backend,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let store = fx.streaming_with(reader.clone(), &cfg);
    assert_eq!(store.io_backend(), backend.name(), "the backend asked for is the one running");
    (reader, store)
}

fn span(store: &StreamingExperts, layer: usize, id: u32) -> Span {
    store.index().get(layer, id).expect("expert").spans()[0]
}

/// Up to `n` experts of `layer` other than `id` whose aligned reads do not touch `id`'s bytes
/// (neighbours on disk share 4096-byte pages, so a fault aimed at one would hit both).
fn far_from(store: &StreamingExperts, layer: usize, id: u32, n: usize) -> Vec<u32> {
    let s = span(store, layer, id);
    (0..n32(store.index().experts(layer)))
        .filter(|&o| {
            let t = span(store, layer, o);
            t.file != s.file
                || t.read_offset() + t.region_len() <= s.offset
                || t.read_offset() >= s.offset + s.len
        })
        .take(n)
        .collect()
}

fn at(s: Span) -> When {
    When::Overlaps { file: s.file, start: s.offset, end: s.offset + s.len }
}

#[test]
fn eio_is_a_read_error_naming_the_span_and_the_next_request_works() {
    for backend in IoBackend::usable() {
        eio_is_a_read_error_naming_the_span_and_the_next_request_works_on(backend);
    }
}

fn eio_is_a_read_error_naming_the_span_and_the_next_request_works_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    for slots in [2, 64] {
        let (reader, store) = faulty(&fx, slots, 4, backend);
        let l = fx.moe_layers[1];
        let s = span(&store, l, 5);
        reader.inject(at(s), Fault::Error(libc::EIO), Some(1));
        let mut ids = far_from(&store, l, 5, 3);
        ids.push(5);
        let err = collect(&store, l, &ids).expect_err("EIO surfaces");
        match &err {
            StoreError::Read { path, offset, len, source } => {
                assert_eq!(path, store.index().path(s.file));
                assert_eq!((*offset, *len), (s.offset, s.len));
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
            }
            other => panic!("expected a read error, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&format!("reading {} bytes at offset {}", s.len, s.offset)), "{msg}");
        store.check_consistency(true).expect("no slot left half-filled or pinned");
        let got = collect(&store, l, &ids).expect("the next request works");
        assert_same(&want, l, &got, "after EIO");
        store.check_consistency(true).expect("consistent");
    }
}

/// A store on `backend` whose reads of expert 5 of a MoE layer fail with EIO (`times` times, or
/// for ever), after a read-ahead of expert 5 and three experts whose reads do not touch it.
struct FailingReadAhead {
    fx: Fixture,
    reader: Faulty,
    store: StreamingExperts,
    layer: usize,
    ids: Vec<u32>,
}

impl FailingReadAhead {
    fn start(backend: IoBackend, times: Option<u64>) -> Self {
        let fx = Fixture::open("tiny-a");
        let (reader, store) = faulty(&fx, 64, 4, backend);
        let layer = fx.moe_layers[1];
        reader.inject(at(span(&store, layer, 5)), Fault::Error(libc::EIO), times);
        let mut ids = far_from(&store, layer, 5, 3);
        ids.push(5);
        store.read_ahead(layer, &ids);
        Self { fx, reader, store, layer, ids }
    }

    fn collect(&self) -> Result<BTreeMap<u32, Vec<u8>>, StoreError> {
        collect(&self.store, self.layer, &self.ids)
    }
}

/// Waits until a read of `store` has failed. The failure is counted under the store's lock,
/// after its slot was freed (or kept failed for the requests waiting on it), and wakes the
/// store's waiters.
fn wait_for_a_read_error(store: &StreamingExperts) {
    let failed = store.wait_until(Duration::from_secs(30), |s| s.read_errors > 0);
    assert!(failed, "the failing read never ended");
}

#[test]
fn a_lasting_read_ahead_error_fails_the_call_that_takes_it_and_the_next_works() {
    // Whether the read-ahead read fails before the call takes it (dropped, read again by the
    // call, which fails again) or while the call waits on it, the call gets the error.
    for backend in IoBackend::usable() {
        let r = FailingReadAhead::start(backend, None);
        let err = r.collect().expect_err("the read-ahead's EIO surfaces");
        assert!(matches!(err, StoreError::Read { .. }), "{backend:?}: {err:?}");
        assert!(r.store.stats().read_errors >= 1, "{backend:?}: counted");
        r.store.check_consistency(true).expect("no slot left half-filled or pinned");
        r.reader.clear();
        let got = r.collect().expect("the next request works");
        assert_same(&reference(&r.fx), r.layer, &got, "after a failed read-ahead");
        r.store.check_consistency(true).expect("consistent");
    }
}

#[test]
fn a_read_ahead_read_that_failed_before_its_call_is_read_again_by_the_call() {
    for backend in IoBackend::usable() {
        let r = FailingReadAhead::start(backend, Some(1));
        wait_for_a_read_error(&r.store);
        r.store.check_consistency(true).expect("the failed slot is free, nothing pinned");
        let got = r.collect().expect("the call reads expert 5 again");
        assert_same(&reference(&r.fx), r.layer, &got, "after a transient read-ahead failure");
        let st = r.store.stats();
        assert_eq!(st.read_errors, 1, "{backend:?}");
        assert_eq!((st.hits, st.misses), (0, r.ids.len() as u64), "{backend:?}: all misses");
        r.store.check_consistency(true).expect("consistent");
    }
}

#[test]
fn the_nth_read_failing_fails_only_its_request() {
    for backend in IoBackend::usable() {
        the_nth_read_failing_fails_only_its_request_on(backend);
    }
}

fn the_nth_read_failing_fails_only_its_request_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-b");
    let want = reference(&fx);
    let (reader, store) = faulty(&fx, 3, 2, backend);
    for n in 1..6 {
        reader.fail_nth(n, libc::EIO);
        let l = fx.moe_layers[usize::try_from(n).expect("small") % fx.moe_layers.len()];
        let err = collect(&store, l, &fx.all_ids()).expect_err("one read fails");
        assert!(matches!(err, StoreError::Read { .. }), "{err}");
        store.check_consistency(true).expect("consistent");
        assert_same(&want, l, &collect(&store, l, &fx.all_ids()).expect("works again"), "retry");
    }
}

#[test]
fn short_reads_are_continued_to_the_exact_bytes() {
    for backend in IoBackend::usable() {
        short_reads_are_continued_to_the_exact_bytes_on(backend);
    }
}

fn short_reads_are_continued_to_the_exact_bytes_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    for max in [1, 100, 4096, 5000] {
        let (reader, store) = faulty(&fx, 2, 3, backend);
        reader.inject(When::Always, Fault::Short(max), None);
        for &l in &fx.moe_layers {
            assert_same(&want, l, &collect(&store, l, &fx.all_ids()).expect("reads"), "short");
        }
        assert!(reader.faults() > 0);
        store.check_consistency(true).expect("consistent");
    }
}

#[test]
fn a_file_that_ends_inside_an_expert_is_an_eof_error() {
    for backend in IoBackend::usable() {
        a_file_that_ends_inside_an_expert_is_an_eof_error_on(backend);
    }
}

fn a_file_that_ends_inside_an_expert_is_an_eof_error_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let (reader, store) = faulty(&fx, 4, 2, backend);
    let l = fx.moe_layers[4];
    let s = span(&store, l, 9);
    reader.inject(When::File(s.file), Fault::Truncate(s.offset + s.len / 2), None);
    let err = collect(&store, l, &[9]).expect_err("EOF inside the span");
    let StoreError::Read { source, offset, .. } = &err else {
        panic!("read error expected: {err}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(*offset, s.offset);
    assert!(
        err.to_string().contains(&format!("file ended after {} of {} bytes", s.len / 2, s.len)),
        "{err}"
    );
    store.check_consistency(true).expect("consistent");
    reader.clear();
    assert_same(&reference(&fx), l, &collect(&store, l, &[9]).expect("whole file again"), "eof");
}

#[test]
fn a_stalled_read_counts_as_stall_while_hits_are_served_at_once() {
    for backend in IoBackend::usable() {
        a_stalled_read_counts_as_stall_while_hits_are_served_at_once_on(backend);
    }
}

fn a_stalled_read_counts_as_stall_while_hits_are_served_at_once_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let (reader, store) = faulty(&fx, 8, 4, backend);
    let l = fx.moe_layers[0];
    let others = far_from(&store, l, 5, 3);
    collect(&store, l, &others[..2]).expect("warm");
    let before = store.stats();
    let stall = Duration::from_millis(500);
    reader.inject(at(span(&store, l, 5)), Fault::Stall(stall), Some(1));
    let t0 = Instant::now();
    let mut arrivals = Vec::new();
    store
        .for_each(l, &[5, others[0], others[1], others[2]], &mut |id, _| {
            arrivals.push((id, t0.elapsed()));
            Ok(())
        })
        .expect("served");
    let ids: Vec<u32> = arrivals.iter().map(|a| a.0).collect();
    assert_eq!(&ids[..2], &others[..2], "hits first");
    // The unstalled miss arrives before the stalled one, so it was not queued behind the stall;
    // the order shows it without a clock, which a loaded machine could stretch past the stall.
    assert_eq!(ids[3], 5, "the stalled expert last");
    assert!(t0.elapsed() >= stall);
    let s = store.stats();
    let stalled = Duration::from_nanos(s.stall_ns - before.stall_ns);
    assert!(stalled >= stall.mul_f32(0.9) && stalled <= t0.elapsed(), "stall {stalled:?}");
    assert!(Duration::from_nanos(s.read_ns - before.read_ns) >= stall);
}

#[test]
fn two_waiters_on_one_failing_read_both_get_the_error() {
    for backend in IoBackend::usable() {
        two_waiters_on_one_failing_read_both_get_the_error_on(backend);
    }
}

fn two_waiters_on_one_failing_read_both_get_the_error_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let (reader, store) = faulty(&fx, 4, 2, backend);
    let l = fx.moe_layers[2];
    let s = span(&store, l, 3);
    // The read stalls for a second before it fails: the second waiter joins it meanwhile.
    reader.inject(at(s), Fault::Stall(Duration::from_millis(1000)), Some(1));
    reader.inject(at(s), Fault::Error(libc::EIO), Some(1));
    std::thread::scope(|sc| {
        let a = sc.spawn(|| collect(&store, l, &[3]).map(|_| ()));
        assert!(reader.wait_faults(1, Duration::from_secs(30)), "the read never started");
        let b = sc.spawn(|| collect(&store, l, &[3]).map(|_| ()));
        for h in [a, b] {
            let r = h.join().expect("no panic");
            assert!(matches!(r, Err(StoreError::Read { .. })), "{r:?}");
        }
    });
    assert_eq!(reader.faults(), 1, "one read, two waiters");
    store.check_consistency(true).expect("consistent");
    collect(&store, l, &[3]).expect("works again");
}

#[test]
fn a_failed_prefetch_frees_its_slot_quietly() {
    for backend in IoBackend::usable() {
        a_failed_prefetch_frees_its_slot_quietly_on(backend);
    }
}

fn a_failed_prefetch_frees_its_slot_quietly_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let (reader, store) = faulty(&fx, 4, 2, backend);
    let l = fx.moe_layers[5];
    reader.inject(at(span(&store, l, 2)), Fault::Error(libc::EIO), Some(1));
    store.prefetch(l, &[2]);
    wait_for_a_read_error(&store);
    assert_eq!(reader.faults(), 1);
    store.check_consistency(true).expect("consistent");
    assert_same(&reference(&fx), l, &collect(&store, l, &[2]).expect("demand reads afresh"), "pf");
}

#[test]
fn a_consumer_error_releases_every_pin() {
    for backend in IoBackend::usable() {
        a_consumer_error_releases_every_pin_on(backend);
    }
}

fn a_consumer_error_releases_every_pin_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-b");
    let (_reader, store) = faulty(&fx, 3, 2, backend);
    let l = fx.moe_layers[0];
    let mut n = 0;
    let err = store
        .for_each(l, &fx.all_ids(), &mut |_, _| {
            n += 1;
            if n == 2 {
                return Err(StoreError::Consumer("stop".into()));
            }
            Ok(())
        })
        .expect_err("consumer stops");
    assert!(matches!(err, StoreError::Consumer(_)));
    // Reads still in flight land in the cache; wait for them, then everything is unpinned.
    assert!(store.wait_reads_done(Duration::from_secs(30)), "reads still in flight");
    store.check_consistency(true).expect("consistent");
    collect(&store, l, &fx.all_ids()).expect("works again");
}

#[test]
fn unknown_experts_are_refused() {
    for backend in IoBackend::usable() {
        unknown_experts_are_refused_on(backend);
    }
}

fn unknown_experts_are_refused_on(backend: IoBackend) {
    let fx = Fixture::open("tiny-a");
    let (_r, store) = faulty(&fx, 2, 1, backend);
    let err = collect(&store, fx.moe_layers[0], &[0, 16]).expect_err("16 of 16");
    assert!(matches!(err, StoreError::NoSuchExpert { expert: 16, experts: 16, .. }), "{err}");
    assert!(collect(&store, 0, &[0]).is_err(), "layer 0 is dense");
    store.prefetch(0, &[1]);
    store.prefetch(fx.moe_layers[0], &[99]);
    store.prefetch(1000, &[1]);
    store.cancel_prefetch(1000);
    assert_eq!(store.stats().prefetch_issued, 0);
    // An empty request is fine anywhere, even past the last layer.
    store.for_each(1000, &[], &mut |_, _| Ok(())).expect("nothing to do");
    assert!(collect(&store, 1000, &[0]).is_err());
}

#[test]
fn a_budget_too_small_is_refused_with_the_numbers() {
    let fx = Fixture::open("tiny-a");
    let slot = fx
        .streaming(&StreamingConfig {
            cache: CacheSize::Slots(1),
            readers: 1,
            prefetch_min_precision: 0.0,
            ..Default::default()
        })
        .slot_bytes() as u64;

    let budget = MemoryBudget::new(slot + 100);
    let cfg = StreamingConfig {
        cache: CacheSize::Available,
        readers: 1,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let err = fx.try_streaming(&cfg, &budget).expect_err("two slots do not fit");
    let msg = err.to_string();
    for n in [2, slot, 2 * slot, slot + 100] {
        assert!(msg.contains(&format!(" {n} ")), "{msg} names {n}");
    }
    assert!(
        matches!(err, StoreError::Budget { slots: 2, available, limit, .. } if available == slot + 100 && limit == slot + 100)
    );

    let cfg = StreamingConfig {
        cache: CacheSize::Slots(5),
        readers: 1,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let err = fx.try_streaming(&cfg, &budget).expect_err("five slots do not fit");
    assert!(
        err.to_string().contains(&format!("5 slots of {slot} bytes need {}", 5 * slot)),
        "{err}"
    );

    let cfg = StreamingConfig {
        cache: CacheSize::Bytes(10 * slot),
        readers: 1,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let big = MemoryBudget::new(100 * slot);
    let store = fx.try_streaming(&cfg, &big).expect("fits");
    assert_eq!(store.slots(), 10);
    assert_eq!(big.used(), 10 * slot, "the arena is charged");
    drop(store);
    assert_eq!(big.used(), 0, "and returned");

    let cfg = StreamingConfig {
        cache: CacheSize::Available,
        readers: 1,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let store = fx.try_streaming(&cfg, &MemoryBudget::new(1_000_000 * slot)).expect("fits");
    assert_eq!(store.slots(), fx.moe_layers.len() * fx.experts, "never more slots than experts");
}

#[test]
fn a_one_slot_cache_still_serves_everything() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let cfg = StreamingConfig {
        cache: CacheSize::Slots(1),
        min_slots: 1,
        readers: 2,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let store: StreamingExperts = fx.streaming(&cfg);
    store.prefetch(fx.moe_layers[0], &[1, 2]);
    assert_eq!(store.stats().prefetch_issued, 0, "no room for prefetch in one slot");
    for &l in &fx.moe_layers {
        assert_same(&want, l, &collect(&store, l, &fx.all_ids()).expect("reads"), "one slot");
    }
}
