//! `StreamingExperts` serves exactly the bytes `MappedExperts` maps, for every expert of both
//! tiny K3 fixtures, at every cache size down to one slot, with prefetch on and off, and with
//! O_DIRECT, buffered and drop-cache reads; hits arrive before misses; prefetch is accounted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, collect, flat, n32, reference, Fixture};
use sluice_checkpoint::TensorEntry;
use sluice_core::MemoryBudget;
use sluice_store::fault::{Fault, When};
use sluice_store::{
    CacheSize, ExpertIndex, ExpertLoc, ExpertStore, FaultyReader, IoBackend, IoMode, ShardFiles,
    StreamingConfig, StreamingExperts,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A deterministic subset of `0..n` of about `k` ids, varying with `seed`.
fn subset(n: u32, k: u32, seed: u32) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n)
        .filter(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % n < k)
        .collect();
    if v.is_empty() {
        v.push(seed % n);
    }
    v
}

#[test]
fn fixture_experts_are_one_contiguous_span_each() {
    for name in ["tiny-a", "tiny-b"] {
        let fx = Fixture::open(name);
        let idx =
            ExpertIndex::build(&fx.ckpt, fx.num_layers, &fx.moe_layers, fx.experts, &fx.names)
                .expect("index");
        assert!(idx.all_contiguous(), "{name}: experts are contiguous in the shards");
        assert_eq!(idx.total_experts(), fx.moe_layers.len() * fx.experts);
        let loc = idx.get(fx.moe_layers[0], 0).expect("expert 0");
        let (i, h) = (fx.names.inter, fx.names.hidden);
        assert_eq!(loc.bytes(), 3 * (i * h / 2 + i * h / 32), "{name}: six MXFP4 tensors");
        assert_eq!(idx.slot_bytes() % 4096, 0);
        assert!(idx.slot_bytes() >= loc.bytes() && idx.slot_bytes() <= loc.bytes() + 2 * 4096);
        assert!(idx.get(0, 0).is_none(), "{name}: layer 0 is dense");
    }
}

#[test]
fn every_expert_matches_the_mapped_bytes_at_every_cache_size_and_io_mode() {
    for name in ["tiny-a", "tiny-b"] {
        let fx = Fixture::open(name);
        let want = reference(&fx);
        let n = n32(fx.experts);
        let total = fx.moe_layers.len() * fx.experts;
        for slots in [1, 2, 3, 7, total] {
            for io in [IoMode::Direct, IoMode::BufferedDropCache, IoMode::Buffered] {
                for prefetch in [false, true] {
                    let cfg = StreamingConfig {
                        cache: CacheSize::Slots(slots),
                        readers: 4,
                        io,
                        max_prefetch_slots: (!prefetch).then_some(0),
                        prefetch_min_precision: 0.0,
                        ..StreamingConfig::default()
                    };
                    let store = fx.streaming(&cfg);
                    let what = format!("{name} slots={slots} {io:?} prefetch={prefetch}");
                    let mut asked = 0u64;
                    for pass in 0..3u32 {
                        for (j, &l) in fx.moe_layers.iter().enumerate() {
                            let ids = if pass == 1 {
                                fx.all_ids()
                            } else {
                                subset(n, 6, pass * 31 + n32(l))
                            };
                            if let (true, Some(&next)) = (prefetch, fx.moe_layers.get(j + 1)) {
                                // Half of a plausible guess is right, half is not.
                                store.prefetch(
                                    next,
                                    &subset(n, 6, pass * 31 + n32(next) + (pass & 1)),
                                );
                            }
                            let got = collect(&store, l, &ids).expect(&what);
                            assert_same(&want, l, &got, &what);
                            asked += ids.len() as u64;
                        }
                    }
                    store.check_consistency(true).expect(&what);
                    let s = store.stats();
                    assert_eq!(s.requests, asked, "{what}");
                    assert_eq!(s.hits + s.misses, asked, "{what}");
                    assert!(s.bytes_read > 0 && s.misses > 0, "{what}");
                    if slots == total && !prefetch {
                        assert_eq!(s.misses, total as u64, "{what}: each expert read once");
                    }
                    assert_eq!(s.prefetch_issued > 0, prefetch && slots > 1, "{what}");
                }
            }
        }
    }
}

