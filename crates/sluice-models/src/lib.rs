//! Model families for sluice: one module per family (config, tensor roster, forward pass,
//! sequence state with transactions). Adding a family touches its own module and the one
//! `match` on `config.json`'s `architectures` in [`load`].
//!
//! Models never do I/O themselves: spine weights are byte slices of the opened checkpoint and
//! routed experts come from a `sluice_store::ExpertStore`.

mod finite;
pub mod gpt_oss;
pub mod kimi_k3;
pub mod qwen3;
pub mod qwen3_moe;
pub mod snapshot;

pub use snapshot::{SnapshotCodecError, StateShape, StateSnapshot, SNAPSHOT_FORMAT_VERSION};

use sluice_checkpoint::{Checkpoint, CheckpointError};
use std::sync::Arc;

/// Which rows of a pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every row (verification passes).
    All,
    /// Only the last row (prefill, plain decoding).
    Last,
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
    #[error("unknown architecture {0:?}: sluice supports KimiK3ForConditionalGeneration and KimiLinearForCausalLM (Kimi K3), Qwen3ForCausalLM, Qwen3MoeForCausalLM and GptOssForCausalLM")]
    UnknownArchitecture(String),
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
    /// A pass produced NaN or ±Inf; the pass is rolled back.
    #[error("non-finite values (NaN/Inf) in {stage}: {cause}")]
    NonFiniteActivation {
        /// Where: `the output of layer 3`, `the logits`, `the embedding of token 7`.
        stage: String,
        /// The tensor found holding a non-finite value, or what else can cause it.
        cause: String,
    },
}

/// A loaded model of any supported family.
// A process holds one or two models (target and draft), built once and never moved on a hot
// path, so the size difference between the variants costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Model {
    /// Kimi K3.
    KimiK3(kimi_k3::KimiK3),
    /// Qwen3 dense.
    Qwen3(qwen3::Qwen3),
    /// Qwen3-MoE.
    Qwen3Moe(qwen3_moe::Qwen3Moe),
    /// GPT-OSS.
    GptOss(gpt_oss::GptOss),
}

/// Architectures that map to Kimi K3.
const KIMI_K3_ARCHS: [&str; 2] = ["KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"];

/// What [`check`] found in a checkpoint whose every tensor the model needs is present with the
/// dtype and shape its config implies.
#[derive(Debug, Clone)]
pub enum Checked {
    /// Kimi K3: its config; the spine roster and every routed expert were checked.
    KimiK3(Box<kimi_k3::config::K3Config>),
    /// Qwen3 dense: its config; every tensor was checked.
    Qwen3(qwen3::config::Qwen3Config),
}

/// Runs the checks that loading the model for `sluice run` runs — architecture, config, every
/// spine tensor's presence, dtype and shape (and finiteness of the small ones read at load),
/// every routed expert's tensors — without mapping or reading the routed experts. `inspect`,
/// `verify` and `convert` use it so that they never call a checkpoint good that `run` refuses.
pub fn check(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    let archs = ckpt.config().architectures();
    let arch = archs.first().cloned().unwrap_or_default();
    match arch.as_str() {
        a if KIMI_K3_ARCHS.contains(&a) => {
            let cfg = kimi_k3::config::K3Config::from_json(ckpt.config().text_config())?;
            // In the order loading for `run` meets them, so both name the same first problem.
            kimi_k3::KimiK3::expert_index(ckpt, &cfg)?;
            kimi_k3::weights::K3Weights::load(ckpt, &cfg)?;
            Ok(Checked::KimiK3(Box::new(cfg)))
        }
        "Qwen3ForCausalLM" => {
            let cfg = qwen3::config::Qwen3Config::from_json(ckpt.config().text_config())?;
            qwen3::weights::Qwen3Weights::load(ckpt, &cfg)?;
            Ok(Checked::Qwen3(cfg))
        }
        other => Err(ModelError::UnknownArchitecture(other.to_string())),
    }
}

/// Loads the model `config.json` names.
pub fn load(ckpt: Arc<Checkpoint>) -> Result<Model, ModelError> {
    let archs = ckpt.config().architectures();
    let arch = archs.first().cloned().unwrap_or_default();
    match arch.as_str() {
        a if KIMI_K3_ARCHS.contains(&a) => Ok(Model::KimiK3(kimi_k3::KimiK3::load(ckpt)?)),
        "Qwen3ForCausalLM" => Ok(Model::Qwen3(qwen3::Qwen3::load(ckpt)?)),
        "Qwen3MoeForCausalLM" => Ok(Model::Qwen3Moe(qwen3_moe::Qwen3Moe::load(ckpt)?)),
        "GptOssForCausalLM" => Ok(Model::GptOss(gpt_oss::GptOss::load(ckpt)?)),
        other => Err(ModelError::UnknownArchitecture(other.to_string())),
    }
}

