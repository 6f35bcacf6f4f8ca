//! Which Kimi K3 tensors the int8 spine conversion quantizes, and the row quantization itself
//! (docs/INT8.md has the definitions this file implements).

use half::f16;
use sluice_core::{bf16_to_f32, f16_to_f32};

/// Prefix of language-model tensors in the multimodal release.
const LM: &str = "language_model.";

/// Per-layer suffixes (after `model.layers.{i}.`) of the matrices that are quantized: every
/// large 2-D BF16 projection of attention (KDA and MLA), the dense MLP, the shared experts,
/// and the latent MoE's routed-expert down/up projections.
pub const QUANTIZED_LAYER_SUFFIXES: [&str; 20] = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.g_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.f_a_proj.weight",
    "self_attn.f_b_proj.weight",
    "self_attn.b_proj.weight",
    "self_attn.q_a_proj.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_b_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "block_sparse_moe.shared_experts.gate_proj.weight",
    "block_sparse_moe.shared_experts.up_proj.weight",
    "block_sparse_moe.shared_experts.down_proj.weight",
    "block_sparse_moe.routed_expert_down_proj.weight",
    "block_sparse_moe.routed_expert_up_proj.weight",
];

/// The token embedding table (quantized only when asked).
const EMBEDDINGS: &str = "model.embed_tokens.weight";

/// True when the conversion keeps tensor `name` byte for byte; false for the matrices it
/// quantizes to row-int8: the [`QUANTIZED_LAYER_SUFFIXES`] of every layer and `lm_head`.
///
/// Kept: norms (every `*norm.weight`), the KDA short-convolution weights, `A_log`, `dt_bias`,
/// the router (`gate.weight`: it decides which experts run, a discrete choice an int8 error
/// could flip, and it is about 1% of the spine) and its bias, the AttnRes projections, the
/// routed experts (MXFP4 stays MXFP4), the embeddings (unless `ConvertOptions::embeddings`),
/// and every tensor this list does not name (vision tower, projector, future additions).
pub fn keeps_full_precision(name: &str) -> bool {
    let bare = name.strip_prefix(LM).unwrap_or(name);
    if bare == "lm_head.weight" {
        return false;
    }
    let Some(rest) = bare.strip_prefix("model.layers.") else {
        return true;
    };
    let Some((layer, suffix)) = rest.split_once('.') else {
        return true;
    };
    let numeric = !layer.is_empty() && layer.bytes().all(|b| b.is_ascii_digit());
    !(numeric && QUANTIZED_LAYER_SUFFIXES.contains(&suffix))
}

/// True for the token embedding table.
pub fn is_embedding(name: &str) -> bool {
    name.strip_prefix(LM).unwrap_or(name) == EMBEDDINGS
}

/// Suffix of the scale tensor that accompanies each quantized tensor.
pub const SCALE_SUFFIX: &str = "_scale";

/// Why a row cannot be quantized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowError {
    /// The row holds a NaN or an infinity.
    NonFinite,
    /// `absmax / 127` exceeds the largest f16.
    ScaleOverflow {
        /// The row's largest magnitude.
        absmax: f32,
    },
}

