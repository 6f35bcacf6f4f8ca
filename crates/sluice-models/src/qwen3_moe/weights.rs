//! The Qwen3-MoE tensor roster: every tensor of the checkpoint resolved once at load into typed
//! handles, with dtype and shape checked against the config, and the expert count of every MoE
//! layer checked against `num_experts`. A checkpoint that contradicts its config fails here with
//! the family, the tensor and the shard file named; the forward pass never formats a name.
//!
//! Names follow the published checkpoints (Qwen3-30B-A3B, 235B-A22B; transformers 5.x merges the
//! experts into `gate_up_proj` / `down_proj` only in memory):
//!
//! | tensor | shape |
//! |---|---|
//! | `model.embed_tokens.weight` | `[vocab, d]` |
//! | `model.layers.{i}.{input,post_attention}_layernorm.weight` | `[d]` |
//! | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `{q,k}_norm.weight` | as Qwen3 dense |
//! | `model.layers.{i}.mlp.gate.weight` (MoE layers) | `[E, d]` router |
//! | `model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight` | `[I_moe, d]` |
//! | `model.layers.{i}.mlp.experts.{e}.down_proj.weight` | `[d, I_moe]` |
//! | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` (dense layers) | `[I, d]` ×2, `[d, I]` |
//! | `model.norm.weight` | `[d]` |
//! | `lm_head.weight` | `[vocab, d]`, absent when `tie_word_embeddings` |
//!
//! Experts are bf16 as published. They are checked here with the rest, but the model reads them
//! through an expert store (mapped in place, or streamed from the shards) over
//! [`Qwen3MoeExpertLayout`], so no handle to them is kept.

use super::config::Qwen3MoeConfig;
use crate::qwen3::weights::{in_family, AttnWeights, Linear, Roster};
use crate::{spine, ModelError};
use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use sluice_store::{ExpertLayout, ExpertPart, SpineIndex};

/// The family name errors carry.
pub(crate) const FAMILY: &str = "qwen3_moe";

/// One routed expert (`Qwen3MoeMLP` of width `moe_intermediate_size`).
#[derive(Debug)]
pub struct Expert {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// The feed-forward half of a layer.
#[derive(Debug)]
pub enum Ffn {
    /// `Qwen3MoeMLP` (a `mlp_only_layers` layer or one `decoder_sparse_step` skips); boxed so
    /// that a layer's `Ffn` is as small as the MoE variant.
    Dense(Box<Expert>),
    /// `Qwen3MoeSparseMoeBlock`: the router `[E, d]` (`mlp.gate.weight`); the experts
    /// (`mlp.experts.{e}`) come from the expert store.
    Moe {
        /// `mlp.gate.weight`.
        router: Linear,
    },
}

/// One decoder layer (`Qwen3MoeDecoderLayer`).
#[derive(Debug)]
pub struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) attn: AttnWeights,
    pub(crate) ffn: Ffn,
}

/// Every tensor of the model.
#[derive(Debug)]
pub struct Qwen3MoeWeights {
    pub(crate) embed: Linear,
    /// `lm_head.weight`, or the embedding again when tied.
    pub(crate) lm_head: Linear,
    pub(crate) norm: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
}

impl Qwen3MoeWeights {
    /// Resolves and checks every tensor the config names.
    pub fn load(ckpt: &Checkpoint, c: &Qwen3MoeConfig) -> Result<Self, ModelError> {
        Self::load_inner(ckpt, c).map_err(in_family(FAMILY))
    }

    fn load_inner(ckpt: &Checkpoint, c: &Qwen3MoeConfig) -> Result<Self, ModelError> {
        let r = Roster { ckpt, prefix: ckpt.name_prefix() };
        let b = &c.base;
        let d = b.hidden_size;
        let mut layers = Vec::with_capacity(b.num_hidden_layers);
        for i in 0..b.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let ffn = if c.is_moe(i) {
                check_expert_count(&r, &p, c)?;
                let router = r.mat(&format!("{p}.mlp.gate.weight"), c.num_experts, d)?;
                // Checked here, in roster order, so a bad expert tensor is named like any other;
                // the store resolves them again from the layout. Located, not mapped: a stream
                // install's routed experts are holes its checkpoint does not map.
                let (inter, d64) = (c.moe_intermediate_size as u64, d as u64);
                for e in 0..c.num_experts {
                    for (n, shape) in
                        [("gate", [inter, d64]), ("up", [inter, d64]), ("down", [d64, inter])]
                    {
                        let name = format!("{}{p}.mlp.experts.{e}.{n}_proj.weight", r.prefix);
                        r.ckpt.locate(&name, DType::BF16, &shape)?;
                    }
                }
                Ffn::Moe { router }
            } else {
                Ffn::Dense(Box::new(expert(&r, &format!("{p}.mlp"), b.intermediate_size, d)?))
            };
            layers.push(LayerWeights {
                input_norm: r.vec(&format!("{p}.input_layernorm.weight"), d)?,
                post_norm: r.vec(&format!("{p}.post_attention_layernorm.weight"), d)?,
                attn: AttnWeights::load(&r, &p, b)?,
                ffn,
            });
        }
        let (embed, lm_head, norm) = r.ends(b.vocab_size, d, b.tie_word_embeddings)?;
        Ok(Self { embed, lm_head, norm, layers })
    }

    /// Bytes of the non-expert weight matrices a pass reads (attention, dense MLPs, routers,
    /// embedding, an untied lm_head).
    pub fn dense_byte_len(&self, tied: bool) -> u64 {
        let layer: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.attn.byte_len()
                    + match &l.ffn {
                        Ffn::Dense(m) => m.byte_len(),
                        Ffn::Moe { router } => router.byte_len(),
                    }
            })
            .sum();
        layer + self.embed.byte_len() + if tied { 0 } else { self.lm_head.byte_len() }
    }
}

