//! GPT-OSS configuration (`config.json` of a `GptOssForCausalLM` checkpoint such as gpt-oss-20b
//! and gpt-oss-120b), read into typed fields and checked once at load.
//!
//! Field names and defaults follow transformers' `GptOssConfig` (`configuration_gpt_oss.py`,
//! 5.17). Both RoPE serialisations are accepted: the published files write `rope_theta` and a
//! `rope_scaling` object of type `yarn`; transformers 5.x writes `rope_parameters`. Refused, with
//! the key named: RoPE types other than YaRN, experts that are not MXFP4 (`quantization_config`
//! must say `mxfp4`, as the published files do), a `swiglu_limit` other than finite positive, and
//! `layer_types` other than `sliding_attention` / `full_attention`.

use crate::ModelError;
use serde::Deserialize;
use serde_json::Value;

/// `GptOssConfig.head_dim`'s default.
const DEFAULT_HEAD_DIM: usize = 64;
/// `GptOssConfig.default_theta`.
const DEFAULT_ROPE_THETA: f64 = 150_000.0;
/// `GptOssExperts.alpha` (a constant of the model, not a config key).
pub const SWIGLU_ALPHA: f32 = 1.702;

/// The keys of `config.json` the port reads, with transformers' defaults.
#[derive(Debug, Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_local_experts: usize,
    num_experts_per_tok: Option<usize>,
    /// The published files also carry the OpenAI spelling; it must agree.
    experts_per_token: Option<usize>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_true")]
    attention_bias: bool,
    swiglu_limit: Option<f64>,
    quantization_config: Option<Value>,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_true() -> bool {
    true
}

/// YaRN parameters (`rope_type: "yarn"`), as transformers' `_compute_yarn_parameters` reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    /// Context extension factor.
    pub factor: f64,
    /// Rotations at which extrapolation stops (`beta_fast`, default 32).
    pub beta_fast: f64,
    /// Rotations at which interpolation starts (`beta_slow`, default 1).
    pub beta_slow: f64,
    /// Training context (`original_max_position_embeddings`).
    pub original_max_position_embeddings: f64,
    /// Round the correction range outwards (`truncate`, default true).
    pub truncate: bool,
    /// Scale of cos/sin (`attention_factor`, default `0.1 ln(factor) + 1`).
    pub attention_factor: f64,
}

/// Whether a layer attends to every earlier position or to the last `sliding_window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// `full_attention`.
    Full,
    /// `sliding_attention`: keys `pos − window < k ≤ pos`.
    Sliding,
}

/// The typed, validated GPT-OSS configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssConfig {
    /// Rows of the embedding and of the logits.
    pub vocab_size: usize,
    /// Residual width `d` (a multiple of 32: the MXFP4 block width of `gate_up_proj`'s input).
    pub hidden_size: usize,
    /// Expert width `I` (a multiple of 32: the block width of `down_proj`'s input).
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Routed experts per layer.
    pub num_local_experts: usize,
    /// Experts per row.
    pub num_experts_per_tok: usize,
    /// Window of the sliding layers.
    pub sliding_window: usize,
    /// Attention kind of each layer.
    pub layer_types: Vec<AttnKind>,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// YaRN scaling.
    pub yarn: Yarn,
    /// The SwiGLU clamp (`swiglu_limit`, 7.0 published).
    pub swiglu_limit: f32,
    /// The lm_head is the embedding matrix.
    pub tie_word_embeddings: bool,
}

fn num(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f64>, ModelError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            ModelError::Config(format!("gpt_oss config: rope {key} {v} is not a number"))
        }),
    }
}

