//! Model families for sluice: one module per family (config, tensor roster, expert layout,
//! forward pass, sequence state with transactions) behind the family boundary of [`family`]:
//! the family table keyed by `config.json`'s `architectures`, the routed-expert layout the
//! store opens over, and the memory needs the planner charges. Adding a family is its own
//! module, one line in [`family::FAMILIES`] and a variant of [`Model`] (docs/ADDING_A_FAMILY.md).
//!
//! Models never do I/O themselves: spine weights are byte slices of the opened checkpoint and
//! routed experts come from a `sluice_store::ExpertStore`.

pub mod deepseek_v3;
pub mod family;
mod finite;
pub mod gpt_oss;
pub mod kimi_k3;
pub mod qwen3;
pub mod qwen3_moe;
pub mod snapshot;
pub mod synth;
pub mod working;

pub use family::{Family, MemoryNeeds, RoutedExperts, Shape, FAMILIES};
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
    /// DeepSeek-V3 architecture (DeepSeek V3/R1, Kimi K2).
    DeepseekV3(deepseek_v3::DeepseekV3),
}

/// What [`check`] found in a checkpoint whose every tensor the model needs is present with the
/// dtype and shape its config implies.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The family.
    pub family: &'static Family,
    /// The family's typed config, for `inspect`: Kimi K3's (whose check does not load the
    /// model); `None` for the others, which are loaded and described by [`Model::describe`].
    pub k3: Option<Box<kimi_k3::config::K3Config>>,
}

/// Runs the checks that loading the model for `sluice run` runs — architecture, config, every
/// spine tensor's presence, dtype and shape (and finiteness of the small ones read at load),
/// every routed expert's tensors — without mapping or reading the routed experts. `inspect`,
/// `verify` and `convert` use it so that they never call a checkpoint good that `run` refuses.
pub fn check(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    let family = family::of(ckpt)?;
    if family.name == "kimi_k3" {
        // K3's check stops short of mapping its routed experts (a stream install has none).
        let cfg = kimi_k3::config::K3Config::from_json(ckpt.config().text_config())?;
        // In the order loading for `run` meets them, so both name the same first problem.
        kimi_k3::KimiK3::expert_index(ckpt, &cfg)?;
        kimi_k3::weights::K3Weights::load(ckpt, &cfg)?;
        return Ok(Checked { family, k3: Some(Box::new(cfg)) });
    }
    // The others: loading is the check (the roster and the expert layout are resolved, the
    // experts mapped but never read).
    let reopened = Checkpoint::open(ckpt.dir())?;
    (family.load)(Arc::new(reopened))?;
    Ok(Checked { family, k3: None })
}

