//! The family contract, run for every MoE family through the family boundary only (the family
//! table, `Model`, `State`, `RoutedExperts`): no test here names a family's types. For each
//! committed fixture of each family:
//! - streamed through a 2-slot cache (O_DIRECT and buffered, on every usable read backend),
//!   prefill + decode logits are bit-identical to the experts mapped in place, and the store
//!   really read them from the published shards (no repack); and so with the family's
//!   next-layer prefetch reading its guesses;
//! - a T-row pass is bit-identical to T single-row passes;
//! - prefill + decode logits are bit-identical on pools of 1, 2, 3 and 8 threads (the
//!   attention runs several heads side by side where the threads leave parts to spare);
//! - `commit(n)` of a T-row pass leaves the state of n single rows (rollback of the rest);
//! - a routes-only trace records every MoE layer's routes and no stage tensor.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use common::{family_prefill_and_decode, open_family, FAMILY_PROMPT, MOE_FIXTURES};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_models::{LogitRows, Model, ModelError};
use sluice_store::{CacheSize, ExpertStore, IoBackend, IoMode, StreamingConfig};
use std::sync::Arc;

#[test]
fn streamed_with_two_slots_equals_mapped_for_every_family() {
    for (family, name) in MOE_FIXTURES {
        let (ckpt, mut m) = open_family(family, name);
        let want = family_prefill_and_decode(&m, 5);
        let routed = m.routed_experts().expect("an MoE family describes its experts");
        for io in [IoMode::Direct, IoMode::Buffered] {
            for backend in IoBackend::usable() {
                let config = StreamingConfig {
                    cache: CacheSize::Slots(2),
                    io,
                    backend,
                    readers: 3,
                    max_prefetch_slots: Some(0),
                    ..StreamingConfig::default()
                };
                let store = Arc::new(
                    routed.streaming(&ckpt, &config, &MemoryBudget::unlimited()).expect("opens"),
                );
                m.set_experts(store.clone());
                let got = family_prefill_and_decode(&m, 5);
                assert!(got == want, "{family}/{name}: streamed {io:?} {backend:?} changed logits");
                let s = store.stats();
                assert!(s.bytes_read > 0, "{family}/{name}: the experts were read from the shards");
                assert!(s.misses > 2, "{family}/{name}: a 2-slot cache must evict: {s:?}");
                store.check_consistency(true).unwrap();
            }
        }
    }
}

#[test]
fn streamed_with_next_layer_prefetch_equals_mapped_for_every_family() {
    for (family, name) in MOE_FIXTURES {
        let (ckpt, mut m) = open_family(family, name);
        let want = family_prefill_and_decode(&m, 5);
        let routed = m.routed_experts().expect("an MoE family describes its experts");
        // Every guess passes the gate, and the cache has room to read guesses beside a pass's
        // own experts, so guesses really are read (and some evict, or are wrong).
        let config = StreamingConfig {
            cache: CacheSize::Slots(6),
            readers: 3,
            prefetch_min_precision: 0.0,
            ..StreamingConfig::default()
        };
        let store =
            Arc::new(routed.streaming(&ckpt, &config, &MemoryBudget::unlimited()).expect("opens"));
        m.set_experts(store.clone());
        sluice_models::family::set_prefetch(&mut m, true);
        let got = family_prefill_and_decode(&m, 5);
        assert!(got == want, "{family}/{name}: streamed with prefetch changed logits");
        let s = store.stats();
        assert!(s.prefetch_issued > 0, "{family}/{name}: no guess was read: {s:?}");
        store.check_consistency(true).unwrap();
    }
}

#[test]
fn a_t_row_pass_equals_t_single_rows_for_every_family() {
    for (family, name) in MOE_FIXTURES {
        let (_, m) = open_family(family, name);
        let vocab = m.vocab_size();
        let prompt: Vec<u32> = FAMILY_PROMPT.iter().map(|&t| t % vocab as u32).collect();
        let mut st = m.new_state();
        let all = m.forward(&mut st, &prompt, LogitRows::All, None).unwrap();
        st.commit(prompt.len());
        let mut one = m.new_state();
        for (i, &tok) in prompt.iter().enumerate() {
            let l = m.forward(&mut one, &[tok], LogitRows::All, None).unwrap();
            one.commit(1);
            let row = &all[i * vocab..(i + 1) * vocab];
            assert!(
                l.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{family}/{name}: row {i} of a {}-row pass differs from a single-row pass",
                prompt.len()
            );
        }
    }
}

#[test]
fn attention_ran_one_head_a_part_now_sets_of_heads_and_every_pool_gives_the_same_logits() {
    for (family, name) in MOE_FIXTURES {
        let (_, m) = open_family(family, name);
        let runs: Vec<Vec<u32>> = [1, 2, 3, 8]
            .into_iter()
            .map(|threads| {
                let pool = sluice_kernels::Pool::new(threads).expect("a pool");
                pool.install(|| family_prefill_and_decode(&m, 3))
            })
            .collect();
        for (threads, run) in [2, 3, 8].into_iter().zip(&runs[1..]) {
            assert!(*run == runs[0], "{family}/{name}: {threads} threads changed the logits");
        }
    }
}

