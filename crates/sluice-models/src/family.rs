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
//! - [`FamilyModel`]: what a loaded model of a family does (new state, forward over T rows,
//!   shape, routed experts, memory needs, attaching a store, its spine pieces). Each family
//!   implements it in its folder's `boundary.rs` with [`family_model!`], which forwards what
//!   every family forwards to its inherent methods, so the family writes only what is its own;
//!   [`crate::Model`] holds one boxed and dispatches once per call (a pass is one call, never
//!   one per row).
//! - [`Checked`]: what [`crate::check`] found, through the table line's `check`.
//! - The pieces every family's forward pass shares: the trace recorder and the MoE-layer step
//!   (route, run the experts, roll the state back when the store fails, record the routing).
//!
//! The sequence state's side of the boundary is [`crate::state`].

use crate::kimi_k3::Route;
use crate::{FamilyState, LogitRows, Model, ModelError, State, StateShape};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_store::{
    ExpertIndex, ExpertLayout, ExpertStore, MappedExperts, SpineIndex, SpineStats, SpineStore,
    StoreError, StreamingConfig, StreamingExperts,
};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Per-stage tensors of a pass, for stage-by-stage comparison with goldens (one type shared by
/// every family).
pub use crate::kimi_k3::Trace;

pub use crate::served::Experts;

/// What a loaded model of a family does, behind [`crate::Model`].
///
/// Methods with a default are the ones a dense family (no routed experts) or a family whose
/// spine is mapped whole need not write.
pub trait FamilyModel: Any + Send + Sync + std::fmt::Debug {
    /// The family's name in [`FAMILIES`] (`kimi_k3`, `qwen3_moe`, ...).
    fn family(&self) -> &'static str;
    /// A fresh sequence state, wrapped for this family (`State::new(self.family(), ...)`).
    fn new_state(&self) -> State;
    /// The shape of this model's state snapshots (what the on-disk state cache checks files
    /// against). The default builds a fresh state to ask it; a family whose fresh state is
    /// large (Kimi K3: 0.9 GB of KDA states) derives it from its configuration instead.
    fn state_shape(&self) -> StateShape {
        self.new_state().shape()
    }
    /// Runs one pass of `tokens` after `state`'s committed positions, staging the state until
    /// `commit(n)` / `rollback()`; the family takes its concrete state with
    /// [`State::family_mut`].
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError>;
    /// The model's shape.
    fn shape(&self) -> Shape;
    /// Where the routed experts are (`None`: a dense model, or experts read in place unplanned).
    fn routed_experts(&self) -> Option<RoutedExperts> {
        None
    }
    /// Takes routed experts from `store` from now on (ignored by a model without them).
    fn set_experts(&mut self, _store: Arc<dyn ExpertStore>) {}
    /// Turns next-layer expert prefetch on or off (ignored by a family that does not prefetch).
    fn set_prefetch(&mut self, _on: bool) {}
    /// The expert store in use (`None` for a model without routed experts).
    fn experts(&self) -> Option<&Arc<dyn ExpertStore>> {
        None
    }
    /// What the model holds besides its expert cache, for the memory plan (`None`: planned
    /// another way, or not at all).
    fn memory_needs(&self) -> Option<MemoryNeeds>;
    /// The spine pieces for placing the spine piece by piece, in pass order: the embedding,
    /// one piece per decoder layer, the head (`places_spine` in [`FAMILIES`]); `None` for a
    /// family whose spine is mapped whole.
    fn spine_index(&self) -> Result<Option<SpineIndex>, ModelError> {
        Ok(None)
    }
    /// Bytes of the small vectors the model keeps whatever the spine placement.
    fn spine_small_bytes(&self) -> u64 {
        0
    }
    /// Takes spine bytes from `store` (opened on [`FamilyModel::spine_index`]) instead of the
    /// mapped checkpoint; refused by a family whose spine is mapped whole.
    fn set_spine(&mut self, _store: Arc<SpineStore>) -> Result<(), ModelError> {
        Err(ModelError::Config(format!(
            "{} maps its spine whole: it takes no spine store",
            self.family()
        )))
    }
    /// Spine I/O counters (zero unless the spine is placed by a spine store).
    fn spine_stats(&self) -> SpineStats {
        SpineStats::default()
    }
    /// How the spine's matrices are stored, for the plan line (`bf16` unless the family
    /// publishes another format: DeepSeek-V3's `fp8`, `bf16` or `mixed`).
    fn spine_format(&self) -> &'static str {
        "bf16"
    }
    /// Weight bytes a pass reads besides routed experts (memory traffic, not storage reads).
    fn spine_bytes_per_pass(&self) -> u64;
    /// The model as `Any`, for [`crate::Model::family_ref`].
    fn as_any(&self) -> &dyn Any;
    /// The model as `Any`, for [`crate::Model::family_mut`].
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The model as `Any`, for [`crate::Model::into_family`].
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// Writes a family's `impl FamilyModel`, so that its `boundary.rs` holds only what is its own.
///
/// Every family forwards the same methods to its inherent methods of the same names, and those
/// are written here once: `family` (the table name), `new_state` (wrapped with that name),
/// `forward` (the family's concrete state taken with [`State::family_mut`], so that another
/// family's state is refused), `memory_needs`, and the three `Any` casts. A family with routed
/// experts and a spine placed piece by piece (`placed`) also forwards `routed_experts`,
/// `set_experts`, `set_prefetch`, `experts`, `spine_index`, `spine_small_bytes`, `set_spine`
/// and `spine_stats`; a `served` family (one holding a [`crate::served::Served`]) gets those
/// from [`crate::served::served_methods`] and its `Debug` (layers, experts, top-k) written here;
/// a `dense` family keeps the trait's defaults for those. The methods after
/// the `;` are the family's own, written as in any impl: at least `shape` and
/// `spine_bytes_per_pass`, and any default it replaces (DeepSeek-V3's `spine_format`).
///
/// ```text
/// crate::family::family_model!(served GptOss, "gpt_oss", Qwen3State;
///     fn shape(&self) -> Shape { ... }
///     fn spine_bytes_per_pass(&self) -> u64 { self.dense_weight_bytes() }
/// );
/// ```
macro_rules! family_model {
    (dense $model:ident, $name:expr, $state:ty; $($own:tt)*) => {
        impl $crate::family::FamilyModel for $model {
            $crate::family::family_model!(@every $model, $name, $state);
            $($own)*
        }
    };
    (placed $model:ident, $name:expr, $state:ty; $($own:tt)*) => {
        impl $crate::family::FamilyModel for $model {
            $crate::family::family_model!(@every $model, $name, $state);
            $crate::family::family_model!(@placed $model);
            $($own)*
        }
    };
    (served $model:ident, $name:expr, $state:ty; $($own:tt)*) => {
        impl $crate::family::FamilyModel for $model {
            $crate::family::family_model!(@every $model, $name, $state);
            $crate::served::served_methods!($model);
            $($own)*
        }
        impl ::std::fmt::Debug for $model {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                use $crate::family::FamilyModel;
                let (shape, routed) = (self.shape(), $model::routed_experts(self));
                f.debug_struct(stringify!($model))
                    .field("layers", &shape.layers)
                    .field("experts", &routed.per_layer)
                    .field("top_k", &shape.experts_per_token)
                    .finish_non_exhaustive()
            }
        }
    };
    (@every $model:ident, $name:expr, $state:ty) => {
        fn family(&self) -> &'static str {
            $name
        }
        fn new_state(&self) -> $crate::State {
            $crate::State::new($name, $model::new_state(self))
        }
        fn forward(
            &self,
            state: &mut $crate::State,
            tokens: &[u32],
            rows: $crate::LogitRows,
            trace: Option<&mut $crate::family::Trace>,
        ) -> Result<Vec<f32>, $crate::ModelError> {
            $model::forward(self, state.family_mut::<$state>($name)?, tokens, rows, trace)
        }
        fn memory_needs(&self) -> Option<$crate::family::MemoryNeeds> {
            Some($model::memory_needs(self))
        }
        fn as_any(&self) -> &dyn ::std::any::Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn ::std::any::Any {
            self
        }
        fn into_any(self: Box<Self>) -> Box<dyn ::std::any::Any> {
            self
        }
    };
    (@placed $model:ident) => {
        fn routed_experts(&self) -> Option<$crate::family::RoutedExperts> {
            Some($model::routed_experts(self))
        }
        fn set_experts(&mut self, store: ::std::sync::Arc<dyn ::sluice_store::ExpertStore>) {
            $model::set_experts(self, store);
        }
        fn set_prefetch(&mut self, on: bool) {
            $model::set_prefetch(self, on);
        }
        fn experts(&self) -> Option<&::std::sync::Arc<dyn ::sluice_store::ExpertStore>> {
            Some($model::experts(self))
        }
        fn spine_index(&self) -> Result<Option<::sluice_store::SpineIndex>, $crate::ModelError> {
            $model::spine_index(self).map(Some)
        }
        fn spine_small_bytes(&self) -> u64 {
            $model::spine_small_bytes(self)
        }
        fn set_spine(
            &mut self,
            store: ::std::sync::Arc<::sluice_store::SpineStore>,
        ) -> Result<(), $crate::ModelError> {
            $model::set_spine(self, store)
        }
        fn spine_stats(&self) -> ::sluice_store::SpineStats {
            $model::spine_stats(self)
        }
    };
}
pub(crate) use family_model;

