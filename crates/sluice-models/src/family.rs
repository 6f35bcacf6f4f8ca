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
use std::collections::{BTreeMap, BTreeSet};
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

/// Where the routed experts of a model with config `config` are, from the config alone (no
/// shard is opened): what `sluice pull --stream` and stream installs need to tell routed
/// experts from the spine. `None` for a family without routed experts, or one that has no
/// expert layout yet. A family adds its arm here when it gains a layout; nothing else changes.
pub fn routed_for_config(
    config: &sluice_checkpoint::CheckpointConfig,
) -> Result<Option<RoutedExperts>, ModelError> {
    let arch = config.architecture().to_owned();
    let family = FAMILIES
        .iter()
        .find(|f| f.architectures.contains(&arch.as_str()))
        .ok_or_else(|| ModelError::UnknownArchitecture { arch, supported: supported() })?;
    let text = config.text_config();
    Ok(match family.name {
        "kimi_k3" => Some(crate::kimi_k3::KimiK3::routed(
            &crate::kimi_k3::config::K3Config::from_json(text)?,
        )),
        "qwen3_moe" => Some(crate::qwen3_moe::Qwen3Moe::routed(
            &crate::qwen3_moe::config::Qwen3MoeConfig::from_json(text)?,
        )),
        "gpt_oss" => Some(crate::gpt_oss::GptOss::routed(
            &crate::gpt_oss::config::GptOssConfig::from_json(text)?,
        )),
        _ => None,
    })
}

/// Loads the model `ckpt`'s config names with its routed experts served by `experts` from the
/// start, never mapped in place: for a checkpoint whose routed experts are not mapped (a stream
/// install). A family without an expert layout loads as [`crate::load`] does.
pub fn load_with_experts(
    ckpt: Arc<Checkpoint>,
    experts: Arc<dyn sluice_store::ExpertStore>,
) -> Result<Model, ModelError> {
    Ok(match of(&ckpt)?.name {
        "kimi_k3" => Model::KimiK3(crate::kimi_k3::KimiK3::with_store(ckpt, experts)?),
        "qwen3_moe" => Model::Qwen3Moe(crate::qwen3_moe::Qwen3Moe::with_store(ckpt, experts)?),
        "gpt_oss" => Model::GptOss(crate::gpt_oss::GptOss::with_store(ckpt, experts)?),
        _ => crate::load(ckpt)?,
    })
}

/// Turns next-layer expert prefetch on or off for a model whose family guesses its next MoE
/// layer's experts (worth it when experts stream); a no-op for one that does not.
pub fn set_prefetch(model: &mut Model, on: bool) {
    match model {
        Model::KimiK3(m) => m.set_prefetch(on),
        Model::Qwen3Moe(m) => m.set_prefetch(on),
        Model::GptOss(m) => m.set_prefetch(on),
        _ => {}
    }
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

    /// The tensors (names without a checkpoint's name prefix) that hold routed experts and
    /// nothing else: every part of every expert, whole tensors (Kimi K3, Qwen3-MoE) and the
    /// experts' slices of stacked `[E, ...]` tensors (GPT-OSS) alike. A tensor is listed only
    /// when its experts' parts cover all of its bytes; a tensor that holds routed-expert bytes
    /// beside other bytes is refused, since a stream install keeps routed experts as holes it
    /// fills and punches while the spine beside them must stay.
    pub fn routed_tensors(&self) -> Result<BTreeSet<String>, ModelError> {
        // Tensor → (its length, the expert ranges inside it).
        let mut cover: BTreeMap<String, (u64, Vec<std::ops::Range<u64>>)> = BTreeMap::new();
        for &layer in &self.moe_layers {
            for e in 0..self.per_layer {
                for p in self.layout.parts(layer, e) {
                    let len = p.shape.iter().product::<u64>() * p.dtype.size();
                    cover.entry(p.tensor.clone()).or_insert((len, Vec::new())).1.push(p.range);
                }
            }
        }
        let mut out = BTreeSet::new();
        for (name, (len, mut ranges)) in cover {
            ranges.sort_by_key(|r| r.start);
            let mut end = 0;
            for r in &ranges {
                if r.start > end {
                    break;
                }
                end = end.max(r.end);
            }
            if end < len {
                return Err(ModelError::Config(format!(
                    "tensor {name}: routed experts cover bytes 0..{end} of {len}; a tensor must \
                     hold routed experts only, or none"
                )));
            }
            out.insert(name);
        }
        Ok(out)
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
