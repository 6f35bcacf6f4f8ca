//! Hugging Face `tokenizer.json` tokenizers (Qwen3 and other byte-level BPE checkpoints), through
//! the `tokenizers` crate: the same Rust code that Python's `tokenizers` and transformers'
//! fast tokenizers run, so ids and decoded text equal theirs.
//!
//! The crate is built without default features: its regexes run on `fancy-regex` (pure Rust)
//! instead of Oniguruma, and the C++ suffix-array trainer is left out, so nothing here needs a C
//! compiler. The goldens in `tests/fixtures/qwen3/*/golden.json` (`tokenizer_cases`, from Python
//! `tokenizers`) check that this changes no result.
//!
//! Kimi K3's `tiktoken.model` tokenizer is [`crate::Tokenizer`]; this type serves the checkpoints
//! that ship a `tokenizer.json`, such as a Qwen3 draft model, whose text the engine re-encodes
//! with the target's tokenizer.

use std::path::{Path, PathBuf};

/// File name of the tokenizer in a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The `tokenizers` crate's boxed error.
type TkError = Box<dyn std::error::Error + Send + Sync>;

/// Errors from loading or running a `tokenizer.json` tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a tokenizer the `tokenizers` crate (as built here) can load.
    #[error("{path}: not a usable tokenizer.json: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the `tokenizers` crate reported.
        source: TkError,
    },
    /// The pipeline failed on some text (for example a regex that exceeded its backtracking
    /// limit).
    #[error("cannot encode text of {len} bytes: {source}")]
    Encode {
        /// Length of the input in bytes.
        len: usize,
        /// What the `tokenizers` crate reported.
        source: TkError,
    },
    /// A token id is outside the vocabulary (added tokens included).
    #[error("token id {id} is out of range for a tokenizer of {vocab} ids")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// Vocabulary size, added tokens included.
        vocab: usize,
    },
    /// The decoder pipeline failed.
    #[error("cannot decode {count} ids: {source}")]
    Decode {
        /// Number of ids given.
        count: usize,
        /// What the `tokenizers` crate reported.
        source: TkError,
    },
}

/// A loaded `tokenizer.json`. All methods take `&self`; share it by reference or `Arc`.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    vocab_size: usize,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, HfError> {
        Self::from_file(dir.as_ref().join(TOKENIZER_FILE))
    }

    /// Loads a `tokenizer.json` from an explicit path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HfError> {
        let path = path.as_ref().to_path_buf();
        let bytes =
            std::fs::read(&path).map_err(|source| HfError::Io { path: path.clone(), source })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses `tokenizer.json` bytes; `path` is only used to name the source in errors.
    pub fn from_bytes(bytes: &[u8], path: impl Into<PathBuf>) -> Result<Self, HfError> {
        let path = path.into();
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|source| HfError::Parse { path: path.clone(), source })?;
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self { inner, path, vocab_size })
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of ids, added tokens included (`len(tokenizer)` in transformers). A model's
    /// `vocab_size` may be larger: Qwen3 pads its embedding past the tokenizer.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Encodes `text` as Python's `Tokenizer.encode(text, add_special_tokens=...)` does: the
    /// normalizer, pre-tokenizer, model and post-processor of the file. Added tokens spelled in
    /// the text (`<|im_start|>`, `<think>`) become their ids, as in transformers.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, HfError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|source| HfError::Encode { len: text.len(), source })
    }

    /// Decodes `ids` as Python's `Tokenizer.decode(ids, skip_special_tokens=...)` does. Unlike
    /// the `tokenizers` crate, which drops unknown ids silently, an id outside the vocabulary is
    /// an error: it would mean a model emitted a padding row of its embedding.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, HfError> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(HfError::UnknownId { id, vocab: self.vocab_size });
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| HfError::Decode { count: ids.len(), source })
    }

    /// The id of a token spelled exactly `token` (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The spelling of `id` in the vocabulary (byte-level form for BPE tokens).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is an added token marked `special` (skipped by
    /// `decode(_, skip_special_tokens = true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special)
    }
}