/// Loads the model `config.json` names, through the family table.
pub fn load(ckpt: Arc<Checkpoint>) -> Result<Model, ModelError> {
    (family::of(&ckpt)?.load)(ckpt)
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
            // The MLA latent cache, in the Kimi K3 state's MLA layers.
            Self::DeepseekV3(m) => State::KimiK3(m.new_state()),
        }
    }

    /// The family table's line for this model.
    pub fn family_entry(&self) -> &'static Family {
        let name = self.family();
        FAMILIES
            .iter()
            .find(|f| f.name == name)
            .expect("invariant: every Model variant has a line in the family table")
    }

    /// The model's shape.
    pub fn shape(&self) -> Shape {
        match self {
            Self::KimiK3(m) => {
                let c = m.config();
                Shape {
                    layers: c.num_hidden_layers,
                    hidden: c.hidden_size,
                    vocab: c.vocab_size,
                    heads: c.num_attention_heads,
                    kv_heads: c.num_attention_heads,
                    experts_per_token: c.num_experts_per_token,
                }
            }
            Self::Qwen3(m) => {
                let c = m.config();
                Shape {
                    layers: c.num_hidden_layers,
                    hidden: c.hidden_size,
                    vocab: c.vocab_size,
                    heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    experts_per_token: 0,
                }
            }
            Self::Qwen3Moe(m) => {
                let c = m.config();
                Shape {
                    layers: c.base.num_hidden_layers,
                    hidden: c.base.hidden_size,
                    vocab: c.base.vocab_size,
                    heads: c.base.num_attention_heads,
                    kv_heads: c.base.num_key_value_heads,
                    experts_per_token: c.num_experts_per_tok,
                }
            }
            Self::GptOss(m) => {
                let c = m.config();
                Shape {
                    layers: c.num_hidden_layers,
                    hidden: c.hidden_size,
                    vocab: c.vocab_size,
                    heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    experts_per_token: c.num_experts_per_tok,
                }
            }
            Self::DeepseekV3(m) => {
                let c = m.config();
                Shape {
                    layers: c.num_hidden_layers,
                    hidden: c.hidden_size,
                    vocab: c.vocab_size,
                    heads: c.num_attention_heads,
                    kv_heads: c.num_attention_heads,
                    experts_per_token: c.num_experts_per_tok,
                }
            }
        }
    }

    /// Where the routed experts are (`None` for a dense model).
    pub fn routed_experts(&self) -> Option<RoutedExperts> {
        match self {
            Self::KimiK3(m) => Some(m.routed_experts()),
            Self::Qwen3(_) => None,
            Self::Qwen3Moe(m) => Some(m.routed_experts()),
            Self::GptOss(m) => Some(m.routed_experts()),
            Self::DeepseekV3(m) => Some(m.routed_experts()),
        }
    }

    /// Takes routed experts from `store` from now on (ignored by a dense model).
    pub fn set_experts(&mut self, store: Arc<dyn sluice_store::ExpertStore>) {
        match self {
            Self::KimiK3(m) => m.set_experts(store),
            Self::Qwen3(_) => {}
            Self::Qwen3Moe(m) => m.set_experts(store),
            Self::GptOss(m) => m.set_experts(store),
            Self::DeepseekV3(m) => m.set_experts(store),
        }
    }

    /// What the model holds besides its expert cache, for the memory plan (`None` for Kimi K3,
    /// whose spine placement plans piece by piece).
    pub fn memory_needs(&self) -> Option<MemoryNeeds> {
        match self {
            Self::KimiK3(_) => None,
            Self::Qwen3(m) => Some(MemoryNeeds {
                spine: m.weight_bytes(),
                state_fixed: 0,
                state_per_position: {
                    let c = m.config();
                    (c.num_hidden_layers * c.kv_width() * 2 * 4) as u64
                },
                pass_per_row: {
                    let c = m.config();
                    working::pass_bytes_per_row(
                        c.hidden_size,
                        c.q_width() + 2 * c.kv_width(),
                        0,
                        0,
                        c.intermediate_size,
                        c.vocab_size,
                    )
                },
            }),
            Self::Qwen3Moe(m) => Some(m.memory_needs()),
            Self::GptOss(m) => Some(m.memory_needs()),
            Self::DeepseekV3(m) => Some(m.memory_needs()),
        }
    }

    /// Spine I/O counters (zero unless a Kimi K3 spine is placed by a spine store).
    pub fn spine_stats(&self) -> sluice_store::SpineStats {
        match self {
            Self::KimiK3(m) => m.spine_stats(),
            Self::Qwen3(_) | Self::Qwen3Moe(_) | Self::GptOss(_) | Self::DeepseekV3(_) => {
                sluice_store::SpineStats::default()
            }
        }
    }

    /// How the spine's matrices are stored, for the plan line: `bf16` for every family that
    /// publishes a bf16 spine; DeepSeek-V3's own (`fp8`, `bf16` or `mixed`).
    pub fn spine_format(&self) -> &'static str {
        match self {
            Self::KimiK3(_) | Self::Qwen3(_) | Self::Qwen3Moe(_) | Self::GptOss(_) => "bf16",
            Self::DeepseekV3(m) => m.spine_format(),
        }
    }

    /// Vocabulary size (rows of the logits).
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::KimiK3(m) => m.config().vocab_size,
            Self::Qwen3(m) => m.config().vocab_size,
            Self::Qwen3Moe(m) => m.config().base.vocab_size,
            Self::GptOss(m) => m.config().vocab_size,
            Self::DeepseekV3(m) => m.config().vocab_size,
        }
    }

    /// Family name for display.
    pub fn family(&self) -> &'static str {
        match self {
            Self::KimiK3(_) => "kimi_k3",
            Self::Qwen3(_) => "qwen3",
            Self::Qwen3Moe(_) => "qwen3_moe",
            Self::GptOss(_) => "gpt_oss",
            Self::DeepseekV3(_) => "deepseek_v3",
        }
    }

    /// The expert store in use (`None` for a dense model).
    pub fn experts(&self) -> Option<&Arc<dyn sluice_store::ExpertStore>> {
        match self {
            Self::KimiK3(m) => Some(m.experts()),
            Self::Qwen3(_) => None,
            Self::Qwen3Moe(m) => Some(m.experts()),
            Self::GptOss(m) => Some(m.experts()),
            Self::DeepseekV3(m) => Some(m.experts()),
        }
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
        match self {
            Self::KimiK3(m) => m.spine_bytes_per_pass(),
            Self::Qwen3(m) => m.weight_bytes(),
            Self::Qwen3Moe(m) => m.dense_weight_bytes(),
            Self::GptOss(m) => m.dense_weight_bytes(),
            Self::DeepseekV3(m) => m.dense_weight_bytes(),
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
            (Self::DeepseekV3(m), State::KimiK3(s)) => m.forward(s, tokens, rows, trace),
            (m, _) => Err(ModelError::Config(format!(
                "the sequence state passed to the {} model belongs to another model",
                m.family()
            ))),
        }
    }
}