/// What [`crate::check`] found in a checkpoint whose every tensor the model needs is present
/// with the dtype and shape its config implies.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The family.
    pub family: &'static Family,
    /// The family's typed config, for `inspect`: Kimi K3's (whose check does not load the
    /// model); `None` for the others, which are loaded and described through [`crate::Model`].
    pub k3: Option<Box<crate::kimi_k3::config::K3Config>>,
}

/// The check of a family whose loading is the check: the roster and the expert layout are
/// resolved and the experts mapped, never read.
pub fn check_by_loading(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    let family = of(ckpt)?;
    let reopened = Checkpoint::open(ckpt.dir())?;
    (family.load)(Arc::new(reopened))?;
    Ok(Checked { family, k3: None })
}

/// A family's load function: the checkpoint in, its model boxed behind [`FamilyModel`] out.
pub type LoadFn = fn(Arc<Checkpoint>) -> Result<Box<dyn FamilyModel>, ModelError>;

/// A family's routed experts from `config.json` alone (no shard opened): `None` for a family
/// without routed experts.
pub type RoutedFn =
    fn(&sluice_checkpoint::CheckpointConfig) -> Result<Option<RoutedExperts>, ModelError>;

/// A family's load function for a checkpoint whose routed experts are not mapped (a stream
/// install): the model takes them from the given store from the start.
pub type WithExpertsFn =
    fn(Arc<Checkpoint>, Arc<dyn ExpertStore>) -> Result<Box<dyn FamilyModel>, ModelError>;

