//! DeepSeek-V3 family configuration (`config.json` of a `DeepseekV3ForCausalLM` checkpoint:
//! DeepSeek V3 / R1 with `model_type` `deepseek_v3`, Kimi K2 with `kimi_k2`), read into typed
//! fields and checked once at load.
//!
//! Field names and defaults follow transformers' `DeepseekV3Config` (5.17). RoPE comes from the
//! published `rope_theta` + `rope_scaling` (type `yarn` with `mscale` / `mscale_all_dim`) or from
//! transformers 5.x's `rope_parameters`. Refused, with the key named: a `model_type` other than
//! the two above, `scoring_func` other than `sigmoid` and `topk_method` other than `noaux_tc`
//! (DeepSeek V2's softmax routing), `moe_layer_freq` other than 1, `attention_bias`, an activation
//! other than SiLU, experts that do not split into `n_group` equal groups, and FP8 block sizes
//! other than 128×128.

use crate::gpt_oss::config::Yarn;
use crate::ModelError;
use serde::Deserialize;
use serde_json::Value;

/// The keys of `config.json` the port reads, with `DeepseekV3Config`'s defaults.
#[derive(Debug, Deserialize)]
struct Raw {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default = "one")]
    n_shared_experts: usize,
    n_routed_experts: usize,
    #[serde(default = "default_rsf")]
    routed_scaling_factor: f64,
    kv_lora_rank: usize,
    q_lora_rank: Option<usize>,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    qk_nope_head_dim: usize,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    num_experts_per_tok: usize,
    #[serde(default)]
    first_k_dense_replace: usize,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    rope_interleave: Option<bool>,
    hidden_act: Option<String>,
    scoring_func: Option<String>,
    topk_method: Option<String>,
    moe_layer_freq: Option<usize>,
    quantization_config: Option<Value>,
}

fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn default_rsf() -> f64 {
    2.5
}
fn default_eps() -> f64 {
    1e-6
}

/// The typed, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepseekV3Config {
    /// `deepseek_v3` or `kimi_k2` (the family name errors and displays use).
    pub model_type: &'static str,
    /// Vocabulary rows.
    pub vocab_size: usize,
    /// Model width d.
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    /// Width of one routed expert (the shared experts are `n_shared_experts` times wider).
    pub moe_intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Shared experts (summed into one MLP of width `n_shared_experts · moe_intermediate_size`).
    pub n_shared_experts: usize,
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    /// Routed weights are multiplied by this.
    pub routed_scaling_factor: f32,
    /// Latent width of the kv compression.
    pub kv_lora_rank: usize,
    /// Latent width of the q compression; `None` for a plain `q_proj` (V2-Lite style).
    pub q_lora_rank: Option<usize>,
    /// Rotary part of each q/k head (shared by all heads on the k side).
    pub qk_rope_head_dim: usize,
    /// Value head width.
    pub v_head_dim: usize,
    /// Non-rotary part of each q/k head.
    pub qk_nope_head_dim: usize,
    /// Expert groups.
    pub n_group: usize,
    /// Groups kept per row.
    pub topk_group: usize,
    /// Experts per row.
    pub num_experts_per_tok: usize,
    /// Layers `0..first_k_dense_replace` use the dense MLP.
    pub first_k_dense_replace: usize,
    /// Renormalise the chosen experts' scores to sum to one.
    pub norm_topk_prob: bool,
    /// Epsilon of the decoder norms (the q/kv latent norms use 1e-6, `DeepseekV3RMSNorm`'s
    /// default, whatever this says).
    pub rms_norm_eps: f32,
    /// The lm_head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// YaRN scaling, or `None` for plain RoPE.
    pub yarn: Option<Yarn>,
    /// YaRN `mscale_all_dim` (0 when absent): the softmax scale is multiplied by
    /// `yarn_get_mscale(factor, mscale_all_dim)²`.
    pub mscale_all_dim: f64,
    /// Rotary dims are interleaved pairs (`rope_interleave`, default true).
    pub rope_interleave: bool,
}

