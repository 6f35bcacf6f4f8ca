//! Qwen3-MoE against golden vectors from HF transformers (`Qwen3MoeForCausalLM`, f32 on CPU,
//! eager attention, bf16 checkpoint in the published per-expert layout widened exactly), stage by
//! stage with the routing; see `tests/fixtures/qwen3_moe/README.md`.
//!
//! Tolerances (f32 engine vs f32 transformers; the goldens agree with an independent float64
//! numpy forward to relL2 ≤ 1.4e-6 on the logits):
//! - every `[T, d]` stage, the router logits and the `[T, V]` logits: relative L2 ≤ 1e-4;
//! - routing: the top-k expert ids of every row of every MoE layer exactly equal, in order (the
//!   generator rejects draws whose k-th and (k+1)-th router logits are within 1e-3), the weights
//!   within relative L2 1e-4;
//! - cached-decode logits: max abs ≤ 1e-4 per step; greedy and decode tokens exactly equal;
//! - a T-row pass bit-identical to T single-row passes.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{argmax, json_ids, max_abs, rel_l2, Golden};
use sluice_checkpoint::Checkpoint;
use sluice_models::qwen3::Trace;
use sluice_models::qwen3_moe::Qwen3Moe;
use sluice_models::LogitRows;
use std::path::PathBuf;
use std::sync::Arc;

const STAGE_TOL: f64 = 1e-4;
const DECODE_ABS_TOL: f32 = 1e-4;
const ROPE_ABS_TOL: f32 = 2.4e-7;
const FIXTURES: [&str; 2] = ["tiny-a", "tiny-b"];

fn fixture(name: &str) -> PathBuf {
    common::fixture_of("qwen3_moe", name)
}

/// Loads a fixture through the architecture registry, as the engine does.
fn load(name: &str) -> Qwen3Moe {
    let ckpt = Arc::new(Checkpoint::open(&fixture(name)).expect("fixture opens"));
    sluice_models::load(ckpt)
        .expect("fixture loads")
        .into_family::<Qwen3Moe>()
        .unwrap_or_else(|other| panic!("{name}: loaded as {}", other.family()))
}

#[test]
fn stages_routing_and_logits_match_transformers() {
    for name in FIXTURES {
        let m = load(name);
        let g = Golden::load_dir(&fixture(name));
        let c = m.config();
        let k = c.num_experts_per_tok;
        let moe = c.moe_layers();
        assert!(!moe.is_empty() && moe.len() < c.base.num_hidden_layers, "{name}: MoE and dense");
        let mut worst = (0.0f64, String::new());
        for j in 0..g.json["prompts"].as_array().unwrap().len() {
            let ids = &g.ids(&format!("p{j}.ids"));
            let mut st = m.new_state();
            let mut tr = Trace::default();
            let logits = m.forward(&mut st, ids, LogitRows::All, Some(&mut tr)).expect("forward");
            st.commit(ids.len());
            let mut stages = vec!["embed".to_string()];
            for i in 0..c.base.num_hidden_layers {
                for s in ["attn_in", "attn_out", "mlp_in", "mlp_out", "out"] {
                    stages.push(format!("layer{i}.{s}"));
                }
            }
            stages.extend(moe.iter().map(|i| format!("layer{i}.router_logits")));
            stages.push("final_norm".into());
            for s in &stages {
                let got = tr.tensors.get(s).unwrap_or_else(|| panic!("{name} p{j}: no stage {s}"));
                let e = rel_l2(got, g.f(&format!("p{j}.{s}")));
                assert!(e <= STAGE_TOL, "{name} p{j} stage {s}: relL2 {e:.3e} > {STAGE_TOL:e}");
                if e > worst.0 {
                    worst = (e, format!("p{j}.{s}"));
                }
            }
            for &i in &moe {
                let routes = &tr.routes[&i];
                let want_ids = g.ids(&format!("p{j}.layer{i}.topk_ids"));
                let got_ids: Vec<u32> = routes.iter().flat_map(|r| r.ids.clone()).collect();
                assert_eq!(got_ids, want_ids, "{name} p{j} layer {i}: routing differs");
                let got_w: Vec<f32> = routes.iter().flat_map(|r| r.weights.clone()).collect();
                assert_eq!(got_w.len(), ids.len() * k);
                let e = rel_l2(&got_w, g.f(&format!("p{j}.layer{i}.topk_weights")));
                assert!(e <= STAGE_TOL, "{name} p{j} layer {i}: weights relL2 {e:.3e}");
            }
            let e = rel_l2(&logits, g.f(&format!("p{j}.logits")));
            assert!(e <= STAGE_TOL, "{name} p{j}: logits relL2 {e:.3e} > {STAGE_TOL:e}");
            eprintln!("{name} p{j} (T={}): logits relL2 {e:.3e}", ids.len());
        }
        eprintln!("{name}: worst stage relL2 {:.3e} at {}", worst.0, worst.1);
    }
}

