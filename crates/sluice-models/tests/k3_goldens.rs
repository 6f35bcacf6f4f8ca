//! Kimi K3 against golden vectors from mlx-lm 0.32.2 (f32, CPU), stage by stage: the random tiny
//! fixtures and the trained mini-K3 (`tests/fixtures/kimi_k3/mini-k3`).
//!
//! Tolerances (f32 engine vs f32 mlx-lm; the goldens were cross-checked against an independent
//! float64 numpy reference at relL2 ≈ 3e-6): every `[T, d]` stage and the logits within
//! relative L2 1e-4; router weights within relative L2 1e-5; router choices, greedy tokens and
//! decode tokens exactly equal; decode logits within 1e-4 absolute.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{load, max_abs, rel_l2, Golden};
use sluice_models::kimi_k3::Trace;
use sluice_models::LogitRows;

const STAGE_TOL: f64 = 1e-4;
const ROUTER_W_TOL: f64 = 1e-5;
const DECODE_ABS_TOL: f32 = 1e-4;

fn check_prompts(name: &str) {
    let m = load(name);
    let g = Golden::load(name);
    let c = m.config().clone();
    let n_prompts = g.json["prompts"].as_array().unwrap().len();
    for j in 0..n_prompts {
        let ids = g.ids(&format!("p{j}.ids"));
        let mut st = m.new_state();
        let mut tr = Trace::default();
        let logits = m.forward(&mut st, &ids, LogitRows::All, Some(&mut tr)).expect("forward");
        st.commit(ids.len());
        let mut stages = vec!["embed".to_string()];
        for i in 0..c.num_hidden_layers {
            for s in ["attn_in", "attn_out", "mlp_in", "mlp_out"] {
                stages.push(format!("layer{i}.{s}"));
            }
        }
        stages.push("final_hidden".into());
        for s in &stages {
            let got = tr.tensors.get(s).unwrap_or_else(|| panic!("{name} p{j}: no stage {s}"));
            let want = g.f(&format!("p{j}.{s}"));
            let e = rel_l2(got, want);
            assert!(e <= STAGE_TOL, "{name} p{j} stage {s}: relL2 {e:.3e} > {STAGE_TOL:e}");
        }
        for (&layer, routes) in &tr.routes {
            let want_idx = g.ids(&format!("p{j}.layer{layer}.router_idx"));
            let want_w = g.f(&format!("p{j}.layer{layer}.router_w"));
            let k = c.num_experts_per_token;
            let mut got_w = Vec::new();
            for (ti, r) in routes.iter().enumerate() {
                let mut pairs: Vec<(u32, f32)> =
                    r.ids.iter().copied().zip(r.weights.iter().copied()).collect();
                pairs.sort_by_key(|p| p.0);
                let idx: Vec<u32> = pairs.iter().map(|p| p.0).collect();
                assert_eq!(
                    idx,
                    want_idx[ti * k..(ti + 1) * k],
                    "{name} p{j} layer {layer} row {ti}: router choice"
                );
                got_w.extend(pairs.iter().map(|p| p.1));
            }
            let e = rel_l2(&got_w, want_w);
            assert!(e <= ROUTER_W_TOL, "{name} p{j} layer {layer}: router weights relL2 {e:.3e}");
        }
        let e = rel_l2(&logits, g.f(&format!("p{j}.logits")));
        assert!(e <= STAGE_TOL, "{name} p{j}: logits relL2 {e:.3e}");
    }
}

fn check_decode(name: &str) {
    let m = load(name);
    let g = Golden::load(name);
    let prompt = g.ids("decode.prompt");
    let tokens = g.ids("decode.tokens");
    let want = g.f("decode.logits");
    let v = m.config().vocab_size;
    let mut st = m.new_state();
    let mut logits = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
    st.commit(prompt.len());
    for (s, &tok) in tokens.iter().enumerate() {
        let d = max_abs(&logits, &want[s * v..(s + 1) * v]);
        assert!(d <= DECODE_ABS_TOL, "{name} decode step {s}: max abs {d:.3e}");
        assert_eq!(sluice_engine_argmax(&logits), tok, "{name} decode step {s}: greedy token");
        logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
        st.commit(1);
    }
}

fn sluice_engine_argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[b] {
            b = i;
        }
    }
    b as u32
}

fn check_greedy(name: &str) {
    let m = load(name);
    let g = Golden::load(name);
    for run in g.json["greedy"].as_array().unwrap() {
        let prompt: Vec<u32> =
            run["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let want: Vec<u32> =
            run["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let mut st = m.new_state();
        let mut logits = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
        st.commit(prompt.len());
        let mut got = Vec::new();
        while got.len() < want.len() {
            let tok = sluice_engine_argmax(&logits);
            got.push(tok);
            logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
            st.commit(1);
        }
        assert_eq!(got, want, "{name}: greedy tokens for prompt {prompt:?}");
    }
}

#[test]
fn tiny_a_stages_match_mlx() {
    check_prompts("tiny-a");
}

#[test]
fn tiny_b_stages_match_mlx() {
    check_prompts("tiny-b");
}

#[test]
fn tiny_a_decode_matches_mlx() {
    check_decode("tiny-a");
}

#[test]
fn tiny_b_decode_matches_mlx() {
    check_decode("tiny-b");
}

#[test]
fn tiny_a_greedy_matches_mlx() {
    check_greedy("tiny-a");
}

#[test]
fn tiny_b_greedy_matches_mlx() {
    check_greedy("tiny-b");
}

// The trained mini-K3 (issue 17; tools/mini/): real routing and real text, the same tolerances.

#[test]
fn mini_k3_stages_match_mlx() {
    check_prompts("mini-k3");
}

#[test]
fn mini_k3_decode_matches_mlx() {
    check_decode("mini-k3");
}

#[test]
fn mini_k3_greedy_matches_mlx() {
    check_greedy("mini-k3");
}
