//! What a Kimi K3 checkpoint holds, by kind, and what that means for memory: the spine (all
//! that every pass sweeps) against the routed experts (read only when selected).

use super::config::K3Config;
use serde::Serialize;
use sluice_checkpoint::Checkpoint;
use std::collections::BTreeMap;

/// Tensor counts and bytes per kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Inventory {
    /// Kind → (tensors, bytes).
    pub kinds: BTreeMap<&'static str, (u64, u64)>,
    /// Bytes of one routed expert (0 if none).
    pub expert_bytes: u64,
    /// Routed experts in the checkpoint.
    pub experts: u64,
    /// Bytes every pass needs besides routed experts (everything else in the language model).
    pub spine_bytes: u64,
    /// Bytes of routed experts.
    pub routed_bytes: u64,
    /// Bytes of tensors outside the language model (vision tower, projector).
    pub other_bytes: u64,
    /// KDA state bytes per sequence (f32 recurrent matrices and conv windows).
    pub kda_state_bytes: u64,
    /// MLA latent-cache bytes per token (f32).
    pub mla_bytes_per_token: u64,
    /// Expert bytes one position reads with nothing cached (top-k per MoE layer).
    pub expert_bytes_per_token: u64,
}

/// Classifies a tensor name.
fn kind(name: &str) -> &'static str {
    if !name.starts_with("language_model.")
        && (name.contains("vision") || name.contains("mm_projector"))
    {
        "vision"
    } else if name.contains(".experts.") && !name.contains("shared_experts") {
        "routed experts"
    } else if name.contains("embed_tokens") {
        "embedding"
    } else if name.contains("lm_head") {
        "lm_head"
    } else if name.contains("shared_experts") {
        "shared experts"
    } else if name.contains("block_sparse_moe.gate") {
        "router"
    } else if name.contains("routed_expert_") {
        "latent projections"
    } else if name.contains("self_attn") {
        "attention"
    } else if name.contains(".mlp.") {
        "dense mlp"
    } else {
        "norms and attnres"
    }
}

/// Builds the inventory of an opened checkpoint.
pub fn inventory(ckpt: &Checkpoint, c: &K3Config) -> Inventory {
    let mut inv = Inventory::default();
    for e in ckpt.tensors() {
        let k = kind(&e.name);
        let slot = inv.kinds.entry(k).or_default();
        slot.0 += 1;
        slot.1 += e.len;
        match k {
            "routed experts" => inv.routed_bytes += e.len,
            "vision" => inv.other_bytes += e.len,
            _ => inv.spine_bytes += e.len,
        }
    }
    let per_expert_tensors = 6u64;
    let (routed_n, _) = inv.kinds.get("routed experts").copied().unwrap_or_default();
    inv.experts = routed_n / per_expert_tensors;
    inv.expert_bytes = inv.routed_bytes.checked_div(inv.experts).unwrap_or(0);
    let la = &c.linear_attn_config;
    let kk = la.short_conv_kernel_size as u64;
    let (mut kda, mut mla, mut moe) = (0u64, 0u64, 0u64);
    for i in 0..c.num_hidden_layers {
        match c.attn_kind(i) {
            super::config::AttnKind::Kda => kda += 1,
            super::config::AttnKind::Mla => mla += 1,
        }
        if c.is_moe(i) {
            moe += 1;
        }
    }
    let h = la.num_heads as u64;
    let dd = la.head_dim as u64;
    inv.kda_state_bytes = kda * 4 * (2 * h * dd * dd + 2 * (kk - 1) * 3 * h * dd);
    inv.mla_bytes_per_token = mla * 4 * (c.kv_lora_rank + c.qk_rope_head_dim) as u64;
    inv.expert_bytes_per_token = moe * c.num_experts_per_token as u64 * inv.expert_bytes;
    inv
}
