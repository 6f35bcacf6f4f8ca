//! Kimi K3 behind the family boundary: [`crate::family::FamilyModel`] through
//! [`crate::family::family_model`], which forwards to the inherent methods (its shape and its
//! memory needs, from the inventory, are written here), and the table line's check, which stops
//! short of mapping the routed experts (a stream install has none).

use super::config::{AttnKind, K3Config};
use super::inventory::inventory;
use super::state::{K3State, LayerShape};
use super::working::{pass_bytes_per_row, prefill_bytes_per_row};
use super::{weights::K3Weights, KimiK3};
use crate::family::{self, family_model, Checked, MemoryNeeds, Shape};
use crate::{ModelError, StateShape};
use sluice_checkpoint::Checkpoint;

/// Kimi K3's line of [`crate::check`]: config, the routed experts' index and the spine, in the
/// order loading for `run` meets them (so both name the same first problem), never mapping the
/// routed experts.
pub fn check(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    let family = family::of(ckpt)?;
    let cfg = K3Config::from_json(ckpt.config().text_config())?;
    KimiK3::expert_index(ckpt, &cfg)?;
    K3Weights::load(ckpt, &cfg)?;
    Ok(Checked { family, k3: Some(Box::new(cfg)) })
}

impl KimiK3 {
    /// What the model holds besides its expert cache, from the inventory: the spine, the KDA
    /// states and the W_UK rows each thread keeps widened for MLA's parts (fixed), the MLA
    /// latents (per position), and the working memory of a pass row.
    pub fn memory_needs(&self) -> MemoryNeeds {
        let c = self.config();
        let inv = inventory(&self.ckpt, c);
        let threads = sluice_kernels::pool::with_current(sluice_kernels::pool::Pool::threads);
        let mla = (0..c.num_hidden_layers).any(|i| c.attn_kind(i) == AttnKind::Mla);
        let w_uk = crate::latent_parts::widened_bytes(
            threads,
            c.num_attention_heads,
            c.qk_nope_head_dim,
            c.kv_lora_rank,
        );
        MemoryNeeds {
            spine: inv.spine_bytes,
            state_fixed: inv.kda_state_bytes + if mla { w_uk } else { 0 },
            state_per_position: inv.mla_bytes_per_token,
            pass_per_row: pass_bytes_per_row(self.config()),
            prefill_per_row: prefill_bytes_per_row(self.config()),
        }
    }
}

family_model!(placed KimiK3, "kimi_k3", K3State;
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_attention_heads,
            experts_per_token: c.num_experts_per_token,
        }
    }
    fn state_shape(&self) -> StateShape {
        crate::snapshot::k3_shape_of(&LayerShape::of_config(self.config()), "kimi_k3")
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        KimiK3::spine_bytes_per_pass(self)
    }
);
