//! Qwen3 dense configuration (`config.json` of a `Qwen3ForCausalLM` checkpoint), read into typed
//! fields and checked once at load.
//!
//! Field names and defaults follow transformers' `Qwen3Config` (`configuration_qwen3.py`). Both
//! serialisations are accepted: transformers 4.x writes `rope_theta` and `rope_scaling` at the top
//! level; 5.x writes a `rope_parameters` object (`{"rope_type": "default", "rope_theta": …}`).
//! Everything the port does not implement is refused here with the key named, so an unsupported
//! checkpoint never loads and silently computes something else: RoPE scaling other than
//! `default`, a partial rotary factor, sliding-window layers, attention biases, activations
//! other than SiLU.

use crate::ModelError;
use serde::Deserialize;
use serde_json::Value;

/// `Qwen3Config.head_dim`'s default, used when `config.json` has no `head_dim` (HF's attention reads
/// `config.head_dim`, which the config class always sets).
const DEFAULT_HEAD_DIM: usize = 128;
/// `RotaryEmbeddingConfigMixin.default_theta` / the 4.x `rope_theta` default.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// The keys of `config.json` the port reads, with transformers' defaults.
#[derive(Debug, Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    /// `None` (absent or null) means one KV head per query head.
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    layer_types: Option<Vec<String>>,
}

fn default_act() -> String {
    "silu".into()
}
fn default_max_pos() -> usize {
    32_768
}
fn default_eps() -> f64 {
    1e-6
}

/// The typed, validated Qwen3 configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    /// Rows of the embedding and of the logits.
    pub vocab_size: usize,
    /// Residual width `d`.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA: each serves `num_attention_heads / num_key_value_heads` query heads).
    pub num_key_value_heads: usize,
    /// Per-head width; may differ from `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// Epsilon of every RMSNorm (layer norms, per-head q/k norms, final norm).
    pub rms_norm_eps: f32,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Positions the model was trained for. Default RoPE has no built-in limit, so, like
    /// transformers, the port does not refuse positions past it; the engine caps its context.
    pub max_position_embeddings: usize,
    /// The lm_head is the embedding matrix (no `lm_head.weight` in the checkpoint).
    pub tie_word_embeddings: bool,
}

