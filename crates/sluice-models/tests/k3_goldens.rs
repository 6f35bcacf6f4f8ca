//! Kimi K3 against golden vectors from mlx-lm 0.32.2 (f32, CPU), stage by stage: the random tiny
//! fixtures and the trained mini-K3 (`tests/fixtures/kimi_k3/mini-k3`).
//!
//! Tolerances (f32 engine vs f32 mlx-lm; the goldens were cross-checked against an independent
//! float64 numpy reference at relL2 ≈ 3e-6): every `[T, d]` stage and the logits within
//! relative L2 1e-4; router weights within relative L2 1e-5; router choices, greedy tokens and
//! decode tokens exactly equal; decode logits within 1e-4 absolute.

mod common;

use common::golden::{Routing, Suite};

const SUITE: Suite = Suite {
    family: "kimi_k3",
    fixtures: &["tiny-a", "tiny-b", "mini-k3"],
    layer_stages: &["attn_in", "attn_out", "mlp_in", "mlp_out"],
    final_stage: "final_hidden",
    routing: Some(Routing {
        ids: "router_idx",
        weights: "router_w",
        sorted_by_id: true,
        weight_tol: 1e-5,
        router_logits: false,
    }),
};

#[test]
fn tiny_a_stages_match_mlx() {
    SUITE.stages_match_in("tiny-a");
}

#[test]
fn tiny_b_stages_match_mlx() {
    SUITE.stages_match_in("tiny-b");
}

#[test]
fn tiny_a_decode_matches_mlx() {
    SUITE.decode_matches_in("tiny-a");
}

#[test]
fn tiny_b_decode_matches_mlx() {
    SUITE.decode_matches_in("tiny-b");
}

#[test]
fn tiny_a_greedy_matches_mlx() {
    SUITE.greedy_matches_in("tiny-a");
}

#[test]
fn tiny_b_greedy_matches_mlx() {
    SUITE.greedy_matches_in("tiny-b");
}

// The trained mini-K3 (issue 17; tools/mini/): real routing and real text, the same tolerances.

#[test]
fn mini_k3_stages_match_mlx() {
    SUITE.stages_match_in("mini-k3");
}

#[test]
fn mini_k3_decode_matches_mlx() {
    SUITE.decode_matches_in("mini-k3");
}

#[test]
fn mini_k3_greedy_matches_mlx() {
    SUITE.greedy_matches_in("mini-k3");
}