#[test]
fn aligned_reads_go_through_o_direct_where_the_file_system_allows_it() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let files = Arc::new(ShardFiles::open(fx.ckpt.shard_paths(), IoMode::Direct).expect("opens"));
    let cfg = StreamingConfig {
        cache: CacheSize::Slots(2),
        readers: 2,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let store = fx.streaming_with(files.clone(), &cfg);
    for &l in &fx.moe_layers {
        assert_same(&want, l, &collect(&store, l, &fx.all_ids()).expect("reads"), "direct");
    }
    let (direct, buffered) = files.read_counts();
    eprintln!(
        "O_DIRECT available: {}; reads direct {direct}, buffered {buffered}",
        files.direct(0)
    );
    if (0..fx.ckpt.shard_paths().len()).all(|f| files.direct(f)) {
        assert_eq!(buffered, 0, "slot regions are aligned, so every read is direct");
    } else {
        assert!(buffered > 0);
    }
}

/// The read path macOS takes (no io_uring, no O_DIRECT: the pread pool over buffered reads whose
/// pages are dropped after), run here on Linux: every expert is byte-exact and no read bypassed
/// the page cache.
#[test]
fn the_macos_read_path_pread_without_o_direct_serves_exact_bytes() {
    let fx = Fixture::open("tiny-b");
    let want = reference(&fx);
    let total = fx.moe_layers.len() * fx.experts;
    for slots in [2, total] {
        let files = Arc::new(
            ShardFiles::open(fx.ckpt.shard_paths(), IoMode::BufferedDropCache).expect("opens"),
        );
        let cfg = StreamingConfig {
            cache: CacheSize::Slots(slots),
            readers: 3,
            backend: IoBackend::Pread,
            prefetch_min_precision: 0.0,
            ..Default::default()
        };
        let store = fx.streaming_with(files.clone(), &cfg);
        assert_eq!(store.io_backend(), "pread");
        for _ in 0..2 {
            for &l in &fx.moe_layers {
                let got = collect(&store, l, &fx.all_ids()).expect("reads");
                assert_same(&want, l, &got, &format!("pread, buffered, {slots} slots"));
            }
        }
        store.check_consistency(true).expect("consistent");
        let (direct, buffered) = files.read_counts();
        assert_eq!(direct, 0, "nothing went through O_DIRECT");
        assert!(buffered > 0);
    }
}

#[test]
fn reads_are_exact_on_tmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here; skipping");
        return;
    }
    let src = common::fixture("tiny-a");
    let dir = tempfile::tempdir_in(shm).expect("tmpfs dir");
    for e in std::fs::read_dir(&src).expect("fixture dir") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, dir.path().join(p.file_name().expect("name"))).expect("copy");
    }
    let fx = Fixture::open_dir(dir.path());
    let want = reference(&Fixture::open("tiny-a"));
    for io in [IoMode::Direct, IoMode::BufferedDropCache] {
        let store = fx.streaming(&StreamingConfig {
            cache: CacheSize::Slots(2),
            readers: 2,
            io,
            prefetch_min_precision: 0.0,
            ..Default::default()
        });
        for &l in &fx.moe_layers {
            assert_same(&want, l, &collect(&store, l, &fx.all_ids()).expect("reads"), "tmpfs");
        }
    }
}

#[test]
fn experts_are_handed_over_in_ascending_id_order() {
    let fx = Fixture::open("tiny-a");
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(8),
        readers: 2,
        prefetch_min_precision: 0.0,
        ..Default::default()
    });
    let l = fx.moe_layers[2];
    collect(&store, l, &[3, 6]).expect("warm");
    let mut order = Vec::new();
    store
        .for_each(l, &[7, 6, 1, 3], &mut |id, _| {
            order.push(id);
            Ok(())
        })
        .expect("served");
    assert_eq!(order, [1, 3, 6, 7], "hits wait for their turn behind lower misses");
    let s = store.stats();
    assert_eq!((s.hits, s.misses), (2, 4));
}