impl GptOssConfig {
    /// Parses and checks a `config.json` value.
    pub fn from_json(v: &Value) -> Result<Self, ModelError> {
        let raw: RawConfig = serde_json::from_value(v.clone())
            .map_err(|e| ModelError::Config(format!("gpt_oss config: {e}")))?;
        let bad = |m: String| Err(ModelError::Config(format!("gpt_oss config: {m}")));
        let method = raw.quantization_config.as_ref().and_then(|q| q.get("quant_method"));
        if method.and_then(Value::as_str) != Some("mxfp4") {
            return bad(format!(
                "quantization_config.quant_method is {}; sluice reads GPT-OSS experts only as \
                 published (MXFP4 *_blocks / *_scales, quant_method \"mxfp4\")",
                method.map_or("absent".into(), ToString::to_string)
            ));
        }
        if !raw.attention_bias {
            return bad(
                "attention_bias = false is not supported (GPT-OSS has q/k/v/o biases)".into()
            );
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        // `GptOssConfig.head_dim` defaults to 64 (not hidden_size / heads: 2880 / 64 = 45).
        let head_dim = raw.head_dim.unwrap_or(DEFAULT_HEAD_DIM);
        let k = raw.num_experts_per_tok.or(raw.experts_per_token).unwrap_or(4);
        if let Some(other) = raw.experts_per_token.filter(|&o| o != k) {
            return bad(format!("num_experts_per_tok {k} contradicts experts_per_token {other}"));
        }
        let sizes = [
            ("vocab_size", raw.vocab_size),
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("head_dim", head_dim),
            ("num_local_experts", raw.num_local_experts),
            ("num_experts_per_tok", k),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{key} must be positive"));
        }
        if k > raw.num_local_experts {
            return bad(format!(
                "num_experts_per_tok {k} exceeds num_local_experts {}",
                raw.num_local_experts
            ));
        }
        if !heads.is_multiple_of(kv_heads) {
            return bad(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {head_dim} must be even"));
        }
        for (key, v) in
            [("hidden_size", raw.hidden_size), ("intermediate_size", raw.intermediate_size)]
        {
            if !v.is_multiple_of(32) {
                return bad(format!("{key} {v} is not a multiple of the MXFP4 block (32)"));
            }
        }
        if u32::try_from(raw.vocab_size).is_err() || u32::try_from(raw.num_local_experts).is_err() {
            return bad("vocab_size and num_local_experts must fit u32 ids".into());
        }
        let layer_types: Vec<AttnKind> = match &raw.layer_types {
            // GptOssConfig.__post_init__: sliding on even layers, full on odd ones.
            None => (0..raw.num_hidden_layers)
                .map(|i| if i % 2 == 0 { AttnKind::Sliding } else { AttnKind::Full })
                .collect(),
            Some(t) if t.len() != raw.num_hidden_layers => {
                return bad(format!(
                    "layer_types has {} entries for {} layers",
                    t.len(),
                    raw.num_hidden_layers
                ))
            }
            Some(t) => t
                .iter()
                .map(|s| match s.as_str() {
                    "full_attention" => Ok(AttnKind::Full),
                    "sliding_attention" => Ok(AttnKind::Sliding),
                    other => Err(ModelError::Config(format!(
                        "gpt_oss config: layer_types lists {other:?}; only \"full_attention\" and \
                         \"sliding_attention\" exist"
                    ))),
                })
                .collect::<Result<_, _>>()?,
        };
        let sliding_window = raw.sliding_window.unwrap_or(128);
        if sliding_window == 0 && layer_types.contains(&AttnKind::Sliding) {
            return bad("sliding_window must be positive".into());
        }
        let limit = raw.swiglu_limit.unwrap_or(7.0);
        if !(limit.is_finite() && limit > 0.0) {
            return bad(format!("swiglu_limit {limit} must be finite and positive"));
        }
        if !(raw.rms_norm_eps.is_finite() && raw.rms_norm_eps >= 0.0) {
            return bad(format!(
                "rms_norm_eps {} must be finite and non-negative",
                raw.rms_norm_eps
            ));
        }
        let (rope_theta, yarn) = rope(&raw)?;
        #[allow(clippy::cast_possible_truncation)]
        let (rms_norm_eps, swiglu_limit) = (raw.rms_norm_eps as f32, limit as f32);
        Ok(Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps,
            num_local_experts: raw.num_local_experts,
            num_experts_per_tok: k,
            sliding_window,
            layer_types,
            rope_theta,
            yarn,
            swiglu_limit,
            tie_word_embeddings: raw.tie_word_embeddings,
        })
    }

    /// Width of the concatenated query heads.
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated KV heads.
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Values a position's row of one layer's key (or value) cache holds: [`Self::kv_width`]
    /// and the padding that keeps successive rows out of the same cache sets.
    pub fn kv_cache_row(&self) -> usize {
        sluice_kernels::lines::row_stride(self.kv_width())
    }
}

/// θ and YaRN from `rope_parameters` or the published `rope_theta` + `rope_scaling`; absent
/// both, `GptOssConfig.__post_init__`'s YaRN (factor 32, beta 32/1, original 4096, truncate off).
fn rope(raw: &RawConfig) -> Result<(f64, Yarn), ModelError> {
    let bad = |m: String| Err(ModelError::Config(format!("gpt_oss config: {m}")));
    let params = raw
        .rope_parameters
        .as_ref()
        .filter(|v| !v.is_null())
        .or(raw.rope_scaling.as_ref().filter(|v| !v.is_null()));
    let default = serde_json::json!({
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": false, "original_max_position_embeddings": 4096
    });
    let p = params.unwrap_or(&default);
    let p = p.get("full_attention").filter(|v| v.is_object()).unwrap_or(p);
    let Some(obj) = p.as_object() else {
        return bad(format!("rope parameters must be an object, got {p}"));
    };
    let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str);
    if kind != Some("yarn") {
        return bad(format!(
            "rope_type {:?} is not supported (GPT-OSS uses \"yarn\")",
            kind.unwrap_or("default")
        ));
    }
    let theta = num(obj, "rope_theta")?.or(raw.rope_theta).unwrap_or(DEFAULT_ROPE_THETA);
    if !(theta.is_finite() && theta > 1.0) {
        return bad(format!("rope_theta {theta} must be a finite number above 1"));
    }
    if num(obj, "partial_rotary_factor")?.is_some_and(|f| f != 1.0) {
        return bad(
            "partial_rotary_factor is not supported (GPT-OSS rotates the whole head)".into()
        );
    }
    let Some(orig) = num(obj, "original_max_position_embeddings")? else {
        return bad("yarn needs original_max_position_embeddings".into());
    };
    let Some(factor) = num(obj, "factor")? else {
        return bad("yarn needs factor".into());
    };
    if !(factor.is_finite() && factor >= 1.0 && orig.is_finite() && orig > 0.0) {
        return bad(format!(
            "yarn factor {factor} / original_max_position_embeddings {orig} are out of range"
        ));
    }
    if num(obj, "mscale")?.is_some() || num(obj, "mscale_all_dim")?.is_some() {
        return bad("yarn mscale / mscale_all_dim are not supported (GPT-OSS has neither)".into());
    }
    // transformers: `beta_fast = rope_parameters.get("beta_fast") or 32` (0 falls back too).
    let beta =
        |k: &str, d: f64| Ok::<f64, ModelError>(num(obj, k)?.filter(|&b| b != 0.0).unwrap_or(d));
    let attention_factor = num(obj, "attention_factor")?.unwrap_or(if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    });
    let truncate = obj.get("truncate").and_then(Value::as_bool).unwrap_or(true);
    let yarn = Yarn {
        factor,
        beta_fast: beta("beta_fast", 32.0)?,
        beta_slow: beta("beta_slow", 1.0)?,
        original_max_position_embeddings: orig,
        truncate,
        attention_factor,
    };
    Ok((theta, yarn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "vocab_size": 512, "hidden_size": 64, "intermediate_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 8, "quantization_config": {"quant_method": "mxfp4"}
        })
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = GptOssConfig::from_json(&base()).expect("defaults");
        assert_eq!(c.head_dim, 64, "head_dim defaults to 64, not hidden / heads");
        assert_eq!((c.num_experts_per_tok, c.sliding_window), (4, 128));
        assert_eq!(c.layer_types, [AttnKind::Sliding, AttnKind::Full, AttnKind::Sliding]);
        assert_eq!(c.rope_theta, 150_000.0);
        assert_eq!((c.yarn.factor, c.yarn.truncate), (32.0, false));
        assert!((c.yarn.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        assert_eq!(c.swiglu_limit, 7.0);
    }

    #[test]
    fn shapes_the_mxfp4_blocks_cannot_hold_are_refused() {
        let mut v = base();
        v["intermediate_size"] = json!(48);
        let e = GptOssConfig::from_json(&v).expect_err("48 is not a multiple of 32").to_string();
        assert!(e.contains("intermediate_size 48"), "{e}");
    }
}