/// `yarn_get_mscale` of `modeling_deepseek_v3.py`.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl DeepseekV3Config {
    /// Parses and checks a `config.json` value.
    pub fn from_json(v: &Value) -> Result<Self, ModelError> {
        let raw: Raw = serde_json::from_value(v.clone())
            .map_err(|e| ModelError::Config(format!("deepseek_v3 config: {e}")))?;
        let model_type = match raw.model_type.as_deref() {
            None | Some("deepseek_v3") => "deepseek_v3",
            Some("kimi_k2") => "kimi_k2",
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "deepseek_v3 config: model_type {other:?} is not supported (deepseek_v3 or \
                     kimi_k2)"
                )))
            }
        };
        let bad = |m: String| Err(ModelError::Config(format!("{model_type} config: {m}")));
        let n_group = raw.n_group.unwrap_or(8);
        let topk_group = raw.topk_group.unwrap_or(4);
        let sizes = [
            ("vocab_size", raw.vocab_size),
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("moe_intermediate_size", raw.moe_intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("n_routed_experts", raw.n_routed_experts),
            ("kv_lora_rank", raw.kv_lora_rank),
            ("qk_rope_head_dim", raw.qk_rope_head_dim),
            ("v_head_dim", raw.v_head_dim),
            ("num_experts_per_tok", raw.num_experts_per_tok),
            ("n_group", n_group),
            ("topk_group", topk_group),
        ];
        if let Some((k, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{k} must be positive"));
        }
        if raw.q_lora_rank == Some(0) {
            return bad("q_lora_rank must be positive or null".into());
        }
        if let Some(f) = raw.scoring_func.as_deref().filter(|f| *f != "sigmoid") {
            return bad(format!("scoring_func {f:?} is not supported (DeepSeek-V3 uses sigmoid)"));
        }
        if let Some(m) = raw.topk_method.as_deref().filter(|m| *m != "noaux_tc") {
            return bad(format!("topk_method {m:?} is not supported (DeepSeek-V3 uses noaux_tc)"));
        }
        if let Some(f) = raw.moe_layer_freq.filter(|&f| f != 1) {
            return bad(format!(
                "moe_layer_freq {f} is not supported (every layer from \
                                first_k_dense_replace on is MoE)"
            ));
        }
        if raw.attention_bias {
            return bad("attention_bias = true is not supported".into());
        }
        if let Some(a) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
            return bad(format!("hidden_act {a:?} is not supported (silu)"));
        }
        if !raw.n_routed_experts.is_multiple_of(n_group) || topk_group > n_group {
            return bad(format!(
                "n_routed_experts {} must split into n_group {n_group} equal groups, of which \
                 topk_group {topk_group} are kept",
                raw.n_routed_experts
            ));
        }
        let per_group = raw.n_routed_experts / n_group;
        if per_group < 2 && n_group > 1 {
            return bad("group scores need at least 2 experts per group".into());
        }
        if raw.num_experts_per_tok > topk_group * per_group {
            return bad(format!(
                "num_experts_per_tok {} exceeds the experts of topk_group {topk_group} groups",
                raw.num_experts_per_tok
            ));
        }
        if !raw.qk_rope_head_dim.is_multiple_of(2) {
            return bad(format!("qk_rope_head_dim {} must be even", raw.qk_rope_head_dim));
        }
        if u32::try_from(raw.vocab_size).is_err() || u32::try_from(raw.n_routed_experts).is_err() {
            return bad("vocab_size and n_routed_experts must fit u32 ids".into());
        }
        if !(raw.routed_scaling_factor.is_finite() && raw.rms_norm_eps.is_finite()) {
            return bad("routed_scaling_factor and rms_norm_eps must be finite".into());
        }
        check_quantization(raw.quantization_config.as_ref(), model_type)?;
        let (theta, yarn, mscale_all_dim) = rope(&raw, model_type)?;
        #[allow(clippy::cast_possible_truncation)]
        Ok(Self {
            model_type,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            moe_intermediate_size: raw.moe_intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            n_shared_experts: raw.n_shared_experts,
            n_routed_experts: raw.n_routed_experts,
            routed_scaling_factor: raw.routed_scaling_factor as f32,
            kv_lora_rank: raw.kv_lora_rank,
            q_lora_rank: raw.q_lora_rank,
            qk_rope_head_dim: raw.qk_rope_head_dim,
            v_head_dim: raw.v_head_dim,
            qk_nope_head_dim: raw.qk_nope_head_dim,
            n_group,
            topk_group,
            num_experts_per_tok: raw.num_experts_per_tok,
            first_k_dense_replace: raw.first_k_dense_replace,
            norm_topk_prob: raw.norm_topk_prob,
            rms_norm_eps: raw.rms_norm_eps as f32,
            tie_word_embeddings: raw.tie_word_embeddings,
            rope_theta: theta,
            yarn,
            mscale_all_dim,
            rope_interleave: raw.rope_interleave.unwrap_or(true),
        })
    }

    /// Whether layer `i` is MoE (`DeepseekV3DecoderLayer`: `layer_idx >= first_k_dense_replace`).
    pub fn is_moe(&self, i: usize) -> bool {
        i >= self.first_k_dense_replace
    }

    /// Indices of the MoE layers.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).filter(|&i| self.is_moe(i)).collect()
    }

    /// Width of one q/k head (`qk_nope_head_dim + qk_rope_head_dim`).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The attention softmax scale: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)²`
    /// under YaRN (`DeepseekV3Attention.scaling`, `yarn_apply_mscale`).
    pub fn softmax_scale(&self) -> f32 {
        #[allow(clippy::cast_precision_loss)]
        let mut s = (self.qk_head_dim() as f64).powf(-0.5);
        if let Some(y) = &self.yarn {
            if self.mscale_all_dim != 0.0 {
                let m = yarn_mscale(y.factor, self.mscale_all_dim);
                s = s * m * m;
            }
        }
        #[allow(clippy::cast_possible_truncation)]
        let s = s as f32;
        s
    }
}

