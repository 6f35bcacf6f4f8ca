//! Prefetch that never hurts: a guess issued with `for_each_then_prefetch` never evicts an
//! expert the current call demanded, is dropped when the current call's experts do not all fit
//! the cache, and is only read while the guesses of its layer have proved precise enough.
//! Read-ahead (the router's exact choice, read while the caller computes something else) is
//! demand reading: its reads count as misses, never as prefetches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, flat, reference, Fixture};
use sluice_store::{CacheSize, ExpertStore, StreamingConfig, StreamingExperts};
use std::collections::BTreeMap;
use std::time::Duration;

fn serve(
    store: &StreamingExperts,
    layer: usize,
    ids: &[u32],
    next: Option<(usize, &[u32])>,
) -> BTreeMap<u32, Vec<u8>> {
    let mut out = BTreeMap::new();
    store
        .for_each_then_prefetch(layer, ids, next, &mut |id, v| {
            out.insert(id, flat(&v));
            Ok(())
        })
        .expect("served");
    assert_eq!(out.len(), ids.len());
    out
}

#[test]
fn a_guess_never_evicts_an_expert_the_current_layer_demands() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(4),
        readers: 2,
        max_prefetch_slots: Some(4),
        prefetch_min_precision: 0.0,
        ..Default::default()
    });
    let (a, b) = (fx.moe_layers[0], fx.moe_layers[1]);
    // Fill all four slots: layer a's experts 0..4 are cached and unpinned.
    serve(&store, a, &[0, 1, 2, 3], None);
    let before = store.stats();
    // Layer a again, with a four-expert guess for layer b: the guess may not take a slot of
    // the experts this call uses, so all four are hits; it waits for the slots the call
    // releases as it consumes its experts, and then takes them.
    let got = serve(&store, a, &[0, 1, 2, 3], Some((b, &[4, 5, 6, 7])));
    assert_same(&want, a, &got, "demanded experts");
    let s = store.stats();
    assert_eq!(s.hits - before.hits, 4, "every demanded expert was still cached");
    assert_eq!(s.prefetch_issued, 4, "the guess took the released slots");
    let got = serve(&store, b, &[4, 5], None);
    assert_same(&want, b, &got, "prefetched experts");
    assert_eq!(store.layer_prefetch_stats()[b].covered, 2);
    store.check_consistency(true).expect("consistent");
}

#[test]
fn a_cache_too_small_for_the_current_layer_drops_the_guess() {
    let fx = Fixture::open("tiny-a");
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(2),
        readers: 2,
        prefetch_min_precision: 0.0,
        ..Default::default()
    });
    let (a, b) = (fx.moe_layers[0], fx.moe_layers[1]);
    serve(&store, a, &[0, 1, 2], Some((b, &[3, 4])));
    assert_eq!(store.stats().prefetch_issued, 0);
    assert_eq!(store.layer_prefetch_stats()[b].skipped, 2);
    store.check_consistency(true).expect("consistent");
}

#[test]
fn guesses_are_read_only_after_they_prove_precise() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(16),
        readers: 2,
        prefetch_min_precision: 0.5,
        ..Default::default()
    });
    let (a, b) = (fx.moe_layers[0], fx.moe_layers[1]);
    // A useless predictor never costs a read.
    for _ in 0..6 {
        serve(&store, a, &[0], Some((b, &[8, 9])));
        serve(&store, b, &[1, 2], None);
    }
    let lb = store.layer_prefetch_stats()[b];
    assert_eq!((lb.issued, lb.gated, lb.guess_hits), (0, 12, 0));
    // A perfect one is shadowed for three passes (0 → 0.25 → 0.44 → 0.58 at a minimum of 0.5),
    // then read.
    let mut issued = Vec::new();
    for p in 0..5u32 {
        let ids = [4 + 2 * p, 5 + 2 * p];
        serve(&store, a, &[0], Some((b, &ids)));
        issued.push(store.layer_prefetch_stats()[b].issued);
        let got = serve(&store, b, &ids, None);
        assert_same(&want, b, &got, "guessed experts");
    }
    assert_eq!(issued, [0, 0, 0, 2, 4]);
    let lb = store.layer_prefetch_stats()[b];
    assert_eq!(lb.covered, 4);
    assert_eq!(lb.guess_precision(), Some(10.0 / 22.0));
}