impl Qwen3Config {
    /// Parses and checks a `config.json` value.
    pub fn from_json(v: &Value) -> Result<Self, ModelError> {
        let raw: RawConfig = serde_json::from_value(v.clone())
            .map_err(|e| ModelError::Config(format!("qwen3 config: {e}")))?;
        let bad = |m: String| Err(ModelError::Config(format!("qwen3 config: {m}")));
        if raw.hidden_act != "silu" {
            return bad(format!(
                "hidden_act {:?} is not supported (Qwen3 uses \"silu\")",
                raw.hidden_act
            ));
        }
        if raw.attention_bias {
            return bad(
                "attention_bias = true is not supported (Qwen3 has no q/k/v/o biases)".into()
            );
        }
        if raw.use_sliding_window {
            return bad("use_sliding_window = true is not supported (full attention only)".into());
        }
        if let Some(kind) = raw.layer_types.iter().flatten().find(|k| *k != "full_attention") {
            return bad(format!(
                "layer_types lists {kind:?}; only \"full_attention\" is supported"
            ));
        }
        let rope_theta = rope_theta(&raw)?;
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let head_dim = raw.head_dim.unwrap_or(DEFAULT_HEAD_DIM);
        let sizes = [
            ("vocab_size", raw.vocab_size),
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("head_dim", head_dim),
        ];
        if let Some((k, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{k} must be positive"));
        }
        if !heads.is_multiple_of(kv_heads) {
            return bad(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {head_dim} must be even for rotate_half RoPE"));
        }
        if u32::try_from(raw.vocab_size).is_err() {
            return bad(format!("vocab_size {} does not fit token ids (u32)", raw.vocab_size));
        }
        if !(raw.rms_norm_eps.is_finite() && raw.rms_norm_eps >= 0.0) {
            return bad(format!(
                "rms_norm_eps {} must be finite and non-negative",
                raw.rms_norm_eps
            ));
        }
        #[allow(clippy::cast_possible_truncation)]
        let rms_norm_eps = raw.rms_norm_eps as f32;
        Ok(Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
        })
    }

    /// Query heads per KV head (HF `num_key_value_groups`).
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Width of the concatenated query heads (`q_proj` rows, `o_proj` columns).
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated KV heads (`k_proj` / `v_proj` rows).
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Values a position's row of one layer's key (or value) cache holds: [`Self::kv_width`]
    /// and the padding that keeps successive rows out of the same cache sets.
    pub fn kv_cache_row(&self) -> usize {
        sluice_kernels::lines::row_stride(self.kv_width())
    }
}

/// RoPE θ from whichever serialisation the file uses, refusing every RoPE type but `default`
/// (transformers `RotaryEmbeddingConfigMixin.standardize_rope_params`: `rope_parameters` first,
/// then the legacy `rope_scaling`, with `rope_theta` filled from the top level or the default).
fn rope_theta(raw: &RawConfig) -> Result<f64, ModelError> {
    let bad = |m: String| Err(ModelError::Config(format!("qwen3 config: {m}")));
    let params = raw
        .rope_parameters
        .as_ref()
        .filter(|v| !v.is_null())
        .or(raw.rope_scaling.as_ref().filter(|v| !v.is_null()));
    let mut theta = raw.rope_theta.unwrap_or(DEFAULT_ROPE_THETA);
    let mut partial = raw.partial_rotary_factor;
    if let Some(p) = params {
        // A config with several layer types may nest the parameters by type; Qwen3 only has
        // full-attention layers.
        let p = p.get("full_attention").filter(|v| v.is_object()).unwrap_or(p);
        let Some(obj) = p.as_object() else {
            return bad(format!("rope parameters must be an object, got {p}"));
        };
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return bad(format!(
                "rope_type {kind:?} is not supported (only default RoPE; scaled variants such as \
                 yarn, linear, dynamic or llama3 are refused rather than approximated)"
            ));
        }
        if let Some(t) = obj.get("rope_theta") {
            match t.as_f64() {
                Some(t) => theta = t,
                None => return bad(format!("rope_theta {t} is not a number")),
            }
        }
        if let Some(f) = obj.get("partial_rotary_factor") {
            partial = f.as_f64().or(Some(f64::NAN));
        }
    }
    if let Some(f) = partial.filter(|&f| f != 1.0) {
        return bad(format!(
            "partial_rotary_factor {f} is not supported (Qwen3 rotates the whole head)"
        ));
    }
    if !(theta.is_finite() && theta > 1.0) {
        return bad(format!("rope_theta {theta} must be a finite number above 1"));
    }
    Ok(theta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": true, "max_position_embeddings": 4096
        })
    }

    fn with(k: &str, v: Value) -> Value {
        let mut c = base();
        c[k] = v;
        c
    }

    fn err(v: &Value) -> String {
        Qwen3Config::from_json(v).expect_err("must be refused").to_string()
    }

    #[test]
    fn both_rope_serialisations_parse() {
        let v4 = with("rope_theta", json!(1_000_000.0));
        let v4 = Qwen3Config::from_json(&v4).expect("4.x form");
        assert_eq!(v4.rope_theta, 1e6);
        let v5 = with("rope_parameters", json!({"rope_type": "default", "rope_theta": 5e5}));
        assert_eq!(Qwen3Config::from_json(&v5).expect("5.x form").rope_theta, 5e5);
        let none = with("rope_scaling", Value::Null);
        assert_eq!(Qwen3Config::from_json(&none).expect("null scaling").rope_theta, 1e4);
        assert_eq!(v4.head_dim, 32);
        assert_eq!(v4.kv_groups(), 2);
        assert_eq!((v4.q_width(), v4.kv_width()), (128, 64));
    }

    #[test]
    fn defaults_follow_transformers() {
        let mut c = base();
        for k in ["num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings"] {
            c.as_object_mut().expect("object").remove(k);
        }
        let c = Qwen3Config::from_json(&c).expect("defaults");
        assert_eq!((c.num_key_value_heads, c.head_dim), (4, DEFAULT_HEAD_DIM));
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let yarn = with("rope_scaling", json!({"type": "yarn", "factor": 4.0}));
        assert!(err(&yarn).contains("\"yarn\""));
        let linear = with("rope_parameters", json!({"rope_type": "linear", "factor": 2.0}));
        assert!(err(&linear).contains("\"linear\""));
        assert!(err(&with("attention_bias", json!(true))).contains("attention_bias"));
        assert!(err(&with("use_sliding_window", json!(true))).contains("use_sliding_window"));
        let lt = with("layer_types", json!(["full_attention", "sliding_attention"]));
        assert!(err(&lt).contains("sliding_attention"));
        assert!(err(&with("hidden_act", json!("gelu"))).contains("gelu"));
        assert!(err(&with("partial_rotary_factor", json!(0.5))).contains("partial_rotary_factor"));
        assert!(err(&with("num_key_value_heads", json!(3))).contains("multiple"));
        assert!(err(&with("head_dim", json!(15))).contains("even"));
        assert!(err(&with("hidden_size", json!(0))).contains("hidden_size"));
        assert!(err(&with("vocab_size", json!("many"))).contains("qwen3 config"));
    }
}
