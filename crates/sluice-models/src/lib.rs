//! Model families for sluice: one module per family (config, tensor roster, expert layout,
//! forward pass, sequence state with transactions) behind the family boundary of [`family`]:
//! the family table keyed by `config.json`'s `architectures`, the routed-expert layout the
//! store opens over, the memory needs the planner charges, and the [`family::FamilyModel`] /
//! [`state::FamilyState`] traits a family implements. [`Model`] and [`State`] hold one boxed;
//! this file names no family. Adding a family is its own module and one line in
//! [`family::FAMILIES`] (docs/ADDING_A_FAMILY.md).
//!
//! Models never do I/O themselves: spine weights are byte slices of the opened checkpoint or of
//! a placed spine piece ([`spine`], through the shared weight handle [`linear::Linear`]) and
//! routed experts come from a `sluice_store::ExpertStore`.

mod combine;
pub mod deepseek_v3;
pub mod family;
mod finite;
pub mod gpt_oss;
pub(crate) mod grouped;
pub mod kimi_k3;
mod latent_parts;
pub mod linear;
pub mod qwen3;
pub mod qwen3_moe;
mod served;
pub mod snapshot;
pub mod spine;
pub mod state;
pub mod synth;
pub mod working;

pub use combine::{layer_batch_held, LAYER_BATCH_BYTES};
pub use family::{
    Checked, Family, FamilyModel, MemoryNeeds, RoutedExperts, Shape, Trace, FAMILIES,
};
pub use snapshot::{
    SnapshotCodecError, SnapshotLayout, StateShape, StateSnapshot, SNAPSHOT_FORMAT_VERSION,
};
pub use state::{FamilyState, State};

use sluice_checkpoint::{Checkpoint, CheckpointError};
use std::sync::Arc;

/// Rows a model runs through a layer's row-local work at a time where splitting the rows
/// changes no result (Kimi K3's KDA layers, a routed expert's batch — Kimi K3's in blocks of
/// [`EXPERT_BLOCK`]): a long prompt pass then
/// holds those buffers for one block of rows, not for all of them. The memory plan charges a
/// pass's first `ROW_BLOCK` rows at the full per-row working memory for this, and a decode
/// pass verifies at most `ROW_BLOCK` rows.
pub const ROW_BLOCK: usize = 64;

/// `f(block, rows)` over `x [t, d]` one block of at most [`ROW_BLOCK`] rows at a time, in row
/// order, the outputs joined (room for an output as wide as `x` is made up front). A layer whose
/// rows are independent, or whose later rows read earlier ones only through the state they
/// appended, then holds its buffers for one block of rows however long the pass.
pub(crate) fn row_blocks(
    x: &[f32],
    t: usize,
    mut f: impl FnMut(&[f32], usize) -> Vec<f32>,
) -> Vec<f32> {
    let d = (x.len() / t.max(1)).max(1);
    let mut out = Vec::with_capacity(x.len());
    for xb in x.chunks(ROW_BLOCK * d) {
        out.extend(f(xb, xb.len() / d));
    }
    out
}

/// Rows a Kimi K3 routed expert runs at a time (the batch of `combine::GluExpert`): each call
/// of an expert's matrices widens every weight of them once, whatever its rows, so a prompt
/// whose experts each take somewhat more than [`ROW_BLOCK`] rows (a 256-row pass over 48
/// experts, top-16: about 85) widened each expert twice in blocks of `ROW_BLOCK`. The batch's
/// three buffers are charged with a pass's first `ROW_BLOCK` rows at twice their per-row width
/// (`kimi_k3::working`); the other families keep blocks of `ROW_BLOCK` and their charges.
pub const EXPERT_BLOCK: usize = 2 * ROW_BLOCK;

/// Most captures one pass makes ([`Model::forward_capturing`]): each holds a copy of the
/// state's fixed part (Kimi K3's recurrent and conv states) until the pass ends, so a caller
/// with more points inside one pass ends the pass at the next one instead.
pub const MAX_CAPTURES: usize = 4;

