//! Kimi K3 text configuration (`text_config` of the released `config.json`, or the bare text
//! config), read into typed fields and checked for internal consistency once at load.
//! Field names follow the checkpoint (see K3.md §1.2); mlx-lm's `TextArgs` uses the same names.

use crate::ModelError;
use serde::Deserialize;

/// KDA (linear attention) settings, `linear_attn_config`.
#[derive(Debug, Clone, Deserialize)]
pub struct LinearAttnConfig {
    /// 1-based indices of KDA layers (layer `i` is KDA iff `i + 1` is listed).
    pub kda_layers: Vec<usize>,
    /// 1-based indices of full-attention (MLA) layers.
    #[serde(default)]
    pub full_attn_layers: Vec<usize>,
    /// KDA heads.
    pub num_heads: usize,
    /// KDA head dimension (K = V).
    pub head_dim: usize,
    /// Causal depthwise conv kernel on q, k, v.
    #[serde(default = "default_conv")]
    pub short_conv_kernel_size: usize,
    /// One full-rank output gate projection (`g_proj`).
    #[serde(default)]
    pub use_full_rank_gate: bool,
    /// Lower bound of the "safe" gate: decay = lb · σ(...).
    pub gate_lower_bound: Option<f32>,
}

fn default_conv() -> usize {
    4
}

/// The typed Kimi K3 text configuration.
#[derive(Debug, Clone, Deserialize)]
pub struct K3Config {
    /// Vocabulary rows of the embedding and lm_head.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    /// Dense (layer 0) MLP width.
    pub intermediate_size: usize,
    /// Epsilon of every norm except the MLA low-rank norms (1e-6, K3.md §0.2).
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// KDA settings.
    pub linear_attn_config: LinearAttnConfig,
    /// Must be "situ".
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// SiTU gate clip β (None means 1.0).
    pub activation_situ_beta: Option<f32>,
    /// SiTU up clip β_lin (None means no clip).
    pub activation_situ_linear_beta: Option<f32>,
    /// AttnRes block size.
    pub attn_res_block_size: Option<usize>,
    /// MLA query low rank.
    pub q_lora_rank: usize,
    /// MLA key/value latent rank.
    pub kv_lora_rank: usize,
    /// MLA per-head non-positional q/k width.
    pub qk_nope_head_dim: usize,
    /// MLA shared "rope" width (never rotated in K3).
    pub qk_rope_head_dim: usize,
    /// MLA value width per head.
    pub v_head_dim: usize,
    /// Must be true for K3 (no RoPE).
    #[serde(default = "default_true")]
    pub mla_use_nope: bool,
    /// Sigmoid output gate before `o_proj`.
    #[serde(default)]
    pub mla_use_output_gate: bool,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts selected per token.
    pub num_experts_per_token: usize,
    /// Shared experts (fused into one MLP of width `n · moe_intermediate_size`).
    #[serde(default)]
    pub num_shared_experts: usize,
    /// Per-expert FFN width.
    pub moe_intermediate_size: usize,
    /// Router activation; must be "sigmoid".
    #[serde(default = "default_sigmoid")]
    pub moe_router_activation_func: String,
    /// Renormalise the top-k weights to sum 1.
    #[serde(default = "default_true")]
    pub moe_renormalize: bool,
    /// Multiplier on the top-k weights.
    #[serde(default = "default_one")]
    pub routed_scaling_factor: f32,
    /// Layers `< first_k_dense_replace` use the dense MLP.
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// MoE every `moe_layer_freq` layers.
    #[serde(default = "default_freq")]
    pub moe_layer_freq: usize,
    /// Expert groups (K3: 1, so group routing is a no-op).
    #[serde(default = "default_freq")]
    pub num_expert_group: usize,
    /// Groups kept (K3: 1).
    #[serde(default = "default_freq")]
    pub topk_group: usize,
    /// Latent MoE width: experts run at this width.
    pub routed_expert_hidden_size: Option<usize>,
    /// RMSNorm on the aggregated latent routed output.
    #[serde(default)]
    pub latent_moe_use_norm: bool,
    /// Must be false for K3.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// MTP heads; K3 has none and sluice ignores them.
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
}

