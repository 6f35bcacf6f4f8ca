//! GPT-OSS against golden vectors from HF transformers (`GptOssForCausalLM`, f32 on CPU, eager
//! attention with sinks, bf16 weights and MXFP4 experts in the published layout, dequantized by
//! transformers to exactly the values the bytes encode), stage by stage with the routing; see
//! `tests/fixtures/gpt_oss/README.md`.
//!
//! Tolerances (f32 engine vs f32 transformers; the goldens agree with an independent float64
//! numpy forward to relL2 ≤ 2.2e-6 on the logits):
//! - every `[T, d]` stage, the router logits and the `[T, V]` logits: relative L2 ≤ 1e-4;
//! - routing: the top-k expert ids of every row of every MoE layer exactly equal, in order (the
//!   generator rejects draws whose k-th and (k+1)-th router logits are within 1e-3), the weights
//!   within relative L2 1e-4;
//! - cached-decode logits: max abs ≤ 1e-4 per step; greedy and decode tokens exactly equal;
//! - a T-row pass bit-identical to T single-row passes;
//! - YaRN: `inv_freq` bit-exact, cos/sin (scaled by the attention factor) within 4.8e-7.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::golden::{moe_golden_tests, Suite};
use sluice_models::gpt_oss::GptOss;

const ROPE_ABS_TOL: f32 = 4.8e-7;

const SUITE: Suite = Suite::transformers("gpt_oss", &["tiny-a", "tiny-b"], true);

moe_golden_tests!(SUITE, rollback: "tiny-a", draft: "tiny-b");

#[test]
fn rope_matches_rotary_emb() {
    for name in SUITE.fixtures {
        let m = SUITE.family_model::<GptOss>(name);
        let half = m.config().head_dim / 2;
        SUITE.rope_matches_in(name, ROPE_ABS_TOL, m.rope().inv_freq(), (half, half), |n| {
            let r = m.rope().rows(0, n);
            (r.cos, r.sin)
        });
    }
}

#[test]
fn the_decode_goldens_pass_the_sliding_window() {
    for name in SUITE.fixtures {
        let m = SUITE.family_model::<GptOss>(name);
        let g = SUITE.golden(name);
        let n = g.ids("decode.prompt").len() + g.ids("decode.tokens").len();
        assert!(n > m.config().sliding_window, "{name}: the decode scenario must pass the window");
    }
}
