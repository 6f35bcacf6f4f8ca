//! Qwen3-MoE configuration (`config.json` of a `Qwen3MoeForCausalLM` checkpoint), read into typed
//! fields and checked once at load.
//!
//! Field names and defaults follow transformers' `Qwen3MoeConfig` (`configuration_qwen3_moe.py`,
//! 5.17). Everything Qwen3-MoE shares with Qwen3 dense (attention, RoPE, norms, the dense MLP of
//! the `mlp_only_layers`) is parsed by [`Qwen3Config`], so the same unsupported settings are
//! refused with the same messages (with the family named `qwen3_moe`); this file adds the sparse
//! block: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`,
//! `decoder_sparse_step` and `mlp_only_layers`.

use crate::qwen3::config::Qwen3Config;
use crate::ModelError;
use serde::Deserialize;
use serde_json::Value;

/// The MoE keys of `config.json`, with transformers' defaults.
#[derive(Debug, Deserialize)]
struct RawMoe {
    #[serde(default = "default_experts")]
    num_experts: usize,
    #[serde(default = "default_top_k")]
    num_experts_per_tok: usize,
    #[serde(default = "default_moe_inter")]
    moe_intermediate_size: usize,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "default_step")]
    decoder_sparse_step: usize,
    /// `None` (absent or null) means no dense-only layers.
    mlp_only_layers: Option<Vec<usize>>,
}

fn default_experts() -> usize {
    128
}
fn default_top_k() -> usize {
    8
}
fn default_moe_inter() -> usize {
    768
}
fn default_step() -> usize {
    1
}

/// The typed, validated Qwen3-MoE configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3MoeConfig {
    /// Everything shared with Qwen3 dense; `intermediate_size` is the width of the dense layers.
    pub base: Qwen3Config,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each row is routed to (top-k).
    pub num_experts_per_tok: usize,
    /// Width of one expert's gate/up projections.
    pub moe_intermediate_size: usize,
    /// Renormalise the top-k softmax probabilities to sum to one.
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer (1-based) is MoE, unless listed in `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    /// Layers that use the dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl Qwen3MoeConfig {
    /// Parses and checks a `config.json` value.
    pub fn from_json(v: &Value) -> Result<Self, ModelError> {
        let base = Qwen3Config::from_json(v).map_err(|e| match e {
            ModelError::Config(m) => {
                ModelError::Config(m.replacen("qwen3 config", "qwen3_moe config", 1))
            }
            e => e,
        })?;
        let raw: RawMoe = serde_json::from_value(v.clone())
            .map_err(|e| ModelError::Config(format!("qwen3_moe config: {e}")))?;
        let bad = |m: String| Err(ModelError::Config(format!("qwen3_moe config: {m}")));
        let sizes = [
            ("num_experts", raw.num_experts),
            ("num_experts_per_tok", raw.num_experts_per_tok),
            ("moe_intermediate_size", raw.moe_intermediate_size),
            ("decoder_sparse_step", raw.decoder_sparse_step),
        ];
        if let Some((k, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            // transformers would build no MoE layer for num_experts = 0: that is Qwen3 dense,
            // which has its own architecture name.
            return bad(format!("{k} must be positive"));
        }
        if raw.num_experts_per_tok > raw.num_experts {
            return bad(format!(
                "num_experts_per_tok {} exceeds num_experts {}",
                raw.num_experts_per_tok, raw.num_experts
            ));
        }
        if u32::try_from(raw.num_experts).is_err() {
            return bad(format!("num_experts {} does not fit expert ids (u32)", raw.num_experts));
        }
        Ok(Self {
            base,
            num_experts: raw.num_experts,
            num_experts_per_tok: raw.num_experts_per_tok,
            moe_intermediate_size: raw.moe_intermediate_size,
            norm_topk_prob: raw.norm_topk_prob,
            decoder_sparse_step: raw.decoder_sparse_step,
            mlp_only_layers: raw.mlp_only_layers.unwrap_or_default(),
        })
    }

    /// Whether layer `i` is a sparse MoE layer (`Qwen3MoeDecoderLayer.__init__`: not in
    /// `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`).
    pub fn is_moe(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i) && (i + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Indices of the MoE layers.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.base.num_hidden_layers).filter(|&i| self.is_moe(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1e6, "rope_scaling": null,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [0],
            "sliding_window": null, "use_sliding_window": false, "max_window_layers": 4
        })
    }

    fn with(k: &str, v: Value) -> Value {
        let mut c = base();
        c[k] = v;
        c
    }

    fn err(v: &Value) -> String {
        Qwen3MoeConfig::from_json(v).expect_err("must be refused").to_string()
    }

    #[test]
    fn sparse_layers_follow_step_and_mlp_only_layers() {
        let c = Qwen3MoeConfig::from_json(&base()).expect("parses");
        assert_eq!(c.moe_layers(), [1, 2, 3]);
        let c = Qwen3MoeConfig::from_json(&with("decoder_sparse_step", json!(2))).expect("step 2");
        // mlp_only_layers [0] and step 2: layers 1 and 3 are MoE.
        assert_eq!(c.moe_layers(), [1, 3]);
        let mut v = with("mlp_only_layers", Value::Null);
        v["decoder_sparse_step"] = json!(1);
        assert_eq!(Qwen3MoeConfig::from_json(&v).expect("null").moe_layers(), [0, 1, 2, 3]);
    }

    #[test]
    fn defaults_follow_transformers() {
        let mut v = base();
        for k in ["norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"] {
            v.as_object_mut().expect("object").remove(k);
        }
        let c = Qwen3MoeConfig::from_json(&v).expect("defaults");
        assert!(!c.norm_topk_prob);
        assert_eq!((c.decoder_sparse_step, c.mlp_only_layers.len()), (1, 0));
    }

    #[test]
    fn bad_moe_settings_are_refused_by_name() {
        assert!(err(&with("num_experts_per_tok", json!(9))).contains("exceeds num_experts"));
        assert!(err(&with("num_experts", json!(0))).contains("num_experts must be positive"));
        assert!(err(&with("decoder_sparse_step", json!(0))).contains("decoder_sparse_step"));
        let e = err(&with("attention_bias", json!(true)));
        assert!(e.contains("qwen3_moe config") && e.contains("attention_bias"), "{e}");
        let e = err(&with("rope_scaling", json!({"type": "yarn", "factor": 4.0})));
        assert!(e.contains("qwen3_moe config") && e.contains("yarn"), "{e}");
    }
}
