//! GPT-OSS checkpoints that lack a tensor or contradict their config are refused at load with the
//! family, the tensor and the file named; never a panic, never a silently different computation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::edit::{copy_fixture, edit_config, edit_headers, load};

#[test]
fn a_missing_scales_tensor_names_family_and_tensor() {
    let d = copy_fixture("gpt_oss", "tiny-a");
    let name = "model.layers.2.mlp.experts.down_proj_scales";
    let renamed = "\"model.layers.2.mlp.experts.down_proj_scaleZ\"";
    edit_headers(d.path(), &format!("\"{name}\""), renamed);
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("gpt_oss checkpoint:"), "{e}");
    assert!(e.contains(name), "{e}");
}

#[test]
fn an_expert_count_that_contradicts_the_tensors_names_file_and_tensor() {
    let d = copy_fixture("gpt_oss", "tiny-b");
    edit_config(d.path(), |v| v["num_local_experts"] = 8.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.starts_with("gpt_oss checkpoint:"), "{e}");
    assert!(e.contains("model.layers.0.mlp.router.weight") && e.contains("model-0000"), "{e}");
}

#[test]
fn experts_not_in_mxfp4_and_other_rope_types_are_refused() {
    let d = copy_fixture("gpt_oss", "tiny-a");
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("quantization_config");
    });
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("gpt_oss config") && e.contains("mxfp4"), "{e}");
    let d = copy_fixture("gpt_oss", "tiny-a");
    edit_config(d.path(), |v| v["rope_scaling"]["rope_type"] = "linear".into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("\"linear\""), "{e}");
    let d = copy_fixture("gpt_oss", "tiny-a");
    edit_config(d.path(), |v| v["layer_types"][1] = "chunked_attention".into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("chunked_attention"), "{e}");
    let d = copy_fixture("gpt_oss", "tiny-a");
    edit_config(d.path(), |v| v["experts_per_token"] = 3.into());
    let e = load(d.path()).expect_err("must not load");
    assert!(e.contains("experts_per_token"), "{e}");
}