/// A store of two slots, two readers and no prefetch on `backend`: the smallest cache that
/// makes the id order and the slot hand-over visible.
fn two_slots(fx: &Fixture, backend: IoBackend) -> StreamingExperts {
    fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(2),
        readers: 2,
        backend,
        max_prefetch_slots: Some(0),
        ..Default::default()
    })
}

/// Every slot pinned by this call's hits of later ids, the lowest id had no slot to be read
/// into: handing experts in id order must not wait forever. The hit whose turn is furthest
/// gives its slot back and is read again in its turn.
#[test]
fn a_cache_full_of_later_hits_gave_a_slot_to_the_next_id() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let l = fx.moe_layers[1];
    for backend in IoBackend::usable() {
        let store = two_slots(&fx, backend);
        collect(&store, l, &[2, 3]).expect("warm");
        let mut order = Vec::new();
        let mut got = BTreeMap::new();
        store
            .for_each(l, &[3, 2, 1, 0], &mut |id, v| {
                order.push(id);
                got.insert(id, flat(&v));
                Ok(())
            })
            .expect("served");
        assert_eq!(order, [0, 1, 2, 3], "{backend:?}");
        assert_same(&want, l, &got, "a slot given back");
        let s = store.stats();
        assert_eq!((s.hits, s.misses), (2, 4), "{backend:?}: each request counted once");
        assert_eq!(s.expert_reads, 5, "{backend:?}: expert 3 gave its slot up and was read again");
        store.check_consistency(true).expect("consistent");
    }
}

/// With fewer slots than misses, experts whose reads had finished together were all handed to
/// the consumer before any slot they freed went to the next miss: the disk idled while they
/// computed, and a streamed pass took compute + I/O instead of about the larger of the two
/// (issue 20, the cgroup decode). Now each slot handed back is refilled before the next ready
/// expert is handed over.
#[test]
fn the_disk_idled_while_ready_experts_were_folded() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let l = fx.moe_layers[0];
    for backend in IoBackend::usable() {
        let store = two_slots(&fx, backend);
        // Both slots read ahead and finished: the call finds two ready experts and two misses.
        store.read_ahead(l, &[0, 1]);
        assert!(store.wait_reads_done(Duration::from_secs(30)), "read-ahead never finished");
        let mut got = BTreeMap::new();
        let mut refilled = Vec::new();
        store
            .for_each(l, &[0, 1, 2, 3], &mut |id, v| {
                if got.len() == 1 {
                    // Expert 0's slot must already be reading expert 2: wait for that read.
                    refilled
                        .push(store.wait_until(Duration::from_secs(30), |s| s.expert_reads >= 3));
                }
                got.insert(id, flat(&v));
                Ok(())
            })
            .expect("served");
        assert_eq!(refilled, [true], "{backend:?}: no read started while a ready expert waited");
        assert_eq!(got.len(), 4);
        assert_same(&want, l, &got, "refilled slots");
        store.check_consistency(true).expect("consistent");
    }
}

#[test]
fn prefetch_recall_and_waste_are_recorded_per_layer() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let store = fx.streaming(&StreamingConfig {
        cache: CacheSize::Slots(64),
        readers: 4,
        prefetch_min_precision: 0.0,
        ..Default::default()
    });
    let l = fx.moe_layers[3];
    store.prefetch(l, &[0, 1, 2, 3]);
    let got = collect(&store, l, &[0, 1, 4, 5]).expect("served");
    assert_same(&want, l, &got, "after prefetch");
    let ls = store.layer_prefetch_stats()[l];
    assert_eq!((ls.issued, ls.demanded, ls.covered), (4, 4, 2));
    assert_eq!(ls.recall(), Some(0.5));
    let s = store.stats();
    assert_eq!(s.prefetch_issued, 4);
    assert_eq!(s.prefetch_used, 2);
    let per_expert = store.index().get(l, 2).expect("expert").read_bytes();
    assert_eq!(s.prefetch_wasted_bytes, (2 - s.prefetch_cancelled) * per_expert);
    assert_eq!(store.layer_prefetch_stats()[fx.moe_layers[4]].recall(), None);
    store.check_consistency(true).expect("consistent");
}