/// Quantizes one row of little-endian bf16 `src` into signed bytes `q` (same length);
/// returns the f16 scale's bits.
///
/// `scale = f16_rne(f32(absmax) / 127)`, except that a scale so small (an f16 subnormal)
/// that `absmax / scale > 127.5` is raised to the next f16 until it is not, so every element
/// stays within half a step; `q = clamp(round_half_even(f32(x) / f32(scale)), ±127)` with
/// the division in f32. An all-zero row has scale 0 and all `q = 0`.
pub fn quantize_row(src: &[u8], q: &mut [u8]) -> Result<u16, RowError> {
    assert_eq!(src.len(), 2 * q.len(), "quantize_row lengths");
    let widen = |b: &[u8]| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    let mut absmax = 0.0f32;
    for b in src.chunks_exact(2) {
        let x = widen(b);
        if !x.is_finite() {
            return Err(RowError::NonFinite);
        }
        absmax = absmax.max(x.abs());
    }
    if absmax == 0.0 {
        q.fill(0);
        return Ok(0);
    }
    // `half` rounds to nearest, ties to even (tested below), as docs/INT8.md requires.
    let mut scale = f16::from_f32(absmax / 127.0).to_bits();
    if scale >= 0x7C00 {
        return Err(RowError::ScaleOverflow { absmax });
    }
    while f64::from(f16_to_f32(scale)) * 127.5 < f64::from(absmax) {
        scale += 1;
    }
    let s = f16_to_f32(scale);
    for (o, b) in q.iter_mut().zip(src.chunks_exact(2)) {
        let v = (widen(b) / s).round_ties_even().clamp(-127.0, 127.0);
        // Exact: `v` is an integer in −127..=127 after the clamp.
        #[allow(clippy::cast_possible_truncation)]
        let v = v as i8;
        *o = v.to_le_bytes()[0];
    }
    Ok(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kept_tensors_by_kind() {
        for p in ["", "language_model."] {
            let l = |s: &str| format!("{p}model.layers.7.{s}");
            // Norms, AttnRes, KDA parameters, router, experts, globals.
            for s in [
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attention_res_norm.weight",
                "mlp_res_norm.weight",
                "self_attention_res_proj.weight",
                "mlp_res_proj.weight",
                "self_attn.q_conv1d.weight",
                "self_attn.k_conv1d.weight",
                "self_attn.v_conv1d.weight",
                "self_attn.A_log",
                "self_attn.dt_bias",
                "self_attn.o_norm.weight",
                "self_attn.q_a_layernorm.weight",
                "self_attn.kv_a_layernorm.weight",
                "block_sparse_moe.gate.weight",
                "block_sparse_moe.gate.e_score_correction_bias",
                "block_sparse_moe.routed_expert_norm.weight",
                "block_sparse_moe.experts.12.w1.weight_packed",
                "block_sparse_moe.experts.12.w2.weight_scale",
                "self_attn.q_proj.bias",
            ] {
                assert!(keeps_full_precision(&l(s)), "{s}");
            }
            for g in [
                "model.embed_tokens.weight",
                "model.norm.weight",
                "model.output_attn_res_norm.weight",
                "model.output_attn_res_proj.weight",
                "lm_head.bias",
            ] {
                assert!(keeps_full_precision(&format!("{p}{g}")), "{g}");
            }
            for s in QUANTIZED_LAYER_SUFFIXES {
                assert!(!keeps_full_precision(&l(s)), "{s}");
                assert!(keeps_full_precision(&format!("{p}model.layers.x.{s}")), "{s}");
                assert!(keeps_full_precision(&format!("{p}model.layers..{s}")), "{s}");
            }
            assert!(!keeps_full_precision(&format!("{p}lm_head.weight")));
            assert!(is_embedding(&format!("{p}model.embed_tokens.weight")));
        }
        for other in ["vision_tower.blocks.0.attn.qkv.weight", "mm_projector.linear_1.weight"] {
            assert!(keeps_full_precision(other) && !is_embedding(other), "{other}");
        }
    }

    /// The scale rounding docs/INT8.md specifies, through the `half` crate.
    fn f32_to_f16_rne(x: f32) -> u16 {
        f16::from_f32(x).to_bits()
    }

    /// `half::f16::from_f32` rounds to nearest, ties to even, including subnormals and the
    /// overflow boundary: the conversion's determinism across machines rests on it.
    #[test]
    fn f16_rounding_is_nearest_even() {
        // Every finite f16 round-trips.
        for h in (0u16..=0xFFFF).filter(|h| h & 0x7C00 != 0x7C00) {
            assert_eq!(f32_to_f16_rne(f16_to_f32(h)), h, "{h:#06x}");
        }
        // Midpoints between neighbours round to the even one; just above rounds up.
        for h in (0u16..0x7BFF).step_by(7) {
            let (a, b) = (f16_to_f32(h), f16_to_f32(h + 1));
            // Exact in f32: neighbouring f16 values differ in their last of 11 significant bits.
            let mid = (a + b) / 2.0;
            let even = if h % 2 == 0 { h } else { h + 1 };
            assert_eq!(f32_to_f16_rne(mid), even, "midpoint after {h:#06x}");
            assert_eq!(f32_to_f16_rne(-mid), even | 0x8000);
            assert_eq!(f32_to_f16_rne(f32::from_bits(mid.to_bits() + 1)), h + 1);
        }
        assert_eq!(f32_to_f16_rne(65520.0), 0x7C00);
        assert_eq!(f32_to_f16_rne(65519.99), 0x7BFF);
        assert_eq!(f32_to_f16_rne(2.0f32.powi(-25)), 0);
        assert_eq!(f32_to_f16_rne(2.0f32.powi(-25) * 1.0001), 1);
        assert_eq!(f32_to_f16_rne(f32::NEG_INFINITY), 0xFC00);
        assert!(f16_to_f32(f32_to_f16_rne(f32::NAN)).is_nan());
    }

    fn bf16_row(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_bits().to_le_bytes()[2..4].to_vec()).collect()
    }

    proptest! {
        #[test]
        fn dequantized_within_half_a_step(
            v in prop::collection::vec(-4.0f32..4.0, 1..300),
            exp in -40i32..20,
        ) {
            let v: Vec<f32> = v.iter().map(|x| x * 2.0f32.powi(exp)).collect();
            let src = bf16_row(&v);
            let mut q = vec![0u8; v.len()];
            let scale = quantize_row(&src, &mut q).expect("finite row");
            let s = f16_to_f32(scale);
            for (b, &qi) in src.chunks_exact(2).zip(&q) {
                let x = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                let qi = i8::from_le_bytes([qi]);
                prop_assert!((-127..=127).contains(&qi));
                let err = (f64::from(qi) * f64::from(s) - f64::from(x)).abs();
                prop_assert!(err <= f64::from(s) * 0.5 * (1.0 + 1e-6), "x {x} q {qi} s {s}");
            }
        }
    }

    #[test]
    fn special_rows() {
        let mut q = [9u8; 3];
        assert_eq!(quantize_row(&bf16_row(&[0.0, -0.0, 0.0]), &mut q), Ok(0));
        assert_eq!(q, [0; 3]);
        assert_eq!(
            quantize_row(&bf16_row(&[1.0, f32::NAN, 0.0]), &mut q),
            Err(RowError::NonFinite)
        );
        assert!(matches!(
            quantize_row(&bf16_row(&[1e7, 0.0, 0.0]), &mut q),
            Err(RowError::ScaleOverflow { .. })
        ));
        // absmax itself maps to ±127 exactly when the scale is exact.
        assert_eq!(quantize_row(&bf16_row(&[127.0, -63.5, 1.0]), &mut q), Ok(0x3C00));
        assert_eq!(q.map(|b| i8::from_le_bytes([b])), [127, -64, 1]);
    }
}