#[test]
fn committing_part_of_a_pass_equals_running_only_that_part_for_every_family() {
    for (family, name) in MOE_FIXTURES {
        let (_, m) = open_family(family, name);
        let vocab = m.vocab_size() as u32;
        let prompt: Vec<u32> = FAMILY_PROMPT.iter().map(|t| t % vocab).collect();
        // Run all 9 rows, keep 4 (a verifier accepting 3 drafts), then decode one token.
        let mut st = m.new_state();
        m.forward(&mut st, &prompt, LogitRows::All, None).unwrap();
        st.commit(4);
        let got = m.forward(&mut st, &[prompt[4]], LogitRows::Last, None).unwrap();
        st.commit(1);
        let mut plain = m.new_state();
        m.forward(&mut plain, &prompt[..4], LogitRows::Last, None).unwrap();
        plain.commit(4);
        let want = m.forward(&mut plain, &[prompt[4]], LogitRows::Last, None).unwrap();
        plain.commit(1);
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{family}/{name}: commit(4) of a 9-row pass left a different state"
        );
        assert_eq!(st.len(), 5);
        // A rolled-back pass leaves nothing behind.
        m.forward(&mut st, &prompt[..3], LogitRows::All, None).unwrap();
        st.rollback();
        assert_eq!(st.len(), 5, "{family}/{name}: rollback kept rows");
    }
}

/// DeepSeek-V3's forward pass wrote its own trace recorder, which ignored `routes_only`: a
/// routes-only trace (`--trace-routes`, one on every pass of a run) copied every activation of
/// every pass. One recorder (`family::put`) now serves every template family.
#[test]
fn a_routes_only_trace_copied_every_activation() {
    for (family, name) in MOE_FIXTURES {
        let (_, m) = open_family(family, name);
        let mut tr = sluice_models::Trace::routes_only();
        let mut st = m.new_state();
        m.forward(&mut st, &[1, 2, 3], LogitRows::Last, Some(&mut tr)).unwrap();
        assert!(tr.tensors.is_empty(), "{family}/{name}: {} tensors recorded", tr.tensors.len());
        let moe = m.routed_experts().expect("an MoE family").moe_layers;
        let got: Vec<usize> = tr.routes.keys().copied().collect();
        assert_eq!(got, moe, "{family}/{name}: the routes of every MoE layer");
    }
}

#[test]
fn the_family_table_refuses_an_unknown_architecture_and_lists_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let src = common::fixture_of("qwen3_moe", "tiny-a");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["MixtralForCausalLM"]);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let ckpt = Arc::new(Checkpoint::open(dir.path()).unwrap());
    let err = sluice_models::load(ckpt).expect_err("refused").to_string();
    assert!(err.contains("MixtralForCausalLM"), "{err}");
    for f in sluice_models::FAMILIES {
        for a in f.architectures {
            assert!(err.contains(a), "{err} lists {a}");
        }
    }
}

/// DeepSeek-V3 keeps its state in Kimi K3's state type and Qwen3-MoE in Qwen3's, so a check by
/// state type alone let a Kimi K3 model run a pass over a DeepSeek-V3 state (whose layers it
/// misreads). The state remembers its model's family; every other family's model refuses it,
/// naming both families, and leaves it as it was.
#[test]
fn a_state_of_another_family_sharing_its_type_was_accepted() {
    let models: Vec<Model> = [
        ("kimi_k3", "tiny-a"),
        ("deepseek_v3", "tiny-a"),
        ("qwen3", "tiny-a"),
        ("qwen3_moe", "tiny-a"),
        ("gpt_oss", "tiny-a"),
    ]
    .iter()
    .map(|&(family, name)| open_family(family, name).1)
    .collect();
    for maker in &models {
        let mut st = maker.new_state();
        maker.forward(&mut st, &[1, 2], LogitRows::Last, None).unwrap();
        st.commit(2);
        for m in &models {
            let bytes = st.byte_len();
            let r = m.forward(&mut st, &[3], LogitRows::Last, None);
            if m.family() == maker.family() {
                r.unwrap();
                st.rollback();
                continue;
            }
            let err = r.expect_err("another family's state is refused");
            assert!(
                matches!(err, ModelError::StateMismatch { model, state }
                    if model == m.family() && state == maker.family()),
                "{err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(m.family()) && msg.contains(maker.family()), "{msg}");
            assert_eq!((st.len(), st.byte_len()), (2, bytes), "the refused state is untouched");
        }
        // A snapshot restores into a state of the same family.
        assert_eq!(st.snapshot(None).restore().family(), maker.family());
    }
}