/// The [`RoutedFn`] of a family without routed experts.
pub fn no_routed(
    _: &sluice_checkpoint::CheckpointConfig,
) -> Result<Option<RoutedExperts>, ModelError> {
    Ok(None)
}

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
    pub load: LoadFn,
    /// Runs the checks loading for `sluice run` runs, without reading the routed experts
    /// ([`crate::check`]); [`check_by_loading`] unless the family can check for less.
    pub check: fn(&Checkpoint) -> Result<Checked, ModelError>,
    /// Where its routed experts are, from `config.json` alone ([`routed_for_config`]): what
    /// `sluice pull --stream` leaves out and a stream install streams.
    pub routed: RoutedFn,
    /// Loads a checkpoint of this family whose routed experts are not mapped, its experts
    /// served by the given store ([`load_with_experts`]; a stream install).
    pub with_experts: WithExpertsFn,
}

/// Every supported family, one line each.
#[rustfmt::skip]
pub const FAMILIES: &[Family] = &[
    Family { name: "kimi_k3", display: "Kimi K3", architectures: &["KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"], places_spine: true, load: |c| Ok(Box::new(crate::kimi_k3::KimiK3::load(c)?)), check: crate::kimi_k3::boundary::check,
        routed: |c| Ok(Some(crate::kimi_k3::KimiK3::routed(&crate::kimi_k3::config::K3Config::from_json(c.text_config())?))), with_experts: |c, e| Ok(Box::new(crate::kimi_k3::KimiK3::with_store(c, e)?)) },
    Family { name: "qwen3", display: "Qwen3", architectures: &["Qwen3ForCausalLM"], places_spine: false, load: |c| Ok(Box::new(crate::qwen3::Qwen3::load(c)?)), check: check_by_loading,
        routed: no_routed, with_experts: |c, _| Ok(Box::new(crate::qwen3::Qwen3::load(c)?)) },
    Family { name: "qwen3_moe", display: "Qwen3-MoE", architectures: &["Qwen3MoeForCausalLM"], places_spine: true, load: |c| Ok(Box::new(crate::qwen3_moe::Qwen3Moe::load(c, Experts::Mapped)?)), check: check_by_loading,
        routed: |c| Ok(Some(crate::qwen3_moe::Qwen3Moe::routed(&crate::qwen3_moe::config::Qwen3MoeConfig::from_json(c.text_config())?))), with_experts: |c, e| Ok(Box::new(crate::qwen3_moe::Qwen3Moe::load(c, Experts::Given(e))?)) },
    Family { name: "gpt_oss", display: "GPT-OSS", architectures: &["GptOssForCausalLM"], places_spine: true, load: |c| Ok(Box::new(crate::gpt_oss::GptOss::load(c, Experts::Mapped)?)), check: check_by_loading,
        routed: |c| Ok(Some(crate::gpt_oss::GptOss::routed(&crate::gpt_oss::config::GptOssConfig::from_json(c.text_config())?))), with_experts: |c, e| Ok(Box::new(crate::gpt_oss::GptOss::load(c, Experts::Given(e))?)) },
    Family { name: "deepseek_v3", display: "DeepSeek V3/R1, Kimi K2", architectures: &["DeepseekV3ForCausalLM"], places_spine: true, load: |c| Ok(Box::new(crate::deepseek_v3::DeepseekV3::load(c, Experts::Mapped)?)), check: check_by_loading,
        routed: |c| Ok(Some(crate::deepseek_v3::DeepseekV3::routed_for_config(c.text_config())?)), with_experts: |c, e| Ok(Box::new(crate::deepseek_v3::DeepseekV3::load(c, Experts::Given(e))?)) },
];

