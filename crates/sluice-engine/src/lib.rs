//! The sluice engine: turns prompts into tokens. It owns decoding (greedy today; sampling and
//! speculative decoding build on the same pass/commit contract), the tokenizer and chat format
//! glue, and run statistics. It never speaks HTTP and never touches weights directly.

pub mod accuracy;
pub mod builtin;
pub mod constraint;
pub mod demo;
pub mod draft;
pub mod draft_model;
pub mod generate;
pub mod install;
pub mod layer_stats;
pub mod load;
pub mod logprob;
pub(crate) mod place;
pub mod plan;
pub mod policy;
pub(crate) mod prefill_pass;
pub mod progress;
pub mod retok;
pub mod route_trace;
pub mod sample;
pub mod session;
pub mod spine;
pub mod state_cache;
pub(crate) mod state_chunks;
pub mod state_file;
pub mod stop;
pub mod turn;

pub use draft::{Drafter, NgramDrafter, ScriptDrafter};
pub use draft_model::{DraftError, DraftModel, ModelDrafter};
pub use generate::{argmax, generate, GenerateOptions, Generation, OnToken, Stats};
pub use policy::WidthPolicy;
pub use progress::{PrefillHook, PrefillProgress};
pub use sample::Sampling;
pub use spine::Spine;

/// Errors from the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] sluice_models::ModelError),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The memory plan cannot hold the minimum (boxed: it carries every charge's figure, and
    /// inline it would make every `Result` of this crate large).
    #[error(transparent)]
    Plan(Box<plan::PlanError>),
    /// The `--spine` choice does not match the model directory.
    #[error("{dir}: {reason}")]
    Spine {
        /// The model directory.
        dir: std::path::PathBuf,
        /// What does not match, and what to do.
        reason: String,
    },
    /// A charge to the memory budget was refused.
    #[error(transparent)]
    Budget(sluice_core::BudgetError),
    /// A `sluice pull` install that cannot be opened.
    #[error("{dir}: {reason}")]
    Install {
        /// The model directory.
        dir: std::path::PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The draft model failed to open.
    #[error(transparent)]
    Draft(#[from] draft_model::DraftError),
    /// No prompt tokens.
    #[error("empty prompt: give at least one token")]
    EmptyPrompt,
    /// A prompt id is not in the vocabulary.
    #[error("prompt token id {id} is out of vocabulary (the model has {vocab} tokens)")]
    TokenOutOfVocab {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
}

impl From<Box<plan::PlanError>> for EngineError {
    fn from(e: Box<plan::PlanError>) -> Self {
        EngineError::Plan(e)
    }
}

impl From<plan::PlanError> for EngineError {
    fn from(e: plan::PlanError) -> Self {
        Self::Plan(Box::new(e))
    }
}