#[test]
fn rope_matches_rotary_emb() {
    for name in FIXTURES {
        let m = load(name);
        let g = Golden::load_dir(&fixture(name));
        assert_eq!(m.rope().inv_freq(), g.f("rope.inv_freq"), "{name}: inv_freq");
        let hd = m.config().base.head_dim;
        let n = g.f("rope.cos").len() / hd;
        let rows = m.rope().rows(0, n);
        let (dc, ds) = (max_abs(&rows.cos, g.f("rope.cos")), max_abs(&rows.sin, g.f("rope.sin")));
        assert!(dc <= ROPE_ABS_TOL && ds <= ROPE_ABS_TOL, "{name}: cos {dc:e} sin {ds:e}");
    }
}

#[test]
fn prefill_then_decode_matches_transformers() {
    for name in FIXTURES {
        let m = load(name);
        let g = Golden::load_dir(&fixture(name));
        let (prompt, tokens) = (g.ids("decode.prompt"), g.ids("decode.tokens"));
        let want = g.f("decode.logits");
        let v = m.config().base.vocab_size;
        let mut st = m.new_state();
        let mut logits = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
        st.commit(prompt.len());
        let mut worst = 0.0f32;
        for (s, &tok) in tokens.iter().enumerate() {
            let d = max_abs(&logits, &want[s * v..(s + 1) * v]);
            assert!(d <= DECODE_ABS_TOL, "{name} decode step {s}: max abs {d:.3e}");
            worst = worst.max(d);
            assert_eq!(argmax(&logits), tok, "{name} decode step {s}: greedy token");
            logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
            st.commit(1);
        }
        eprintln!("{name}: decode logits max abs {worst:.3e} over {} steps", tokens.len());
    }
}

#[test]
fn greedy_generation_matches_transformers() {
    for name in FIXTURES {
        let m = load(name);
        let g = Golden::load_dir(&fixture(name));
        for run in g.json["greedy"].as_array().unwrap() {
            let (prompt, want) = (json_ids(&run["prompt"]), json_ids(&run["tokens"]));
            let mut st = m.new_state();
            let mut logits = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
            st.commit(prompt.len());
            let mut got = Vec::new();
            while got.len() < want.len() {
                let tok = argmax(&logits);
                got.push(tok);
                logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
                st.commit(1);
            }
            assert_eq!(got, want, "{name}: greedy tokens for prompt {prompt:?}");
        }
    }
}

#[test]
fn a_t_row_pass_is_bit_identical_to_t_single_rows() {
    for name in FIXTURES {
        let m = load(name);
        let g = Golden::load_dir(&fixture(name));
        let ids = g.ids("p2.ids");
        let mut st = m.new_state();
        let all = m.forward(&mut st, &ids, LogitRows::All, None).unwrap();
        let mut one = Vec::new();
        let mut st = m.new_state();
        for &id in &ids {
            one.extend(m.forward(&mut st, &[id], LogitRows::All, None).unwrap());
            st.commit(1);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all), bits(&one), "{name}: T-row pass differs from single rows");
    }
}

#[test]
fn rolled_back_rows_leave_no_trace() {
    let m = load("tiny-a");
    let ids = [5u32, 17, 300, 42, 99];
    let mut a = m.new_state();
    m.forward(&mut a, &ids, LogitRows::Last, None).unwrap();
    a.commit(3);
    m.forward(&mut a, &[7, 8, 9], LogitRows::All, None).unwrap();
    a.rollback();
    let got = m.forward(&mut a, &[1], LogitRows::Last, None).unwrap();
    let mut b = m.new_state();
    m.forward(&mut b, &ids[..3], LogitRows::Last, None).unwrap();
    b.commit(3);
    let want = m.forward(&mut b, &[1], LogitRows::Last, None).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_verified_draft_with_a_wrong_tail_continues_exactly_as_plain_decoding() {
    let m = load("tiny-b");
    let g = Golden::load_dir(&fixture("tiny-b"));
    let run = &g.json["greedy"].as_array().unwrap()[1];
    let (prompt, want) = (json_ids(&run["prompt"]), json_ids(&run["tokens"]));
    let mut st = m.new_state();
    let first = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
    st.commit(prompt.len());
    assert_eq!(argmax(&first), want[0]);
    // Verify [t0, t1, t2, wrong, wrong]: rows 0..3 confirm t1..t3, the rest is rolled back.
    let wrong = (want[3] + 1) % 7;
    let draft = [want[0], want[1], want[2], wrong, wrong];
    let rows = m.forward(&mut st, &draft, LogitRows::All, None).unwrap();
    let vocab = rows.len() / draft.len();
    let got: Vec<u32> = rows.chunks_exact(vocab).map(argmax).collect();
    assert_eq!(got[..3], want[1..4], "the verified rows give the greedy tokens");
    st.commit(3);
    let mut tok = got[2];
    let mut out = want[..3].to_vec();
    while out.len() < want.len() {
        out.push(tok);
        let l = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
        st.commit(1);
        tok = argmax(&l);
    }
    assert_eq!(out, want);
}
