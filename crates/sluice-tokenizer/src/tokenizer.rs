//! The Kimi tokenizer: rank BPE (`tiktoken.model`) plus added special tokens
//! (`tokenizer_config.json`), with `tokenization_kimi.py`'s pre-tokenizer and length splitting.
//!
//! Ids `0..num_ranks()` are BPE tokens; added tokens (Kimi K3: 256 reserved specials) follow.
//! [`Tokenizer::encode_ordinary`] never produces an added token: text that spells one, such as a
//! user typing `<|open|>`, is encoded as ordinary bytes. Structural tokens are inserted by id by
//! the code that builds prompts (see [`crate::chat`]), never recognised in text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::bpe::CoreBpe;
use crate::error::{Error, Result};
use crate::load::{self, AddedToken};
use crate::pretokenize::{kimi_chunks, K3_PATTERN};
use crate::stream::StreamDecoder;

/// File name of the rank file in a checkpoint directory.
pub const RANK_FILE: &str = "tiktoken.model";
/// File name of the tokenizer config in a checkpoint directory.
pub const CONFIG_FILE: &str = "tokenizer_config.json";

/// A loaded Kimi tokenizer. Cheap to share by reference; all methods take `&self`.
#[derive(Debug)]
pub struct Tokenizer {
    bpe: CoreBpe,
    /// Added tokens by id. A map, not a table: a hostile config could name id 4,000,000,000.
    added: HashMap<u32, AddedToken>,
    added_ids: HashMap<String, u32>,
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads `dir/tiktoken.model` and `dir/tokenizer_config.json` with Kimi K3's pre-tokenizer.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        Self::from_files(&dir.join(RANK_FILE), &dir.join(CONFIG_FILE))
    }

    /// Loads a rank file and a tokenizer config from explicit paths.
    pub fn from_files(rank_file: &Path, config_file: &Path) -> Result<Self> {
        let ranks = load::read_rank_file(rank_file)?;
        let added = load::read_added_tokens(config_file, ranks.len())?;
        let bpe = CoreBpe::new(ranks, K3_PATTERN, rank_file)?;
        Self::from_parts(bpe, added)
    }

    /// Builds a tokenizer from a BPE vocabulary and added tokens. Ids must lie at or above the
    /// BPE ranks and spellings must be unique; violations are reported against the path
    /// `<added tokens>` (the file loaders report the real file).
    pub fn from_parts(bpe: CoreBpe, added_tokens: Vec<(u32, AddedToken)>) -> Result<Self> {
        let num_ranks = bpe.num_ranks();
        let path = || PathBuf::from("<added tokens>");
        let mut added: HashMap<u32, AddedToken> = HashMap::with_capacity(added_tokens.len());
        let mut added_ids: HashMap<String, u32> = HashMap::with_capacity(added_tokens.len());
        let mut vocab_size = num_ranks;
        for (id, token) in added_tokens {
            let index = usize::try_from(id).unwrap_or(usize::MAX);
            if index < num_ranks {
                return Err(Error::AddedIdInRankRange {
                    path: path(),
                    id,
                    content: token.content,
                    num_ranks,
                });
            }
            let clash =
                added_ids.get(&token.content).copied().or(added.contains_key(&id).then_some(id));
            if let Some(other) = clash {
                return Err(Error::DuplicateAddedToken {
                    path: path(),
                    content: token.content,
                    first: other.min(id),
                    second: other.max(id),
                });
            }
            vocab_size = vocab_size.max(index.saturating_add(1));
            added_ids.insert(token.content.clone(), id);
            added.insert(id, token);
        }
        Ok(Self { bpe, added, added_ids, vocab_size })
    }

    /// The BPE core, for plain-tiktoken encoding without Kimi's length splitting.
    pub fn bpe(&self) -> &CoreBpe {
        &self.bpe
    }

    /// Number of ids: one past the largest id (BPE ranks, then added tokens; gaps between added
    /// tokens count but decode to an error).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Number of BPE ranks; ids below this are BPE tokens.
    pub fn num_ranks(&self) -> usize {
        self.bpe.num_ranks()
    }

    /// Encodes text as `tokenization_kimi.py` does with special tokens disallowed: split into
    /// 400,000-character slices and runs of at most 25,000 characters
    /// ([`crate::pretokenize::kimi_chunks`]), then tiktoken's ordinary encoding of each piece.
    /// Spellings of special tokens in `text` are encoded as ordinary text.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_ordinary_into(text, &mut out);
        out
    }

    /// Appends the encoding of `text` to `out` (see [`Tokenizer::encode_ordinary`]).
    pub fn encode_ordinary_into(&self, text: &str, out: &mut Vec<u32>) {
        for chunk in kimi_chunks(text) {
            self.bpe.encode_into(chunk, out);
        }
    }

    /// Encodes a rendered chat prompt as tiktoken does with every added token allowed
    /// (`encode(text, allowed_special="all")`, what Kimi K2's `apply_chat_template` tokenizes
    /// with): each added token spelled in `text` becomes its id (the longest at the leftmost
    /// position), and the text between them is encoded as by [`Tokenizer::encode_ordinary`].
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut rest = text;
        loop {
            let next = self
                .added_ids
                .iter()
                .filter_map(|(s, &id)| {
                    rest.find(s.as_str()).map(|at| (at, std::cmp::Reverse(s.len()), id))
                })
                .min();
            let Some((at, std::cmp::Reverse(len), id)) = next else { break };
            self.encode_ordinary_into(&rest[..at], &mut out);
            out.push(id);
            rest = &rest[at + len..];
        }
        self.encode_ordinary_into(rest, &mut out);
        out
    }

    /// The id of the added token spelled `spelling`, e.g. `special_id("<|open|>")`.
    pub fn special_id(&self, spelling: &str) -> Option<u32> {
        self.added_ids.get(spelling).copied()
    }

    /// The added token with this id, if `id` is one.
    pub fn added_token(&self, id: u32) -> Option<&AddedToken> {
        self.added.get(&id)
    }

    /// Whether `id` is an added token marked `special` (Kimi K3: all 256 reserved tokens).
    pub fn is_special(&self, id: u32) -> bool {
        self.added_token(id).is_some_and(|t| t.special)
    }

    /// The bytes of one token: BPE bytes, or an added token's spelling.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        if let Some(bytes) = self.bpe.token_bytes(id) {
            return Ok(bytes);
        }
        match self.added_token(id) {
            Some(token) => Ok(token.content.as_bytes()),
            None => Err(Error::UnknownId { id, vocab_size: self.vocab_size() }),
        }
    }

    /// Decodes ids to bytes; added tokens become their spelling. BPE tokens can end inside a
    /// UTF-8 sequence, so the result is bytes; see [`Tokenizer::decode_lossy`].
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Decodes ids to text, replacing each invalid UTF-8 sequence with U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode(ids)?).into_owned())
    }

    /// An incremental decoder for streaming output; see [`StreamDecoder`].
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}