#[test]
fn unstarted_prefetches_are_cancelled() {
    let fx = Fixture::open("tiny-a");
    let files = ShardFiles::open(fx.ckpt.shard_paths(), IoMode::Direct).expect("opens");
    let reader = Arc::new(FaultyReader::new(files));
    reader.inject(When::Always, Fault::Stall(Duration::from_millis(500)), None);
    let cfg = StreamingConfig {
        cache: CacheSize::Slots(16),
        readers: 1,
        prefetch_min_precision: 0.0,
        ..Default::default()
    };
    let store = fx.streaming_with(reader.clone(), &cfg);
    let l = fx.moe_layers[0];
    store.prefetch(l, &[0, 1, 2, 3, 4]);
    // The one reader takes the first read, which stalls; the other four wait in the queue.
    assert!(reader.wait_faults(1, Duration::from_secs(30)), "no read started");
    store.cancel_prefetch(l);
    let s = store.stats();
    assert_eq!(s.prefetch_issued, 5);
    assert_eq!(s.prefetch_cancelled, 4, "only the one read already running survives");
    store.check_consistency(true).expect("consistent");
    reader.clear();
    let want = reference(&fx);
    assert_same(&want, l, &collect(&store, l, &[0, 1, 2, 3, 4]).expect("served"), "after cancel");
    assert_eq!(store.layer_prefetch_stats()[l].covered, 1);
}

#[test]
fn experts_scattered_over_several_shards_are_read_span_by_span() {
    let fx = Fixture::open("tiny-a");
    let paths = fx.ckpt.shard_paths().to_vec();
    let lens: Vec<u64> = paths.iter().map(|p| std::fs::metadata(p).expect("shard").len()).collect();
    let prefix = fx.ckpt.name_prefix().to_string();
    let nl = fx.moe_layers.len();
    // Synthetic experts: tensor k of expert e comes from a different real expert and layer
    // (so from different shards), keeping each tensor's own role and shape.
    let mut want = Vec::new();
    let locs: Vec<ExpertLoc> = (0..8usize)
        .map(|e| {
            let ents: Vec<TensorEntry> = (0..6usize)
                .map(|k| {
                    let layer = fx.moe_layers[(e + 3 * k) % nl];
                    let names = common::k3_names(&prefix, layer, (e * 5 + k) % fx.experts);
                    fx.ckpt.get(&names[k]).expect("tensor").clone()
                })
                .collect();
            want.push(ents.iter().flat_map(|t| fx.ckpt.bytes(t).to_vec()).collect::<Vec<u8>>());
            ExpertLoc::locate(&ents, &paths, &lens).expect("locates")
        })
        .collect();
    assert!(locs.iter().all(|l| !l.is_contiguous()));
    let index = ExpertIndex::from_layers(vec![locs], paths.clone());
    for io in [IoMode::Direct, IoMode::Buffered] {
        let files = ShardFiles::open(&paths, io).expect("opens");
        let cfg = StreamingConfig {
            cache: CacheSize::Slots(2),
            readers: 3,
            prefetch_min_precision: 0.0,
            ..Default::default()
        };
        let store =
            StreamingExperts::new(index.clone(), Arc::new(files), &cfg, &MemoryBudget::unlimited())
                .expect("store");
        let got = collect(&store, 0, &(0..8).collect::<Vec<u32>>()).expect("reads");
        for (id, bytes) in got {
            assert!(bytes == want[id as usize], "{io:?}: scattered expert {id}");
        }
    }
}