#[test]
fn read_ahead_starts_demand_reads_that_the_call_then_takes_as_misses() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let a = fx.moe_layers[0];
    let ids = [0u32, 1, 2, 3, 5, 6];
    let config = |slots| StreamingConfig {
        cache: CacheSize::Slots(slots),
        readers: 2,
        ..Default::default()
    };
    for slots in [2usize, 4, 64] {
        let plain = fx.streaming(&config(slots));
        serve(&plain, a, &ids, None);
        let plain_bytes = plain.stats().bytes_read;
        let store = fx.streaming(&config(slots));
        // Six experts, however few slots: read-ahead takes what is free, the call the rest.
        store.read_ahead(a, &ids);
        if slots == 64 {
            // Every read-ahead read finished before the call: still misses, not hits. Each
            // read records its bytes under the store's lock and wakes `wait_until`.
            let read = store.wait_until(Duration::from_secs(30), |s| s.bytes_read >= plain_bytes);
            assert!(read, "read-ahead never finished");
        }
        let got = serve(&store, a, &ids, None);
        assert_eq!(got.len(), ids.len());
        assert_same(&want, a, &got, "read-ahead experts");
        let s = store.stats();
        assert_eq!((s.hits, s.misses), (0, 6), "{slots} slots: read-ahead reads are misses");
        assert_eq!((s.prefetch_issued, s.prefetch_used), (0, 0), "and not prefetches");
        assert_eq!(s.bytes_read, plain_bytes, "{slots}: each expert read once");
        // Cached now (with room): a second call is all hits and reads nothing.
        if slots == 64 {
            store.read_ahead(a, &ids);
            serve(&store, a, &ids, None);
            assert_eq!(store.stats().hits, 6);
            assert_eq!(store.stats().bytes_read, s.bytes_read);
        }
        store.check_consistency(true).expect("consistent");
    }
}

#[test]
fn a_shut_gate_reads_nothing_even_when_part_of_the_guess_is_cached() {
    let fx = Fixture::open("tiny-a");
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(16),
        readers: 2,
        ..Default::default()
    });
    let (a, b) = (fx.moe_layers[0], fx.moe_layers[1]);
    // Two of the four guessed experts are cached: only the other two are scored, and the gate
    // (shut: no record) must not let the rest of the guess be read once slots free up.
    serve(&store, b, &[4, 5], None);
    for _ in 0..4 {
        serve(&store, a, &[0, 1], Some((b, &[4, 5, 6, 7])));
        serve(&store, b, &[4, 5, 8], None);
    }
    let lb = store.layer_prefetch_stats()[b];
    assert_eq!(lb.issued, 0, "{lb:?}");
    assert_eq!(lb.gated, 8, "two scored guesses per pass: {lb:?}");
    store.check_consistency(true).expect("consistent");
}

/// Read-ahead took slots by plain eviction, so with fewer slots than the layer's experts it
/// evicted an expert of the same layer: a hit the demand was about to take, or a read-ahead
/// read that had already finished. That expert was then read twice (a DeepSeek-V3 prefill read
/// 1.10× its distinct expert bytes, and its decode hit rate fell to 0).
#[test]
fn a_read_ahead_evicted_an_expert_of_its_own_layer() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let a = fx.moe_layers[0];
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(2),
        readers: 2,
        max_prefetch_slots: Some(0),
        ..Default::default()
    });
    serve(&store, a, &[0], None);
    let one = store.stats().bytes_read;
    // Expert 0 is cached (ready, unpinned), one slot is free: expert 1 takes the free slot, and
    // expert 2 must not take expert 0's.
    store.read_ahead(a, &[0, 1, 2]);
    let got = serve(&store, a, &[0, 1, 2], None);
    assert_same(&want, a, &got, "after read-ahead");
    let s = store.stats();
    assert_eq!(s.hits, 1, "expert 0 stayed cached: {s:?}");
    assert_eq!(s.expert_reads, 3, "each expert read once: {s:?}");
    assert!(s.bytes_read <= 3 * one, "{s:?}");
    store.check_consistency(true).expect("consistent");
}
