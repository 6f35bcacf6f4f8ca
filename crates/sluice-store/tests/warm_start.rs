//! Warm starts on the streaming store: the hot set counts demands, survives a save and load,
//! warms a fresh store so the same demands hit, and a corrupt file, another model's, or one
//! naming missing experts is refused with a reason.

mod common;

use common::Fixture;
use sluice_store::hotset::{self, HotSet, HotSetError};
use sluice_store::{ExpertStore, StreamingConfig};
use std::time::Duration;

fn demand(store: &dyn ExpertStore, layer: usize, ids: &[u32]) {
    store.for_each(layer, ids, &mut |_, _| Ok(())).expect("experts served");
}

#[test]
fn a_saved_hot_set_warms_a_fresh_store_so_its_experts_hit() {
    let fx = Fixture::open("tiny-a");
    let cfg = StreamingConfig {
        cache: sluice_store::CacheSize::Slots(8),
        max_prefetch_slots: Some(0),
        ..StreamingConfig::default()
    };
    let layer = fx.moe_layers[0];
    let first = fx.streaming(&cfg);
    demand(&first, layer, &[1, 2]);
    demand(&first, layer, &[2, 3]);
    let set = first.hot_set();
    assert_eq!(set.layers[layer], vec![(2, 2), (1, 1), (3, 1)], "most used first");
    assert_eq!(set.order(), vec![(layer, 2), (layer, 1), (layer, 3)]);

    let dir = tempfile::tempdir().expect("temp dir");
    let fp = hotset::fingerprint(&common::fixture("tiny-a"), first.index());
    let path = dir.path().join(hotset::FILE_NAME);
    set.save(&path, &fp).expect("saved");
    let back = HotSet::load(&path, &fp, first.index()).expect("loads");
    assert_eq!(back, set);

    let fresh = fx.streaming(&cfg);
    assert_eq!(fresh.warm(&back.order()), 3, "three experts, within half of 8 slots");
    assert!(fresh.wait_reads_done(Duration::from_secs(30)), "warm reads land");
    let before = fresh.stats();
    demand(&fresh, layer, &[1, 2, 3]);
    let after = fresh.stats();
    assert_eq!(after.hits - before.hits, 3, "every warmed expert hits");
    assert_eq!(after.bytes_read, before.bytes_read, "nothing read on demand");

    // The warm share is bounded: half the slots.
    let small = fx.streaming(&cfg);
    let many: Vec<(usize, u32)> = (0..8).map(|id| (layer, id)).collect();
    assert_eq!(small.warm(&many), small.warm_limit());
    assert_eq!(small.warm_limit(), 4);
}

#[test]
fn corrupt_foreign_and_out_of_range_hot_sets_are_refused_with_a_reason() {
    let fx = Fixture::open("tiny-a");
    let store = fx.streaming(&StreamingConfig::default());
    let index = store.index();
    let fp = hotset::fingerprint(&common::fixture("tiny-a"), index);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(hotset::FILE_NAME);
    let layer = fx.moe_layers[0];
    let mut set = HotSet { layers: vec![Vec::new(); index.num_layers()] };
    set.layers[layer] = vec![(1, 5)];

    let why = |r: Result<HotSet, HotSetError>| match r {
        Err(HotSetError::Unusable { why, .. }) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(matches!(HotSet::load(&path, &fp, index), Err(HotSetError::Missing)));

    std::fs::write(&path, b"{\"format_version\": 1, \"finger").expect("write");
    assert!(why(HotSet::load(&path, &fp, index)).contains("corrupt"));

    set.save(&path, &fp).expect("saved");
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replace("[1,5]", "[1,6]")).expect("tamper");
    assert!(why(HotSet::load(&path, &fp, index)).contains("checksum"));

    set.save(&path, "another model").expect("saved");
    assert!(why(HotSet::load(&path, &fp, index)).contains("another model"));

    let mut bad = set.clone();
    bad.layers[layer].push((u32::try_from(fx.experts).expect("small"), 1));
    bad.save(&path, &fp).expect("saved");
    assert!(why(HotSet::load(&path, &fp, index)).contains("does not have"));

    let short = HotSet { layers: vec![Vec::new()] };
    short.save(&path, &fp).expect("saved");
    assert!(why(HotSet::load(&path, &fp, index)).contains("layers"));

    // A directory nobody may write sends the file to the cache directory.
    let cache = dir.path().join("cache");
    let p = hotset::path_for(&dir.path().join("missing"), &cache, &fp);
    assert!(p.starts_with(&cache), "{}", p.display());
    assert_eq!(hotset::path_for(dir.path(), &cache, &fp), path);
}
