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

use std::collections::HashMap;
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
    /// Added tokens by id: spelling and whether they are special.
    added: HashMap<u32, (String, bool)>,
    /// Whether the decoder is `ByteLevel`, so that a BPE token's spelling maps back to bytes.
    byte_level: bool,
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
        let added = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, (t.content, t.special)))
            .collect();
        let byte_level =
            matches!(inner.get_decoder(), Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_)));
        Ok(Self { inner, path, vocab_size, added, byte_level })
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

    /// Encodes `text` as ordinary text: the normalizer, pre-tokenizer and model of the file, with
    /// no added token matched (a spelled `<|im_end|>` is the BPE tokens of its characters, as
    /// a model writes it inside a string) and nothing added. Grammar literals and forced text are
    /// encoded so: the ids of an added token would be a marker, not the text.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>, HfError> {
        use tokenizers::{Model, Normalizer, PreTokenizer};
        let err = |source| HfError::Encode { len: text.len(), source };
        let mut normalized = tokenizers::NormalizedString::from(text);
        if let Some(n) = self.inner.get_normalizer() {
            n.normalize(&mut normalized).map_err(err)?;
        }
        let mut pre = tokenizers::PreTokenizedString::from(normalized);
        if let Some(p) = self.inner.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(err)?;
        }
        let mut ids = Vec::new();
        let splits =
            pre.get_splits(tokenizers::OffsetReferential::Normalized, tokenizers::OffsetType::Byte);
        for (piece, _, _) in splits {
            let tokens = self.inner.get_model().tokenize(piece).map_err(err)?;
            ids.extend(tokens.iter().map(|t| t.id));
        }
        Ok(ids)
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

    /// Whether `id` is an added token (special or not: Qwen3's `<think>` is not special).
    pub fn is_added(&self, id: u32) -> bool {
        self.added.contains_key(&id)
    }

    /// Whether `id` is an added token marked `special` (skipped by
    /// `decode(_, skip_special_tokens = true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.added.get(&id).is_some_and(|t| t.1)
    }

    /// The raw bytes of one token: an added token's spelling, or, under a `ByteLevel` decoder,
    /// the bytes its BPE spelling stands for. Unlike [`HfTokenizer::decode`], which returns a
    /// `String`, this keeps a token that ends inside a UTF-8 sequence exact (a multi-byte
    /// character split over two tokens). Without a `ByteLevel` decoder the token is decoded
    /// alone, which is exact for tokenizers whose tokens are whole characters.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, HfError> {
        if let Some((content, _)) = self.added.get(&id) {
            return Ok(content.as_bytes().to_vec());
        }
        let unknown = || HfError::UnknownId { id, vocab: self.vocab_size };
        let spelling = self.inner.id_to_token(id).ok_or_else(unknown)?;
        if !self.byte_level {
            return self.decode(&[id], false).map(String::into_bytes);
        }
        // ByteLevel (GPT-2 `bytes_to_unicode`): every byte is spelled by one printable char.
        spelling.chars().map(|c| byte_of_char(c).ok_or_else(unknown)).collect()
    }
}

/// The byte GPT-2's `bytes_to_unicode` spells as `c`: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes are shifted to U+0100.. in byte order.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let cp = u32::from(c);
    if cp < 0x100 {
        return printable(cp).then(|| u8::try_from(cp).ok()).flatten();
    }
    // The n-th non-printable byte (in byte order) is spelled U+0100 + n.
    let n = cp - 0x100;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(usize::try_from(n).ok()?)
        .and_then(|b| u8::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::byte_of_char;

    #[test]
    fn byte_level_alphabet_round_trips() {
        // Space is the 33rd non-printable byte (after 0x00..=0x20's first 32): spelled 'Ġ'.
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('\u{00ad}'), None, "0xAD is spelled U+0143, not itself");
        assert_eq!(byte_of_char('Ń'), Some(0xad));
        let mut seen: Vec<u8> =
            (0x21u32..0x200).filter_map(|c| char::from_u32(c).and_then(byte_of_char)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 256, "every byte has exactly one spelling");
    }
}
