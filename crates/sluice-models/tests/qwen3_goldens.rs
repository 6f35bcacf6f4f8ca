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
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use common::golden::Suite;
use sluice_models::qwen3::Qwen3;

const ROPE_ABS_TOL: f32 = 2.4e-7;

const SUITE: Suite = Suite::transformers("qwen3", &["tiny-a", "tiny-b", "mini-draft"], false);

fn load(name: &str) -> Qwen3 {
    SUITE.family_model::<Qwen3>(name)
}

#[test]
fn stages_and_logits_match_transformers() {
    SUITE.stages_match();
}

#[test]
fn rope_matches_rotary_emb() {
    for name in SUITE.fixtures {
        let m = load(name);
        let hd = m.config().head_dim;
        SUITE.rope_matches_in(name, ROPE_ABS_TOL, m.rope().inv_freq(), (hd, hd), |n| {
            let r = m.rope().rows(0, n);
            (r.cos, r.sin)
        });
    }
}

#[test]
fn cached_decode_matches_transformers() {
    SUITE.decode_matches();
}

#[test]
fn greedy_generation_matches_transformers() {
    SUITE.greedy_matches();
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