impl Qwen3MoeWeights {
    /// The spine pieces in pass order (embedding; per layer its attention projections and its
    /// dense MLP or router; the head) over `ckpt`'s shards, for placing the spine piece by piece.
    pub fn spine_index(&self, ckpt: &Checkpoint) -> Result<SpineIndex, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let mut m: Vec<&Linear> = l.attn.mats().to_vec();
                match &l.ffn {
                    Ffn::Dense(x) => m.extend([&x.gate, &x.up, &x.down]),
                    Ffn::Moe { router } => m.push(router),
                }
                m.into_iter().flat_map(spine::ranges).collect()
            })
            .collect();
        spine::index(ckpt, &self.embed, layers, &self.lm_head)
    }

    /// Bytes of the f32 vectors the model keeps whatever the spine placement (the norms).
    pub fn small_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| (l.input_norm.len() + l.post_norm.len()) as u64 * 4 + l.attn.small_bytes())
            .sum();
        layers + self.norm.len() as u64 * 4
    }
}

/// The layout of one Qwen3-MoE routed expert for the expert store: `gate_proj`, `up_proj`
/// (`[I_moe, d]`) and `down_proj` (`[d, I_moe]`), bf16 as published, whole tensors.
#[derive(Debug, Clone, Copy)]
pub struct Qwen3MoeExpertLayout {
    /// `moe_intermediate_size`.
    pub inter: u64,
    /// `hidden_size`.
    pub hidden: u64,
}

impl Qwen3MoeExpertLayout {
    /// Bytes of one expert.
    pub fn expert_bytes(&self) -> u64 {
        3 * self.inter * self.hidden * DType::BF16.size()
    }
}

impl ExpertLayout for Qwen3MoeExpertLayout {
    fn parts(&self, layer: usize, expert: usize) -> Vec<ExpertPart> {
        let p = format!("model.layers.{layer}.mlp.experts.{expert}");
        let (i, d) = (self.inter, self.hidden);
        [("gate_proj", [i, d]), ("up_proj", [i, d]), ("down_proj", [d, i])]
            .into_iter()
            .map(|(n, shape)| ExpertPart::whole(format!("{p}.{n}.weight"), DType::BF16, &shape))
            .collect()
    }
}

impl Expert {
    /// Bytes of the three projections.
    pub fn byte_len(&self) -> u64 {
        self.gate.byte_len() + self.up.byte_len() + self.down.byte_len()
    }
}

/// `{p}.{gate,up,down}_proj.weight` of width `inter`.
fn expert(r: &Roster<'_>, p: &str, inter: usize, d: usize) -> Result<Expert, ModelError> {
    Ok(Expert {
        gate: r.mat(&format!("{p}.gate_proj.weight"), inter, d)?,
        up: r.mat(&format!("{p}.up_proj.weight"), inter, d)?,
        down: r.mat(&format!("{p}.down_proj.weight"), d, inter)?,
    })
}

/// Refuses a layer whose experts in the checkpoint are not exactly `0 .. num_experts`: a config
/// that claims more experts than the files hold, or fewer (the extra experts would silently never
/// be routed to, and the router's shape is the only other witness).
fn check_expert_count(r: &Roster<'_>, p: &str, c: &Qwen3MoeConfig) -> Result<(), ModelError> {
    let name = |e: usize| format!("{}{p}.mlp.experts.{e}.gate_proj.weight", r.prefix);
    let present = (0..=c.num_experts).take_while(|&e| r.ckpt.get(&name(e)).is_some()).count();
    if present == c.num_experts {
        return Ok(());
    }
    let (what, tensor) = if present < c.num_experts {
        ("is missing", name(present))
    } else {
        ("exists past the last expert", name(c.num_experts))
    };
    Err(ModelError::Config(format!(
        "{FAMILY}: config.json says num_experts = {} but the checkpoint has {} experts in \
         {p}: tensor {tensor} {what}",
        c.num_experts,
        if present > c.num_experts {
            format!("more than {}", c.num_experts)
        } else {
            present.to_string()
        },
    )))
}
