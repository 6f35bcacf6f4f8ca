//! Qwen3 against golden vectors from HF transformers (`Qwen3ForCausalLM`, f32 on CPU, eager
//! attention, bf16 checkpoint widened exactly), stage by stage, for the tiny random fixtures and
//! the trained mini-draft; see `tests/fixtures/qwen3/README.md`.
//!
//! Tolerances (f32 engine vs f32 transformers; the goldens agree with an independent float64
//! numpy forward to relL2 ≤ 9.1e-7 on the logits; the engine is measured at ≤ 1.1e-6):
//! - every `[T, d]` stage (`embed`, per layer `attn_in`, `attn_out`, `mlp_in`, `mlp_out`, `out`,
//!   `final_norm`) and the `[T, V]` logits: relative L2 ≤ 1e-4;
//! - cached-decode logits: max abs ≤ 1e-4 per step;
//! - greedy tokens and decode tokens: exactly equal (the generator rejects draws with a top-2
//!   margin below 1e-3);
//! - RoPE: `inv_freq` bit-exact, cos/sin within 1 ulp (≤ 2.4e-7 absolute) of `rotary_emb`.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{json_ids, max_abs, rel_l2, Golden};
use sluice_checkpoint::Checkpoint;
use sluice_models::qwen3::{Qwen3, Trace};
use sluice_models::LogitRows;
use std::path::PathBuf;
use std::sync::Arc;

const STAGE_TOL: f64 = 1e-4;
const DECODE_ABS_TOL: f32 = 1e-4;
const ROPE_ABS_TOL: f32 = 2.4e-7;
const FIXTURES: [&str; 3] = ["tiny-a", "tiny-b", "mini-draft"];

fn fixture(name: &str) -> PathBuf {
    common::fixture_of("qwen3", name)
}

/// Loads a fixture through the architecture registry, as the engine does.
fn load(name: &str) -> Qwen3 {
    let ckpt = Arc::new(Checkpoint::open(&fixture(name)).expect("fixture opens"));
    sluice_models::load(ckpt)
        .expect("fixture loads")
        .into_family::<Qwen3>()
        .unwrap_or_else(|other| panic!("{name}: loaded as {}", other.family()))
}

fn golden(name: &str) -> Golden {
    Golden::load_dir(&fixture(name))
}

fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[b] {
            b = i;
        }
    }
    u32::try_from(b).unwrap()
}

#[test]
fn stages_and_logits_match_transformers() {
    for name in FIXTURES {
        let m = load(name);
        let g = golden(name);
        let n_prompts = g.json["prompts"].as_array().unwrap().len();
        let mut worst = (0.0f64, String::new());
        for j in 0..n_prompts {
            let ids = &g.ids(&format!("p{j}.ids"));
            let mut st = m.new_state();
            let mut tr = Trace::default();
            let logits = m.forward(&mut st, ids, LogitRows::All, Some(&mut tr)).expect("forward");
            st.commit(ids.len());
            let mut stages = vec!["embed".to_string()];
            for i in 0..m.config().num_hidden_layers {
                for s in ["attn_in", "attn_out", "mlp_in", "mlp_out", "out"] {
                    stages.push(format!("layer{i}.{s}"));
                }
            }
            stages.push("final_norm".into());
            for s in &stages {
                let got = tr.tensors.get(s).unwrap_or_else(|| panic!("{name} p{j}: no stage {s}"));
                let e = rel_l2(got, g.f(&format!("p{j}.{s}")));
                assert!(e <= STAGE_TOL, "{name} p{j} stage {s}: relL2 {e:.3e} > {STAGE_TOL:e}");
                if e > worst.0 {
                    worst = (e, format!("p{j}.{s}"));
                }
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
        let g = golden(name);
        let inv = g.f("rope.inv_freq");
        assert_eq!(m.rope().inv_freq(), inv, "{name}: inv_freq differs from HF's buffer");
        let hd = m.config().head_dim;
        let n = g.f("rope.cos").len() / hd;
        let rows = m.rope().rows(0, n);
        let dc = max_abs(&rows.cos, g.f("rope.cos"));
        let ds = max_abs(&rows.sin, g.f("rope.sin"));
        eprintln!("{name}: rope cos max abs {dc:.3e}, sin max abs {ds:.3e} over {n} positions");
        assert!(dc <= ROPE_ABS_TOL && ds <= ROPE_ABS_TOL, "{name}: cos {dc:e} sin {ds:e}");
    }
}

#[test]
fn cached_decode_matches_transformers() {
    for name in FIXTURES {
        let m = load(name);
        let g = golden(name);
        let prompt = &g.ids("decode.prompt");
        let tokens = &g.ids("decode.tokens");
        let want = g.f("decode.logits");
        let v = m.config().vocab_size;
        let mut st = m.new_state();
        let mut logits = m.forward(&mut st, prompt, LogitRows::Last, None).unwrap();
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
        let g = golden(name);
        for run in g.json["greedy"].as_array().unwrap() {
            let prompt = json_ids(&run["prompt"]);
            let want = json_ids(&run["tokens"]);
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
fn config_and_roster_match_the_fixture() {
    let a = load("tiny-a");
    let b = load("tiny-b");
    assert!(a.config().tie_word_embeddings && !b.config().tie_word_embeddings);
    let (ca, cb) = (a.config(), b.config());
    assert_eq!(ca.head_dim * ca.num_attention_heads, ca.hidden_size);
    assert_ne!(cb.head_dim * cb.num_attention_heads, cb.hidden_size, "tiny-b: head_dim ≠ d/H");
    assert!(ca.kv_groups() > 1 && cb.kv_groups() > 1, "both fixtures use GQA");
    // Weights read per pass: bf16 projections + embedding (+ lm_head when untied).
    let per_layer = |c: &sluice_models::qwen3::config::Qwen3Config| {
        2 * (2 * c.q_width() * c.hidden_size
            + 2 * c.kv_width() * c.hidden_size
            + 3 * c.intermediate_size * c.hidden_size) as u64
    };
    let emb =
        |c: &sluice_models::qwen3::config::Qwen3Config| (2 * c.vocab_size * c.hidden_size) as u64;
    assert_eq!(a.weight_bytes(), ca.num_hidden_layers as u64 * per_layer(ca) + emb(ca));
    assert_eq!(b.weight_bytes(), cb.num_hidden_layers as u64 * per_layer(cb) + 2 * emb(cb));
}