/// Sequence state of any supported family.
#[derive(Debug, Clone)]
pub enum State {
    /// Kimi K3 state.
    KimiK3(kimi_k3::state::K3State),
    /// Qwen3, Qwen3-MoE and GPT-OSS state (the same KV caches).
    Qwen3(qwen3::Qwen3State),
}

impl State {
    /// Publishes the first `n` rows of the staged pass.
    pub fn commit(&mut self, n: usize) {
        match self {
            Self::KimiK3(s) => s.commit(n),
            Self::Qwen3(s) => s.commit(n),
        }
    }

    /// Discards the staged pass.
    pub fn rollback(&mut self) {
        match self {
            Self::KimiK3(s) => s.rollback(),
            Self::Qwen3(s) => s.rollback(),
        }
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        match self {
            Self::KimiK3(s) => s.len(),
            Self::Qwen3(s) => s.len(),
        }
    }

    /// True before any position is committed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn byte_len(&self) -> usize {
        match self {
            Self::KimiK3(s) => s.byte_len(),
            Self::Qwen3(s) => s.byte_len(),
        }
    }
}

impl Model {
    /// A fresh sequence state.
    pub fn new_state(&self) -> State {
        match self {
            Self::KimiK3(m) => State::KimiK3(m.new_state()),
            Self::Qwen3(m) => State::Qwen3(m.new_state()),
            Self::Qwen3Moe(m) => State::Qwen3(m.new_state()),
            Self::GptOss(m) => State::Qwen3(m.new_state()),
        }
    }

    /// Spine I/O counters (zero unless a Kimi K3 spine is placed by a spine store).
    pub fn spine_stats(&self) -> sluice_store::SpineStats {
        match self {
            Self::KimiK3(m) => m.spine_stats(),
            Self::Qwen3(_) | Self::Qwen3Moe(_) | Self::GptOss(_) => {
                sluice_store::SpineStats::default()
            }
        }
    }

    /// Vocabulary size (rows of the logits).
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::KimiK3(m) => m.config().vocab_size,
            Self::Qwen3(m) => m.config().vocab_size,
            Self::Qwen3Moe(m) => m.config().base.vocab_size,
            Self::GptOss(m) => m.config().vocab_size,
        }
    }

    /// Family name for display.
    pub fn family(&self) -> &'static str {
        match self {
            Self::KimiK3(_) => "kimi_k3",
            Self::Qwen3(_) => "qwen3",
            Self::Qwen3Moe(_) => "qwen3_moe",
            Self::GptOss(_) => "gpt_oss",
        }
    }

    /// Expert-store counters.
    pub fn store_stats(&self) -> sluice_store::StoreStats {
        match self {
            Self::KimiK3(m) => m.experts().stats(),
            // A dense model has no expert store; Qwen3-MoE and GPT-OSS read their experts in
            // place (for now).
            Self::Qwen3(_) | Self::Qwen3Moe(_) | Self::GptOss(_) => {
                sluice_store::StoreStats::default()
            }
        }
    }

    /// Expert-store counters per layer (empty when experts do not stream).
    pub fn layer_store_stats(&self) -> Vec<sluice_store::LayerPrefetchStats> {
        match self {
            Self::KimiK3(m) => m.experts().layer_stats(),
            Self::Qwen3(_) | Self::Qwen3Moe(_) | Self::GptOss(_) => Vec::new(),
        }
    }

    /// Weight bytes a pass reads besides routed experts (memory traffic, not storage reads).
    pub fn spine_bytes_per_pass(&self) -> u64 {
        match self {
            Self::KimiK3(m) => m.spine_bytes_per_pass(),
            Self::Qwen3(m) => m.weight_bytes(),
            Self::Qwen3Moe(m) => m.dense_weight_bytes(),
            Self::GptOss(m) => m.dense_weight_bytes(),
        }
    }

    /// Runs one pass of `tokens` after the committed positions; see [`kimi_k3::KimiK3::forward`].
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut kimi_k3::Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        match (self, state) {
            (Self::KimiK3(m), State::KimiK3(s)) => m.forward(s, tokens, rows, trace),
            (Self::Qwen3(m), State::Qwen3(s)) => m.forward(s, tokens, rows, trace),
            (Self::Qwen3Moe(m), State::Qwen3(s)) => m.forward(s, tokens, rows, trace),
            (Self::GptOss(m), State::Qwen3(s)) => m.forward(s, tokens, rows, trace),
            (m, _) => Err(ModelError::Config(format!(
                "the sequence state passed to the {} model belongs to another model",
                m.family()
            ))),
        }
    }
}
