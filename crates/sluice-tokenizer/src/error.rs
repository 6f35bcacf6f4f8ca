//! The crate's error type.
//!
//! Loading errors name the file and, for `tiktoken.model`, the 1-based line, so a bad download
//! is found without a debugger. Encoding never fails (every `&str` has an encoding); decoding
//! and chat rendering fail only on inputs a caller controls: an id outside the vocabulary, a
//! tokenizer without the chat markers, an unsupported option, an unresolvable tool message.

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A `tiktoken.model` line is not `base64 rank`.
    #[error("{path}:{line}: expected `<base64 token> <rank>`, found {found:?}")]
    MalformedLine {
        /// The rank file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending line (cut to 80 characters).
        found: String,
    },
    /// The token field of a `tiktoken.model` line is not valid base64, or decodes to nothing.
    #[error("{path}:{line}: bad base64 token {token:?}: {reason}")]
    BadBase64 {
        /// The rank file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The token field (cut to 80 characters).
        token: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The rank field of a `tiktoken.model` line is not a `u32`.
    #[error("{path}:{line}: bad rank {rank:?}")]
    BadRank {
        /// The rank file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The rank field (cut to 80 characters).
        rank: String,
    },
    /// Two lines of a `tiktoken.model` give the same rank.
    #[error("{path}:{line}: rank {rank} was already given on line {first_line}")]
    DuplicateRank {
        /// The rank file.
        path: PathBuf,
        /// 1-based line number of the second occurrence.
        line: usize,
        /// The repeated rank.
        rank: u32,
        /// 1-based line number of the first occurrence.
        first_line: usize,
    },
    /// Two lines of a `tiktoken.model` rank the same bytes.
    #[error("{path}:{line}: these token bytes were already ranked on line {first_line}")]
    DuplicateToken {
        /// The rank file.
        path: PathBuf,
        /// 1-based line number of the second occurrence.
        line: usize,
        /// 1-based line number of the first occurrence.
        first_line: usize,
    },
    /// The ranks of a `tiktoken.model` are not exactly `0..N`.
    #[error(
        "{path}: ranks must be contiguous from 0: {count} tokens but rank {missing} is absent"
    )]
    RanksNotContiguous {
        /// The rank file.
        path: PathBuf,
        /// Number of tokens in the file.
        count: usize,
        /// The smallest rank below `count` that no line gives.
        missing: u32,
    },
    /// A byte that valid UTF-8 can contain has no rank, so some text could not be encoded.
    #[error(
        "{path}: byte {byte:#04x} has no rank; a byte-level vocabulary ranks every single byte"
    )]
    MissingByte {
        /// The rank file.
        path: PathBuf,
        /// The byte without a rank.
        byte: u8,
    },
    /// `tokenizer_config.json` is not the JSON this crate expects.
    #[error("{path}: {source}")]
    Json {
        /// The config file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// An `added_tokens_decoder` key is not a token id.
    #[error("{path}: added token id {id:?} is not a u32")]
    BadAddedId {
        /// The config file.
        path: PathBuf,
        /// The key as written.
        id: String,
    },
    /// An added token's id falls inside the BPE rank range.
    #[error("{path}: added token {id} ({content:?}) lies inside the BPE ranks 0..{num_ranks}")]
    AddedIdInRankRange {
        /// The config file.
        path: PathBuf,
        /// The token id.
        id: u32,
        /// Its spelling.
        content: String,
        /// Number of BPE ranks.
        num_ranks: usize,
    },
    /// Two added tokens share a spelling, so `special_id` would be ambiguous.
    #[error("{path}: added tokens {first} and {second} are both spelled {content:?}")]
    DuplicateAddedToken {
        /// The config file.
        path: PathBuf,
        /// The spelling.
        content: String,
        /// The smaller id.
        first: u32,
        /// The larger id.
        second: u32,
    },
    /// The vocabulary would not fit in `u32` ids.
    #[error("vocabulary of {0} tokens does not fit u32 ids")]
    VocabTooLarge(usize),
    /// The pre-tokenizer pattern does not compile.
    #[error("pre-tokenizer pattern: {0}")]
    Pattern(#[from] Box<fancy_regex::Error>),
    /// A token id is not in the vocabulary.
    #[error("token id {id} is not in the vocabulary (size {vocab_size})")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// The tokenizer lacks a special token a chat format needs.
    #[error("the tokenizer has no special token {0:?}")]
    MissingSpecial(String),
    /// A thinking effort the chat format does not support.
    #[error("unsupported thinking effort {0:?}; supported values are low, high and max")]
    UnsupportedEffort(String),
    /// A tool message whose tool name cannot be found.
    #[error(
        "message {message}: a tool message needs a name, or must match a preceding assistant \
         tool call by id or by order"
    )]
    UnresolvedToolName {
        /// 0-based index of the message in the conversation.
        message: usize,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