/// Which rows of a pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every row (verification passes).
    All,
    /// Only the last row (plain decoding, or a pass the caller may commit in part).
    Last,
    /// Only the last row, of a pass the caller commits whole or rolls back (a prompt chunk):
    /// a model may then keep no per-row data for a partial commit (Kimi K3's KDA layers keep
    /// no replay rows), so a prompt row costs less working memory (see
    /// [`family::MemoryNeeds::prefill_per_row`]). `commit(n)` of such a pass with n < T
    /// publishes nothing (as `rollback`).
    Prefill,
}

impl LogitRows {
    /// The rows of a `t`-row pass (`t` ≥ 1) whose logits are returned.
    pub fn range(self, t: usize) -> std::ops::Range<usize> {
        match self {
            Self::All => 0..t,
            Self::Last | Self::Prefill => t - 1..t,
        }
    }
}

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The checkpoint is missing a tensor or has the wrong dtype/shape (names file and tensor).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The expert store failed.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// A tensor of a family's checkpoint is missing or has the wrong dtype/shape (names the
    /// family, the shard file and the tensor).
    #[error("{family} checkpoint: {source}")]
    FamilyTensor {
        /// The family whose roster check failed (`qwen3_moe`, ...).
        family: &'static str,
        /// The checkpoint error naming file and tensor.
        #[source]
        source: CheckpointError,
    },
    /// The configuration is invalid or unsupported.
    #[error("invalid model config: {0}")]
    Config(String),
    /// `config.json` names an architecture sluice does not implement.
    #[error("unknown architecture {arch:?}: sluice supports {supported}")]
    UnknownArchitecture {
        /// The first entry of `architectures` (empty when there is none).
        arch: String,
        /// The supported architectures, family by family ([`family::supported`]).
        supported: String,
    },
    /// A pass was asked to run on no tokens.
    #[error("empty input: a pass needs at least one token")]
    EmptyInput,
    /// A token id is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The previous pass was neither committed nor rolled back.
    #[error("a pass of {0} rows is still pending: commit or roll it back first")]
    PendingPass(usize),
    /// A weight read at load holds NaN or ±Inf.
    #[error("{file}: tensor {tensor} holds {value} at element {index}: the checkpoint is corrupt")]
    NonFiniteWeight {
        /// The shard file.
        file: std::path::PathBuf,
        /// The tensor.
        tensor: String,
        /// Element index (row-major).
        index: usize,
        /// `NaN`, `+Inf` or `-Inf`.
        value: &'static str,
    },
    /// A capturing pass was asked for captures it cannot make.
    #[error("cannot capture the state {what}")]
    Capture {
        /// What was asked: offsets outside the pass or out of order, more than
        /// [`MAX_CAPTURES`], or a state that cannot capture.
        what: String,
    },
    /// A model was handed a sequence state made by another family's model.
    #[error("the sequence state passed to the {model} model belongs to another model: a {state} model made it")]
    StateMismatch {
        /// The model's family.
        model: &'static str,
        /// The family of the model that made the state.
        state: &'static str,
    },
    /// A pass produced NaN or ±Inf; the pass is rolled back.
    #[error("non-finite values (NaN/Inf) in {stage}: {cause}")]
    NonFiniteActivation {
        /// Where: `the output of layer 3`, `the logits`, `the embedding of token 7`.
        stage: String,
        /// The tensor found holding a non-finite value, or what else can cause it.
        cause: String,
    },
}

/// A loaded model of any supported family: the family's model, boxed behind
/// [`FamilyModel`], and its line of the family table.
#[derive(Debug)]
pub struct Model {
    inner: Box<dyn FamilyModel>,
    family: &'static Family,
}

/// Runs the checks that loading the model for `sluice run` runs — architecture, config, every
/// spine tensor's presence, dtype and shape (and finiteness of the small ones read at load),
/// every routed expert's tensors — without mapping or reading the routed experts. `inspect`,
/// `verify` and `convert` use it so that they never call a checkpoint good that `run` refuses.
pub fn check(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    (family::of(ckpt)?.check)(ckpt)
}

