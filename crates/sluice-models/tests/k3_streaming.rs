//! Streaming never changes output: logits are bit-identical whether experts are mapped in place
//! or streamed through a slot cache of any size (down to 2 slots), with prefetch on or off,
//! through O_DIRECT or buffered reads, on the io_uring and the pread backend, for a single pass
//! and for a whole prefill + decode.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::fixture;
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;
use sluice_store::{CacheSize, ExpertStore, IoBackend, IoMode, StreamingConfig, StreamingExperts};
use std::sync::Arc;

fn streamed(
    name: &str,
    slots: usize,
    prefetch: bool,
    (io, backend): (IoMode, IoBackend),
) -> (KimiK3, Arc<StreamingExperts>) {
    let ckpt = Arc::new(Checkpoint::open(&fixture(name)).unwrap());
    let m = KimiK3::load(ckpt.clone()).unwrap();
    let cfg = m.config().clone();
    let config = StreamingConfig {
        cache: CacheSize::Slots(slots),
        io,
        backend,
        readers: 4,
        max_prefetch_slots: if prefetch { None } else { Some(0) },
        prefetch_min_precision: 0.0,
        ..StreamingConfig::default()
    };
    let store = Arc::new(
        StreamingExperts::open(
            &ckpt,
            cfg.num_hidden_layers,
            &KimiK3::moe_layers(&cfg),
            cfg.num_experts,
            &KimiK3::expert_names(&cfg),
            &config,
            &MemoryBudget::unlimited(),
        )
        .unwrap(),
    );
    let mut s = KimiK3::with_store(ckpt, store.clone()).unwrap();
    s.set_prefetch(prefetch);
    (s, store)
}

/// Logits of a 9-token prefill (all rows) and 6 single-token decode steps.
fn run(m: &KimiK3) -> Vec<u32> {
    let mut st = m.new_state();
    let mut out: Vec<u32> = Vec::new();
    let prompt = [5u32, 17, 300, 42, 99, 7, 250, 301, 12];
    let l = m.forward(&mut st, &prompt, LogitRows::All, None).unwrap();
    st.commit(prompt.len());
    out.extend(l.iter().map(|x| x.to_bits()));
    let mut tok = 3u32;
    for _ in 0..6 {
        let l = m.forward(&mut st, &[tok], LogitRows::All, None).unwrap();
        st.commit(1);
        tok = sluice_engine_free_argmax(&l);
        out.extend(l.iter().map(|x| x.to_bits()));
    }
    out
}

fn sluice_engine_free_argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[b] {
            b = i;
        }
    }
    u32::try_from(b).unwrap()
}

#[test]
fn streamed_logits_equal_mapped_for_any_cache_and_prefetch() {
    for name in ["tiny-a", "tiny-b"] {
        let mapped = KimiK3::load(Arc::new(Checkpoint::open(&fixture(name)).unwrap())).unwrap();
        let want = run(&mapped);
        for slots in [2usize, 3, 7, 1000] {
            for prefetch in [false, true] {
                for io in [IoMode::Direct, IoMode::Buffered] {
                    for backend in backends() {
                        let (m, store) = streamed(name, slots, prefetch, (io, backend));
                        assert_eq!(store.io_backend(), backend_name(backend));
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
fn prefetch_is_used_when_the_cache_is_large() {
    for backend in backends() {
        let (m, store) = streamed("tiny-a", 1000, true, (IoMode::Direct, backend));
        run(&m);
        let s = store.stats();
        assert!(s.prefetch_issued > 0);
        assert!(s.prefetch_used > 0, "some prefetched experts must be demanded: {s:?}");
    }
}

/// Both read backends where the kernel allows io_uring (the pread pool alone otherwise).
fn backends() -> Vec<IoBackend> {
    match sluice_store::backend::uring_available() {
        Ok(()) => vec![IoBackend::Uring, IoBackend::Pread],
        Err(e) => {
            eprintln!("io_uring unavailable ({e}): testing the pread pool only");
            vec![IoBackend::Pread]
        }
    }
}

fn backend_name(b: IoBackend) -> &'static str {
    if b == IoBackend::Pread {
        "pread"
    } else {
        "io_uring"
    }
}