#[test]
fn experts_whose_parts_are_separated_by_small_gaps_are_one_read_each() {
    let fx = Fixture::open("tiny-a");
    let paths = fx.ckpt.shard_paths().to_vec();
    let lens: Vec<u64> = paths.iter().map(|p| std::fs::metadata(p).expect("shard").len()).collect();
    let prefix = fx.ckpt.name_prefix().to_string();
    let l = fx.moe_layers[0];
    // Each part is its tensor less its last 16 bytes, so the parts of an expert are separated
    // by 16-byte gaps (as Kimi K2's are by its `weight_shape` tensors).
    let mut want = Vec::new();
    let locs: Vec<ExpertLoc> = (0..fx.experts)
        .map(|e| {
            let ents: Vec<TensorEntry> = common::k3_names(&prefix, l, e)
                .iter()
                .map(|n| {
                    let mut t = fx.ckpt.get(n).expect("tensor").clone();
                    t.len -= 16;
                    t
                })
                .collect();
            want.push(
                ents.iter()
                    .flat_map(|t| {
                        let whole = fx.ckpt.get(&t.name).expect("tensor");
                        fx.ckpt.bytes(whole)[..usize::try_from(t.len).expect("small")].to_vec()
                    })
                    .collect::<Vec<u8>>(),
            );
            ExpertLoc::locate(&ents, &paths, &lens).expect("locates")
        })
        .collect();
    assert!(locs.iter().all(ExpertLoc::is_contiguous), "16-byte gaps are bridged");
    let mut layers = vec![Vec::new(); fx.num_layers];
    layers[l] = locs.clone();
    let index = ExpertIndex::from_layers(layers, paths.clone());
    for io in [IoMode::Direct, IoMode::Buffered] {
        for backend in IoBackend::usable() {
            let files = ShardFiles::open(&paths, io).expect("opens");
            let cfg = StreamingConfig {
                cache: CacheSize::Slots(2),
                readers: 3,
                backend,
                max_prefetch_slots: Some(0),
                ..Default::default()
            };
            let budget = MemoryBudget::unlimited();
            let store = StreamingExperts::new(index.clone(), Arc::new(files), &cfg, &budget)
                .expect("store");
            let ids: Vec<u32> = (0..n32(fx.experts)).collect();
            for (id, bytes) in collect(&store, l, &ids).expect("reads") {
                assert!(bytes == want[id as usize], "{io:?} {backend:?}: expert {id}");
            }
            let s = store.stats();
            assert_eq!(s.expert_reads, u64::from(n32(fx.experts)), "{io:?} {backend:?}");
            assert_eq!(s.span_reads, s.expert_reads, "one disk request per expert");
            // The gaps are read (and counted), never served; a region may stop at the end
            // of its file.
            let region: u64 = locs.iter().map(ExpertLoc::read_bytes).sum();
            let needed: u64 = locs.iter().flat_map(ExpertLoc::spans).map(|s| s.needed()).sum();
            assert!((needed..=region).contains(&s.bytes_read), "{io:?} {backend:?}: {s:?}");
            assert!(s.bytes_served + 16 * 5 * u64::from(n32(fx.experts)) <= needed);
        }
    }
}

#[test]
fn a_first_pass_over_mapped_experts_took_their_page_faults_now_populated_at_load() {
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let mapped = fx.mapped();
    let per_expert = mapped.expert_bytes(fx.moe_layers[0]);
    let populated = mapped.populate().expect("populate");
    assert!(populated > 0);
    assert_eq!(populated, per_expert * (fx.moe_layers.len() * fx.experts) as u64);
    // Populating changes no byte and counts no request: the store serves exactly as before.
    assert_eq!(mapped.stats().requests, 0);
    for &l in &fx.moe_layers {
        let got = collect(&mapped, l, &fx.all_ids()).expect("mapped serves");
        assert_same(&want, l, &got, "populated mapped store");
    }
    // A streaming store has nothing mapped to populate.
    let streaming = fx.streaming(&StreamingConfig::default());
    assert_eq!(streaming.populate().expect("populate"), 0);
}