/// Loads the model `config.json` names, through the family table.
pub fn load(ckpt: Arc<Checkpoint>) -> Result<Model, ModelError> {
    let family = family::of(&ckpt)?;
    Ok(Model { inner: (family.load)(ckpt)?, family })
}

impl Model {
    /// Wraps a model a family loaded directly (the engine's spine placement does); refused
    /// when its family has no line in the family table.
    pub fn new(model: impl FamilyModel) -> Result<Self, ModelError> {
        let name = model.family();
        let family = family::named(name).ok_or_else(|| {
            ModelError::Config(format!("family {name:?} has no line in the family table"))
        })?;
        Ok(Self { inner: Box::new(model), family })
    }

    /// Wraps a model its table line `family` loaded.
    pub(crate) fn from_family(
        inner: Box<dyn FamilyModel>,
        family: &'static Family,
    ) -> Result<Self, ModelError> {
        Ok(Self { inner, family })
    }

    /// The family's own model, when it is a `T` (goldens compare its stages).
    pub fn family_ref<T: FamilyModel>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref()
    }

    /// The family's own model, mutably, when it is a `T`.
    pub fn family_mut<T: FamilyModel>(&mut self) -> Option<&mut T> {
        self.inner.as_any_mut().downcast_mut()
    }

    /// The family's own model when it is a `T`; the model back otherwise.
    pub fn into_family<T: FamilyModel>(self) -> Result<T, Self> {
        if self.inner.as_any().is::<T>() {
            match self.inner.into_any().downcast::<T>() {
                Ok(m) => return Ok(*m),
                // Unreachable after `is`; no model is dropped either way.
                Err(_) => unreachable!("invariant: `is::<T>()` held"),
            }
        }
        Err(self)
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> State {
        self.inner.new_state()
    }

    /// The shape of this model's state snapshots, equal to `new_state().shape()` but without
    /// building a state where the family can derive it (see [`FamilyModel::state_shape`]).
    pub fn state_shape(&self) -> StateShape {
        self.inner.state_shape()
    }

    /// The family table's line for this model.
    pub fn family_entry(&self) -> &'static Family {
        self.family
    }

    /// The model's shape.
    pub fn shape(&self) -> Shape {
        self.inner.shape()
    }

    /// Where the routed experts are (`None` for a dense model, and for a family that reads its
    /// experts in place unplanned).
    pub fn routed_experts(&self) -> Option<RoutedExperts> {
        self.inner.routed_experts()
    }

    /// Takes routed experts from `store` from now on (ignored by a dense model).
    pub fn set_experts(&mut self, store: Arc<dyn sluice_store::ExpertStore>) {
        self.inner.set_experts(store);
    }

    /// What the model holds besides its expert cache, for the memory plan (`None` for a family
    /// planned another way, or not at all).
    pub fn memory_needs(&self) -> Option<MemoryNeeds> {
        self.inner.memory_needs()
    }

    /// The spine pieces (embedding, each decoder layer, head) for placing the spine piece by
    /// piece; `None` for a family whose spine is mapped whole.
    pub fn spine_index(&self) -> Result<Option<sluice_store::SpineIndex>, ModelError> {
        self.inner.spine_index()
    }

    /// Bytes of the small vectors the model keeps whatever the spine placement.
    pub fn spine_small_bytes(&self) -> u64 {
        self.inner.spine_small_bytes()
    }

    /// Takes spine bytes from `store` (opened on [`Model::spine_index`]) instead of the mapped
    /// checkpoint; refused by a family whose spine is mapped whole.
    pub fn set_spine(&mut self, store: Arc<sluice_store::SpineStore>) -> Result<(), ModelError> {
        self.inner.set_spine(store)
    }

    /// Spine I/O counters (zero unless the spine is placed by a spine store).
    pub fn spine_stats(&self) -> sluice_store::SpineStats {
        self.inner.spine_stats()
    }

    /// How the spine's matrices are stored, for the plan line: `bf16` for every family that
    /// publishes a bf16 spine; DeepSeek-V3's own (`fp8`, `bf16` or `mixed`).
    pub fn spine_format(&self) -> &'static str {
        self.inner.spine_format()
    }

    /// Vocabulary size (rows of the logits).
    pub fn vocab_size(&self) -> usize {
        self.inner.shape().vocab
    }

    /// Family name for display.
    pub fn family(&self) -> &'static str {
        self.family.name
    }

    /// Turns next-layer expert prefetch on or off (worth it when experts stream from disk;
    /// ignored by a family that does not prefetch).
    pub fn set_prefetch(&mut self, on: bool) {
        self.inner.set_prefetch(on);
    }

    /// The expert store in use (`None` for a dense model).
    pub fn experts(&self) -> Option<&Arc<dyn sluice_store::ExpertStore>> {
        self.inner.experts()
    }

    /// Expert-store counters (zero for a dense model).
    pub fn store_stats(&self) -> sluice_store::StoreStats {
        self.experts().map(|s| s.stats()).unwrap_or_default()
    }

    /// Expert-store counters per layer (empty when experts do not stream).
    pub fn layer_store_stats(&self) -> Vec<sluice_store::LayerPrefetchStats> {
        self.experts().map(|s| s.layer_stats()).unwrap_or_default()
    }

    /// Weight bytes a pass reads besides routed experts (memory traffic, not storage reads).
    pub fn spine_bytes_per_pass(&self) -> u64 {
        self.inner.spine_bytes_per_pass()
    }

    /// Runs one pass of `tokens` after the committed positions, staging the state until
    /// `commit(n)` / `rollback()`; a state made by another family's model is refused with
    /// [`ModelError::StateMismatch`].
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        self.inner.forward(state, tokens, rows, trace)
    }

    /// Runs one pass as [`Model::forward`] does (`trace` as there) and also captures the state after each of
    /// `offsets` rows of it (ascending, each inside the pass: 1 ≤ offset < T, at most
    /// [`MAX_CAPTURES`]): snapshots of `state.len() + offset` positions, equal to the snapshot
    /// of a state that ran the pass's first `offset` rows and committed them. The first shares
    /// `base`'s cache rows (the latest snapshot this state descends from), each later one the
    /// previous one's. A capture keeps no logits: the pass computes the logits of the rows
    /// `rows` asks for only. Refused with [`ModelError::Capture`] before anything runs when
    /// the state cannot capture ([`State::can_capture`]) or the offsets are not as above; the
    /// pass is staged as after `forward`, to be committed or rolled back.
    pub fn forward_capturing(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
        offsets: &[usize],
        base: Option<&StateSnapshot>,
    ) -> Result<(Vec<f32>, Vec<StateSnapshot>), ModelError> {
        let inside = offsets.iter().all(|&o| o >= 1 && o < tokens.len());
        let ascending = offsets.windows(2).all(|w| w[0] < w[1]);
        if !inside || !ascending || offsets.len() > MAX_CAPTURES {
            return Err(ModelError::Capture {
                what: format!(
                    "after rows {offsets:?} of a {}-row pass: at most {MAX_CAPTURES} ascending \
                     rows inside the pass",
                    tokens.len()
                ),
            });
        }
        if offsets.is_empty() {
            return Ok((self.forward(state, tokens, rows, trace)?, Vec::new()));
        }
        if !state.request_captures(offsets) {
            return Err(ModelError::Capture {
                what: format!("of a {} model inside a pass", state.family()),
            });
        }
        match self.forward(state, tokens, rows, trace) {
            Ok(logits) => {
                let captures = state.take_captures(base);
                if captures.len() != offsets.len() {
                    state.rollback();
                    return Err(ModelError::Capture {
                        what: format!(
                            "after rows {offsets:?}: the pass made {} of its captures",
                            captures.len()
                        ),
                    });
                }
                Ok((logits, captures))
            }
            Err(e) => {
                // The failed pass made no captures worth keeping; clear the request.
                drop(state.take_captures(None));
                Err(e)
            }
        }
    }
}
