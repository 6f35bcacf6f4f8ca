//! One tokenizer type for every family, chosen from the files a checkpoint ships:
//! `tokenizer.json` (Qwen3, Qwen3-MoE, GPT-OSS: through the `tokenizers` crate) or
//! `tiktoken.model` + `tokenizer_config.json` (Kimi K3: [`Tokenizer`]). A checkpoint with both
//! uses `tiktoken.model`, so Kimi checkpoints keep their reference tokenizer.
//!
//! Encoding of plain prompt text follows each family's reference: K3 encodes text as ordinary
//! tokens (`tokenization_kimi.py` with specials disallowed); a `tokenizer.json` encodes as
//! Python `Tokenizer.encode(text)` does, so added tokens spelled in the text become their ids,
//! as in transformers. The stop ids come from the checkpoint: K3's `<|end_of_msg|>`; otherwise
//! `eos_token` of `tokenizer_config.json` and `eos_token_id` of `generation_config.json` and
//! `config.json` (gpt-oss lists `<|return|>`, `<|endoftext|>` and `<|call|>` there).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::hf::{HfError, HfTokenizer, TOKENIZER_FILE};
use crate::stream::TokRef;
use crate::tokenizer::{Tokenizer, CONFIG_FILE, RANK_FILE};

/// Errors from loading or running an [`AnyTokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum AnyError {
    /// The `tiktoken.model` tokenizer failed.
    #[error(transparent)]
    Tiktoken(#[from] crate::Error),
    /// The `tokenizer.json` tokenizer failed.
    #[error(transparent)]
    Hf(#[from] HfError),
    /// A config file the stop ids come from is unreadable.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A checkpoint's tokenizer, whichever form it ships.
#[derive(Debug)]
pub enum AnyTokenizer {
    /// `tiktoken.model` + `tokenizer_config.json` (Kimi K3).
    Tiktoken(Arc<Tokenizer>),
    /// `tokenizer.json`.
    Hf(Box<HfTokenizer>),
}

impl AnyTokenizer {
    /// The tokenizer files `from_dir` looks for, for error messages.
    pub const FILES: &'static str = "tokenizer.json, or tiktoken.model with tokenizer_config.json";

    /// Loads the tokenizer `dir` ships; `Ok(None)` when it ships none (a checkpoint run from
    /// token ids). Broken files are an error.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, AnyError> {
        if dir.join(RANK_FILE).exists() {
            return Ok(Some(Self::Tiktoken(Arc::new(Tokenizer::from_dir(dir)?))));
        }
        if dir.join(TOKENIZER_FILE).exists() {
            return Ok(Some(Self::Hf(Box::new(HfTokenizer::from_dir(dir)?))));
        }
        Ok(None)
    }

    /// The Kimi tokenizer, when this is one (the K3 chat renderer and draft models need it).
    pub fn tiktoken(&self) -> Option<&Arc<Tokenizer>> {
        match self {
            Self::Tiktoken(t) => Some(t),
            Self::Hf(_) => None,
        }
    }

    /// Encodes prompt text (see the module docs for each form's rules).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, AnyError> {
        match self {
            Self::Tiktoken(t) => Ok(t.encode_ordinary(text)),
            Self::Hf(t) => Ok(t.encode(text, true)?),
        }
    }

    /// Encodes a rendered chat prompt: markers spelled in it become their ids, and nothing is
    /// added (transformers' `apply_chat_template(tokenize=True)` encodes with
    /// `add_special_tokens=False`; a tiktoken model, Kimi K2's, with every special allowed).
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, AnyError> {
        match self {
            Self::Tiktoken(t) => Ok(t.encode_with_specials(text)),
            Self::Hf(t) => Ok(t.encode(text, false)?),
        }
    }

    /// Decodes ids to text with special tokens spelled out; invalid UTF-8, and ids outside a
    /// `tokenizer.json` vocabulary, become U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32]) -> Result<String, AnyError> {
        match self {
            Self::Tiktoken(t) => Ok(t.decode_lossy(ids)?),
            Self::Hf(t) => {
                let mut bytes = Vec::new();
                for &id in ids {
                    // An id past the tokenizer (Qwen3 pads its embedding past it) has no text:
                    // shown as U+FFFD, as this method does for invalid UTF-8, rather than failing
                    // a whole run over one token.
                    match t.token_bytes(id) {
                        Ok(b) => bytes.extend(b),
                        Err(HfError::UnknownId { .. }) => bytes.extend("\u{fffd}".as_bytes()),
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// The bytes of one token, special tokens spelled out; an id outside a `tokenizer.json`
    /// vocabulary is U+FFFD (as in [`Self::decode_lossy`]).
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, AnyError> {
        match self {
            Self::Tiktoken(t) => Ok(t.token_bytes(id)?.to_vec()),
            Self::Hf(t) => match t.token_bytes(id) {
                Ok(b) => Ok(b),
                Err(HfError::UnknownId { .. }) => Ok("\u{fffd}".as_bytes().to_vec()),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// A decoder that turns ids into text at UTF-8 boundaries, special tokens spelled out;
    /// everything it yields equals [`Self::decode_lossy`] of the same ids.
    pub fn stream_decoder(&self) -> AnyStreamDecoder<'_> {
        AnyStreamDecoder { tok: TokRef::Borrowed(self), pending: Vec::new() }
    }

    /// [`Self::stream_decoder`] owning a share of the tokenizer.
    pub fn shared_stream_decoder(self: &Arc<Self>) -> AnyStreamDecoder<'static> {
        AnyStreamDecoder { tok: TokRef::Shared(Arc::clone(self)), pending: Vec::new() }
    }

    /// Every id's entry for a grammar engine's vocabulary index, `(bytes, added)`: a BPE token's
    /// bytes, or an added token's spelling flagged `added` (a grammar names those as markers and
    /// keeps them out of free text); an id with no token (a gap between added tokens) has no
    /// bytes.
    pub fn vocab_entries(&self) -> Vec<(Vec<u8>, bool)> {
        match self {
            Self::Tiktoken(t) => (0..t.vocab_size())
                .map(|id| {
                    let id = u32::try_from(id).unwrap_or(u32::MAX);
                    match t.added_token(id) {
                        Some(a) => (a.content.as_bytes().to_vec(), true),
                        None => (t.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default(), false),
                    }
                })
                .collect(),
            Self::Hf(t) => (0..t.vocab_size())
                .map(|id| {
                    let id = u32::try_from(id).unwrap_or(u32::MAX);
                    (t.token_bytes(id).unwrap_or_default(), t.is_added(id))
                })
                .collect(),
        }
    }

    /// Encodes text as ordinary text, adding nothing and matching no added token (the literals
    /// of a grammar, text a grammar forces): K3's ordinary encoding; a `tokenizer.json`'s
    /// pipeline without its added vocabulary or post-processor
    /// ([`HfTokenizer::encode_ordinary`]). A spelled marker is its characters' tokens, never the
    /// marker's id.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, AnyError> {
        match self {
            Self::Tiktoken(t) => Ok(t.encode_ordinary(text)),
            Self::Hf(t) => Ok(t.encode_ordinary(text)?),
        }
    }

    /// The id of the added token spelled exactly `spelling`, if there is one (a chat format's
    /// markers are added tokens in the published tokenizers; a tiny test tokenizer may spell
    /// some as text).
    pub fn added_id(&self, spelling: &str) -> Option<u32> {
        match self {
            Self::Tiktoken(t) => t.special_id(spelling),
            Self::Hf(t) => t.token_to_id(spelling).filter(|&id| t.is_added(id)),
        }
    }

    /// The id of the token spelled exactly `spelling` (an added token, or a whole vocabulary
    /// entry for `tokenizer.json`).
    pub fn token_id(&self, spelling: &str) -> Option<u32> {
        match self {
            Self::Tiktoken(t) => t.special_id(spelling),
            Self::Hf(t) => t.token_to_id(spelling),
        }
    }

    /// The ids generation stops at, read from the checkpoint in `dir` (see the module docs).
    pub fn stop_ids(&self, dir: &Path) -> Result<Vec<u32>, AnyError> {
        let mut ids = Vec::new();
        if let Self::Tiktoken(t) = self {
            // K3's `<|end_of_msg|>`; a tiktoken model without it (Kimi K2) names its stop
            // tokens in the config files like any other.
            if let Ok(id) = crate::chat::k3_stop_id(t) {
                ids.push(id);
                return Ok(ids);
            }
        }
        let config = read_json(&dir.join(CONFIG_FILE))?;
        let eos = config.as_ref().and_then(|c| c.get("eos_token"));
        let spelling = match eos {
            Some(serde_json::Value::String(s)) => Some(s.as_str()),
            Some(v) => v.get("content").and_then(|c| c.as_str()),
            None => None,
        };
        ids.extend(spelling.and_then(|s| self.token_id(s)));
        for file in ["generation_config.json", "config.json"] {
            let value = read_json(&dir.join(file))?;
            match value.as_ref().and_then(|v| v.get("eos_token_id")) {
                Some(serde_json::Value::Array(list)) => {
                    ids.extend(list.iter().filter_map(|v| u32::try_from(v.as_u64()?).ok()));
                }
                Some(v) => ids.extend(v.as_u64().and_then(|i| u32::try_from(i).ok())),
                None => {}
            }
        }
        let mut seen = Vec::new();
        ids.retain(|id| {
            let new = !seen.contains(id);
            seen.push(*id);
            new
        });
        Ok(ids)
    }
}

/// Incremental decoding for any tokenizer ([`AnyTokenizer::stream_decoder`]).
#[derive(Debug)]
pub struct AnyStreamDecoder<'a> {
    tok: TokRef<'a, AnyTokenizer>,
    pending: Vec<u8>,
}

impl AnyStreamDecoder<'_> {
    /// Adds one token; returns the text that became complete (an unknown id is U+FFFD).
    pub fn push(&mut self, id: u32) -> String {
        match self.tok.token_bytes(id) {
            Ok(b) => self.pending.extend(b),
            Err(_) => self.pending.extend("\u{fffd}".as_bytes()),
        }
        crate::stream::drain_utf8(&mut self.pending)
    }

    /// Ends the stream: an incomplete character is U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// A JSON file's contents, `None` when it does not exist.
fn read_json(path: &Path) -> Result<Option<serde_json::Value>, AnyError> {
    if !path.exists() {
        return Ok(None);
    }
    let err = |reason: String| AnyError::Config { path: path.to_path_buf(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map(Some).map_err(|e| err(e.to_string()))
}