/// Accepts the published quantization schemes (or none): FP8 with 128×128 blocks, and
/// compressed-tensors pack-quantized INT4. Which tensors are quantized is read from the tensors
/// themselves at load.
fn check_quantization(q: Option<&Value>, family: &str) -> Result<(), ModelError> {
    let Some(q) = q.filter(|q| !q.is_null()) else { return Ok(()) };
    let bad = |m: String| Err(ModelError::Config(format!("{family} config: {m}")));
    match q.get("quant_method").and_then(Value::as_str) {
        Some("fp8") => {
            let block = q.get("weight_block_size");
            if block != Some(&serde_json::json!([128, 128])) {
                return bad(format!(
                    "quantization_config.weight_block_size {} is not supported (sluice reads \
                     128×128 FP8 blocks, as DeepSeek publishes them)",
                    block.map_or("absent".into(), ToString::to_string)
                ));
            }
            Ok(())
        }
        Some("compressed-tensors") => {
            if let Some(f) = q.get("format").and_then(Value::as_str) {
                if f != "pack-quantized" {
                    return bad(format!(
                        "compressed-tensors format {f:?} is not supported (pack-quantized)"
                    ));
                }
            }
            Ok(())
        }
        other => bad(format!(
            "quantization_config.quant_method {} is not supported (fp8 or compressed-tensors)",
            other.map_or("absent".into(), |s| format!("{s:?}"))
        )),
    }
}

fn num(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    fam: &str,
) -> Result<Option<f64>, ModelError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            ModelError::Config(format!("{fam} config: rope {key} {v} is not a number"))
        }),
    }
}