fn default_eps() -> f32 {
    1e-5
}
fn default_act() -> String {
    "situ".into()
}
fn default_sigmoid() -> String {
    "sigmoid".into()
}
fn default_true() -> bool {
    true
}
fn default_one() -> f32 {
    1.0
}
fn default_freq() -> usize {
    1
}

/// Which attention a layer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Kimi Delta Attention (linear, recurrent state).
    Kda,
    /// Gated NoPE multi-head latent attention.
    Mla,
}

impl K3Config {
    /// Parses and checks a text-config JSON value.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, ModelError> {
        let c: Self = serde_json::from_value(v.clone())
            .map_err(|e| ModelError::Config(format!("kimi_k3 text config: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.hidden_act != "situ" {
            return bad(format!(
                "hidden_act {:?} is not supported (kimi_k3 uses \"situ\")",
                self.hidden_act
            ));
        }
        if self.moe_router_activation_func != "sigmoid" {
            return bad(format!(
                "moe_router_activation_func {:?} is not supported",
                self.moe_router_activation_func
            ));
        }
        if !self.mla_use_nope {
            return bad("mla_use_nope = false (RoPE MLA) is not a Kimi K3 configuration".into());
        }
        if self.tie_word_embeddings {
            return bad("tie_word_embeddings = true contradicts Kimi K3 (untied lm_head)".into());
        }
        if self.num_expert_group != 1 || self.topk_group != 1 {
            return bad(format!(
                "grouped routing (num_expert_group {}, topk_group {}) is not supported for kimi_k3",
                self.num_expert_group, self.topk_group
            ));
        }
        let n = self.num_hidden_layers;
        for &l in &self.linear_attn_config.kda_layers {
            if l == 0 || l > n {
                return bad(format!("linear_attn_config.kda_layers lists {l}, outside 1..={n}"));
            }
        }
        for &l in &self.linear_attn_config.full_attn_layers {
            if l == 0 || l > n || self.linear_attn_config.kda_layers.contains(&l) {
                return bad(format!("linear_attn_config.full_attn_layers lists {l}, outside 1..={n} or also a KDA layer"));
            }
        }
        if self.num_experts_per_token == 0 || self.num_experts_per_token > self.num_experts {
            return bad(format!(
                "num_experts_per_token {} must be in 1..={}",
                self.num_experts_per_token, self.num_experts
            ));
        }
        if self.moe_layer_freq == 0 || self.attn_res_block_size == Some(0) {
            return bad("moe_layer_freq and attn_res_block_size must be positive".into());
        }
        let lat = self.expert_width();
        if !lat.is_multiple_of(32) || !self.moe_intermediate_size.is_multiple_of(32) {
            return bad(format!(
                "MXFP4 experts need widths divisible by 32 (latent {lat}, moe_intermediate_size {})",
                self.moe_intermediate_size
            ));
        }
        if self.linear_attn_config.short_conv_kernel_size == 0 {
            return bad("short_conv_kernel_size must be positive".into());
        }
        Ok(())
    }

    /// Attention kind of 0-based layer `i` (KDA iff `i + 1` is in `kda_layers`; K3.md §8.1).
    pub fn attn_kind(&self, i: usize) -> AttnKind {
        if self.linear_attn_config.kda_layers.contains(&(i + 1)) {
            AttnKind::Kda
        } else {
            AttnKind::Mla
        }
    }

    /// Whether 0-based layer `i` has routed experts (mlx-lm `KimiK3DecoderLayer`).
    pub fn is_moe(&self, i: usize) -> bool {
        self.num_experts > 0
            && i >= self.first_k_dense_replace
            && i.is_multiple_of(self.moe_layer_freq)
    }

    /// Width the routed experts run at (the latent width, or the hidden size).
    pub fn expert_width(&self) -> usize {
        self.routed_expert_hidden_size.unwrap_or(self.hidden_size)
    }

    /// KDA projection width `heads · head_dim`.
    pub fn kda_proj(&self) -> usize {
        self.linear_attn_config.num_heads * self.linear_attn_config.head_dim
    }

    /// MLA per-head q/k width.
    pub fn mla_qk_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// SiTU gate β (None → 1.0, as mlx-lm).
    pub fn situ_beta(&self) -> f32 {
        self.activation_situ_beta.unwrap_or(1.0)
    }
}
