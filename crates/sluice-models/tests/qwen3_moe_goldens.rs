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
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::golden::{moe_golden_tests, Suite};
use sluice_models::qwen3_moe::Qwen3Moe;

const ROPE_ABS_TOL: f32 = 2.4e-7;

const SUITE: Suite = Suite::transformers("qwen3_moe", &["tiny-a", "tiny-b"], true);

moe_golden_tests!(SUITE, rollback: "tiny-a", draft: "tiny-b");

#[test]
fn the_fixtures_hold_moe_and_dense_layers() {
    SUITE.fixtures_hold_moe_and_dense_layers();
}

#[test]
fn rope_matches_rotary_emb() {
    for name in SUITE.fixtures {
        let m = SUITE.family_model::<Qwen3Moe>(name);
        let hd = m.config().base.head_dim;
        SUITE.rope_matches_in(name, ROPE_ABS_TOL, m.rope().inv_freq(), (hd, hd), |n| {
            let r = m.rope().rows(0, n);
            (r.cos, r.sin)
        });
    }
}
