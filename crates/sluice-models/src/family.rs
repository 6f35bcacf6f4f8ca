//! The family boundary: what the rest of sluice (the store, the planner, stream installs, the
//! commands) may know about a model, without naming its family.
//!
//! - [`FAMILIES`], the family table: one line per family, keyed by `config.json`'s
//!   `architectures`, with the function that loads it. Adding a family is one folder in this
//!   crate and one line here (docs/ADDING_A_FAMILY.md).
//! - [`RoutedExperts`]: where a model's routed experts are (its MoE layers, experts per layer,
//!   the [`ExpertLayout`] that lists each expert's parts), from which any expert store opens.
//! - [`MemoryNeeds`]: what a model holds besides its expert cache, for the memory plan.
//!
//! The per-family operations (new state, forward over T rows, commit / rollback, attaching a
//! store) are the methods of [`crate::Model`] and [`crate::State`], which dispatch here once.

use crate::{Model, ModelError};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_store::{
    ExpertIndex, ExpertLayout, MappedExperts, StoreError, StreamingConfig, StreamingExperts,
};
use std::sync::Arc;

/// One line of the family table.
#[derive(Debug)]
pub struct Family {
    /// The family's name (`kimi_k3`, `qwen3_moe`, ...): its folder in this crate.
    pub name: &'static str,
    /// What people call it, for messages.
    pub display: &'static str,
    /// The `architectures` strings of `config.json` that select it.
    pub architectures: &'static [&'static str],
    /// Whether the engine places its spine piece by piece (resident prefix, streamed rest);
    /// otherwise the spine is mapped whole and only the routed experts are planned.
    pub places_spine: bool,
    /// Loads a checkpoint of this family (experts mapped in place until a store is attached).
    pub load: fn(Arc<Checkpoint>) -> Result<Model, ModelError>,
}

/// Every supported family, one line each.
#[rustfmt::skip]
pub const FAMILIES: &[Family] = &[
    Family { name: "kimi_k3", display: "Kimi K3", architectures: &["KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"], places_spine: true, load: |c| Ok(Model::KimiK3(crate::kimi_k3::KimiK3::load(c)?)) },
    Family { name: "qwen3", display: "Qwen3", architectures: &["Qwen3ForCausalLM"], places_spine: false, load: |c| Ok(Model::Qwen3(crate::qwen3::Qwen3::load(c)?)) },
    Family { name: "qwen3_moe", display: "Qwen3-MoE", architectures: &["Qwen3MoeForCausalLM"], places_spine: false, load: |c| Ok(Model::Qwen3Moe(crate::qwen3_moe::Qwen3Moe::load(c)?)) },
    Family { name: "gpt_oss", display: "GPT-OSS", architectures: &["GptOssForCausalLM"], places_spine: false, load: |c| Ok(Model::GptOss(crate::gpt_oss::GptOss::load(c)?)) },
    Family { name: "deepseek_v3", display: "DeepSeek V3/R1, Kimi K2", architectures: &["DeepseekV3ForCausalLM"], places_spine: false, load: |c| Ok(Model::DeepseekV3(crate::deepseek_v3::DeepseekV3::load(c)?)) },
];

/// The supported architectures, for an error message: `A, B (Kimi K3), C (Qwen3), ...`.
pub fn supported() -> String {
    FAMILIES
        .iter()
        .map(|f| format!("{} ({})", f.architectures.join(", "), f.display))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The family `config.json` of `ckpt` names (its first `architectures` entry).
pub fn of(ckpt: &Checkpoint) -> Result<&'static Family, ModelError> {
    let archs = ckpt.config().architectures();
    let arch = archs.first().cloned().unwrap_or_default();
    FAMILIES
        .iter()
        .find(|f| f.architectures.contains(&arch.as_str()))
        .ok_or_else(|| ModelError::UnknownArchitecture { arch, supported: supported() })
}

/// Where a model's routed experts are, for opening an expert store over them.
#[derive(Debug, Clone)]
pub struct RoutedExperts {
    /// Decoder layers of the model.
    pub num_layers: usize,
    /// The layers with routed experts.
    pub moe_layers: Vec<usize>,
    /// Routed experts per MoE layer.
    pub per_layer: usize,
    /// The parts of each expert.
    pub layout: Arc<dyn ExpertLayout>,
    /// Bytes of one expert (its parts).
    pub expert_bytes: u64,
}

impl RoutedExperts {
    /// Routed experts over all layers.
    pub fn total(&self) -> u64 {
        (self.moe_layers.len() * self.per_layer) as u64
    }

    /// A store serving them in place from `ckpt`'s map.
    pub fn mapped(&self, ckpt: Arc<Checkpoint>) -> Result<MappedExperts, StoreError> {
        MappedExperts::open(
            ckpt,
            self.num_layers,
            &self.moe_layers,
            self.per_layer,
            self.layout.as_ref(),
        )
    }

    /// Where every one of them is in `ckpt`'s shard files (mapped or not).
    pub fn index(&self, ckpt: &Checkpoint) -> Result<ExpertIndex, StoreError> {
        ExpertIndex::build(
            ckpt,
            self.num_layers,
            &self.moe_layers,
            self.per_layer,
            self.layout.as_ref(),
        )
    }

    /// A store streaming them from `ckpt`'s shards through the cache `config` describes,
    /// charged to `budget`.
    pub fn streaming(
        &self,
        ckpt: &Checkpoint,
        config: &StreamingConfig,
        budget: &MemoryBudget,
    ) -> Result<StreamingExperts, StoreError> {
        StreamingExperts::open(
            ckpt,
            self.num_layers,
            &self.moe_layers,
            self.per_layer,
            self.layout.as_ref(),
            config,
            budget,
        )
    }
}

/// What a model holds in memory besides its expert cache, for the memory plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeeds {
    /// Bytes of the spine (every weight but the routed experts).
    pub spine: u64,
    /// Sequence-state bytes that do not grow with the context.
    pub state_fixed: u64,
    /// Sequence-state bytes per position.
    pub state_per_position: u64,
    /// Working memory of a pass per row (activations, a logits row).
    pub pass_per_row: u64,
}

impl MemoryNeeds {
    /// Sequence-state bytes for `context` positions.
    pub fn state(&self, context: usize) -> u64 {
        self.state_fixed + self.state_per_position * context as u64
    }
}

/// The shape of a model, for `inspect` and messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Routed experts chosen per position (0 for a dense model).
    pub experts_per_token: usize,
}