/// θ, YaRN (or none) and `mscale_all_dim` from `rope_parameters` or `rope_theta` + `rope_scaling`.
fn rope(raw: &Raw, fam: &str) -> Result<(f64, Option<Yarn>, f64), ModelError> {
    let bad = |m: String| Err(ModelError::Config(format!("{fam} config: {m}")));
    let params = raw
        .rope_parameters
        .as_ref()
        .filter(|v| !v.is_null())
        .or(raw.rope_scaling.as_ref().filter(|v| !v.is_null()));
    let empty = serde_json::Map::new();
    let obj = match params {
        None => &empty,
        Some(p) => match p.as_object() {
            Some(o) => o,
            None => return bad(format!("rope parameters must be an object, got {p}")),
        },
    };
    let theta = num(obj, "rope_theta", fam)?.or(raw.rope_theta).unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 1.0) {
        return bad(format!("rope_theta {theta} must be a finite number above 1"));
    }
    let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str);
    match kind {
        None | Some("default") => return Ok((theta, None, 0.0)),
        Some("yarn") => {}
        Some(k) => return bad(format!("rope_type {k:?} is not supported (default or yarn)")),
    }
    let Some(orig) = num(obj, "original_max_position_embeddings", fam)? else {
        return bad("yarn needs original_max_position_embeddings".into());
    };
    let Some(factor) = num(obj, "factor", fam)? else {
        return bad("yarn needs factor".into());
    };
    if !(factor.is_finite() && factor >= 1.0 && orig.is_finite() && orig > 0.0) {
        return bad(format!(
            "yarn factor {factor} / original_max_position_embeddings {orig} are out of range"
        ));
    }
    let mscale = num(obj, "mscale", fam)?.unwrap_or(0.0);
    let mscale_all_dim = num(obj, "mscale_all_dim", fam)?.unwrap_or(0.0);
    // _compute_yarn_parameters: attention_factor = mscale(f, mscale) / mscale(f, mscale_all_dim)
    // when both are set (and non-zero), else mscale(f).
    let attention_factor = match num(obj, "attention_factor", fam)? {
        Some(a) => a,
        None if mscale != 0.0 && mscale_all_dim != 0.0 => {
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        }
        None => yarn_mscale(factor, 1.0),
    };
    let beta = |k: &str, d: f64| {
        Ok::<f64, ModelError>(num(obj, k, fam)?.filter(|&b| b != 0.0).unwrap_or(d))
    };
    let yarn = Yarn {
        factor,
        beta_fast: beta("beta_fast", 32.0)?,
        beta_slow: beta("beta_slow", 1.0)?,
        original_max_position_embeddings: orig,
        truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        attention_factor,
    };
    Ok((theta, Some(yarn), mscale_all_dim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 200,
            "intermediate_size": 160, "moe_intermediate_size": 48, "num_hidden_layers": 3,
            "num_attention_heads": 4, "n_routed_experts": 16, "kv_lora_rank": 64,
            "q_lora_rank": 96, "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 32,
            "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1}
        })
    }

    fn err(v: &Value) -> String {
        DeepseekV3Config::from_json(v).expect_err("must be refused").to_string()
    }

    #[test]
    fn yarn_scales_the_softmax_by_mscale_all_dim_squared() {
        let c = DeepseekV3Config::from_json(&base()).expect("parses");
        let m = 0.1 * 40f64.ln() + 1.0;
        #[allow(clippy::cast_possible_truncation)]
        let want = (48f64.powf(-0.5) * m * m) as f32;
        assert_eq!(c.softmax_scale(), want);
        assert_eq!(c.yarn.as_ref().map(|y| y.attention_factor), Some(1.0));
        assert_eq!(c.moe_layers(), [1, 2]);
        assert!(c.rope_interleave);
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let mut v = base();
        v["n_group"] = json!(3);
        assert!(err(&v).contains("n_group 3"), "{}", err(&v));
        let mut v = base();
        v["scoring_func"] = json!("softmax");
        assert!(err(&v).contains("scoring_func"));
        let mut v = base();
        v["model_type"] = json!("deepseek_v2");
        assert!(err(&v).contains("deepseek_v2"));
        let mut v = base();
        v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [64, 64]});
        assert!(err(&v).contains("weight_block_size"));
        let mut v = base();
        v["model_type"] = json!("kimi_k2");
        v["num_experts_per_tok"] = json!(9);
        assert!(err(&v).starts_with("invalid model config: kimi_k2 config"), "{}", err(&v));
    }
}
