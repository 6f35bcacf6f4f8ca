//! DeepSeek-V3 family checkpoints that contradict themselves or their config are refused at load
//! with the family, the tensor and the file named: an FP8 weight whose `weight_scale_inv` shape
//! contradicts the weight's own shape, an FP8 weight without its scales, an INT4 expert whose
//! scales or `weight_shape` contradict it, and an expert count that contradicts the tensors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::edit::{copy_fixture, edit_config, edit_headers, load};

const SCALE: &str = "model.layers.0.self_attn.q_a_proj.weight_scale_inv";

#[test]
fn an_fp8_scale_whose_shape_contradicts_its_weight_is_refused_by_name() {
    // q_a_proj is [96, 200]: its blocks are [1, 2]; [2, 1] has the same bytes and is wrong.
    let d = copy_fixture("deepseek_v3", "tiny-a");
    edit_headers(
        d.path(),
        &format!("\"{SCALE}\":{{\"dtype\":\"F32\",\"shape\":[1,2]"),
        &format!("\"{SCALE}\":{{\"dtype\":\"F32\",\"shape\":[2,1]"),
    );
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("deepseek_v3 checkpoint:"), "{e}");
    assert!(e.contains(SCALE) && e.contains("[1, 2]") && e.contains("model-0000"), "{e}");
}

#[test]
fn an_fp8_weight_without_its_scales_is_refused_by_name() {
    let d = copy_fixture("deepseek_v3", "tiny-a");
    edit_headers(d.path(), &format!("\"{SCALE}\""), &format!("\"{}x\"", &SCALE[..SCALE.len() - 1]));
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("deepseek_v3 checkpoint:") && e.contains(SCALE), "{e}");
}

#[test]
fn int4_scales_that_contradict_the_packed_weight_are_refused_by_name() {
    // Expert gate_proj is [64, 96]: scales [64, 3]; [96, 2] holds the same bytes.
    let t = "model.layers.2.mlp.experts.0.gate_proj.weight_scale";
    let d = copy_fixture("deepseek_v3", "tiny-b");
    edit_headers(
        d.path(),
        &format!("\"{t}\":{{\"dtype\":\"BF16\",\"shape\":[64,3]"),
        &format!("\"{t}\":{{\"dtype\":\"BF16\",\"shape\":[96,2]"),
    );
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("kimi_k2 checkpoint:") && e.contains(t) && e.contains("[64, 3]"), "{e}");
}

#[test]
fn an_expert_width_that_contradicts_int4_weights_is_refused_by_name() {
    let d = copy_fixture("deepseek_v3", "tiny-b");
    edit_config(d.path(), |v| v["moe_intermediate_size"] = 96.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("kimi_k2 checkpoint:"), "{e}");
    assert!(e.contains("model.layers.1.mlp.experts.0.gate_proj.weight_packed"), "{e}");
}

#[test]
fn an_expert_count_that_contradicts_the_tensors_is_refused_by_name() {
    let d = copy_fixture("deepseek_v3", "tiny-a");
    edit_config(d.path(), |v| v["n_routed_experts"] = 20.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("deepseek_v3") && e.contains("n_routed_experts = 20"), "{e}");
    assert!(e.contains("model.layers.1.mlp.experts.16.gate_proj"), "{e}");
    let d = copy_fixture("deepseek_v3", "tiny-b");
    edit_config(d.path(), |v| v["n_routed_experts"] = 6.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("kimi_k2") && e.contains("expert 6 of model.layers.1 exists"), "{e}");
}

#[test]
fn a_dense_layer_made_sparse_has_no_experts() {
    let d = copy_fixture("deepseek_v3", "tiny-b");
    edit_config(d.path(), |v| v["first_k_dense_replace"] = 0.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("expert 0 of model.layers.0 is missing"), "{e}");
}

/// A store that is never read: the load it is given to fails first.
struct NeverRead;

impl sluice_store::ExpertStore for NeverRead {
    fn for_each(
        &self,
        _layer: usize,
        _ids: &[u32],
        _f: &mut dyn FnMut(
            u32,
            sluice_store::ExpertView<'_>,
        ) -> Result<(), sluice_store::StoreError>,
    ) -> Result<(), sluice_store::StoreError> {
        Err(sluice_store::StoreError::Config("never read".into()))
    }

    fn stats(&self) -> sluice_store::StoreStats {
        sluice_store::StoreStats::default()
    }
}

#[test]
fn a_stream_install_with_the_wrong_expert_format_was_refused_with_18_stray_spaces() {
    // tiny-a's experts are FP8; its config made to announce tiny-b's INT4 experts instead.
    let b = copy_fixture("deepseek_v3", "tiny-b");
    let q: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.path().join("config.json")).unwrap()).unwrap();
    let d = copy_fixture("deepseek_v3", "tiny-a");
    edit_config(d.path(), |v| v["quantization_config"] = q["quantization_config"].clone());
    let c = std::sync::Arc::new(sluice_checkpoint::Checkpoint::open(d.path()).unwrap());
    let e = sluice_models::family::load_with_experts(c, std::sync::Arc::new(NeverRead))
        .expect_err("must not load")
        .to_string();
    assert!(e.contains("announces") && e.contains("a stream install of it"), "{e}");
    assert!(!e.contains("  "), "{e}");
}