/// The table line named `name`.
pub fn named(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

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
/// experts from the spine. `None` for a family without routed experts. Each family answers
/// through its table line's `routed`.
pub fn routed_for_config(
    config: &sluice_checkpoint::CheckpointConfig,
) -> Result<Option<RoutedExperts>, ModelError> {
    let arch = config.architecture().to_owned();
    let family = FAMILIES
        .iter()
        .find(|f| f.architectures.contains(&arch.as_str()))
        .ok_or_else(|| ModelError::UnknownArchitecture { arch, supported: supported() })?;
    (family.routed)(config)
}

/// Loads the model `ckpt`'s config names with its routed experts served by `experts` from the
/// start, never mapped in place: for a checkpoint whose routed experts are not mapped (a stream
/// install), through its table line's `with_experts`. A family without routed experts loads as
/// [`crate::load`] does.
pub fn load_with_experts(
    ckpt: Arc<Checkpoint>,
    experts: Arc<dyn sluice_store::ExpertStore>,
) -> Result<Model, ModelError> {
    let family = of(&ckpt)?;
    Model::from_family((family.with_experts)(ckpt, experts)?, family)
}

/// Turns next-layer expert prefetch on or off for a model whose family guesses its next MoE
/// layer's experts (worth it when experts stream); a no-op for one that does not.
pub fn set_prefetch(model: &mut Model, on: bool) {
    model.set_prefetch(on);
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
    /// Working memory per row of a prompt chunk (`LogitRows::Prefill`) past its first
    /// [`crate::ROW_BLOCK`] rows, which are charged at `pass_per_row`: no logits row, no replay
    /// rows, no buffer a layer fills a block of rows at a time.
    pub prefill_per_row: u64,
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

/// Records `v` as stage `name()` of a pass when `trace` wants stage tensors (the name is built
/// only then): the one recorder of every family's forward pass.
pub(crate) fn put(trace: &mut Option<&mut Trace>, name: impl FnOnce() -> String, v: &[f32]) {
    if let Some(t) = trace.as_deref_mut().filter(|t| !t.routes_only) {
        t.tensors.insert(name(), v.to_vec());
    }
}

/// `dst += src` element-wise (the residual adds of every family's forward pass).
pub(crate) fn add_into(dst: &mut [f32], src: &[f32]) {
    for (a, b) in dst.iter_mut().zip(src) {
        *a += b;
    }
}

/// The checks every family's forward makes before it computes anything, in this order: a pass
/// of at least one token, no pass still staged in the state (`pending`), a state made for a
/// model of this shape (`fits`), every id inside the vocabulary of `vocab` tokens. `family`
/// names the model in the shape error.
pub(crate) fn check_pass(
    family: &str,
    tokens: &[u32],
    pending: Option<usize>,
    fits: bool,
    vocab: usize,
) -> Result<(), ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::EmptyInput);
    }
    if let Some(p) = pending {
        return Err(ModelError::PendingPass(p));
    }
    if !fits {
        return Err(ModelError::Config(format!(
            "the state passed to the {family} model was made for a model of another shape"
        )));
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ModelError::TokenOutOfRange { id, vocab });
    }
    Ok(())
}

/// The step a template family's forward pass takes on a MoE layer, written once: `block` routes
/// the rows of layer `layer` and runs the chosen experts from the store, returning the block's
/// output, the router logits and the routes. When it fails (the expert store could not serve an
/// expert) `state` is rolled back, so that the failed pass leaves nothing staged, and the error
/// is returned; otherwise the router logits (`layer{layer}.router_logits`) and the routes go into
/// the trace and the block's output is returned.
pub(crate) fn moe_step(
    state: &mut dyn FamilyState,
    trace: &mut Option<&mut Trace>,
    layer: usize,
    block: impl FnOnce() -> Result<(Vec<f32>, Vec<f32>, Vec<Route>), ModelError>,
) -> Result<Vec<f32>, ModelError> {
    let (out, logits, routes) = block().inspect_err(|_| state.rollback())?;
    put(trace, || format!("layer{layer}.router_logits"), &logits);
    if let Some(tr) = trace.as_deref_mut() {
        tr.routes.insert(layer, routes);
    }
    Ok(out)
}
