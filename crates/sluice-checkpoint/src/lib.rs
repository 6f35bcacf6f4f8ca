//! Hugging Face checkpoint directories as sluice reads and writes them.
//!
//! A checkpoint directory holds `config.json`, either one `model.safetensors` or a set of
//! shards named by `model.safetensors.index.json`, and tokenizer files. This crate opens such
//! a directory once, validates every shard header against a hostile-input threat model
//! (lengths, offsets, overlaps, dtype × shape arithmetic, path traversal in the index), and
//! builds one typed manifest of every tensor: name, shard, dtype, shape, absolute offset and
//! length. Everything downstream (the expert store, the model ports) asks this manifest for
//! tensors and never re-parses a header or formats a name on the hot path.
//!
//! The writing half ([`writer`]) produces the same layout atomically (temporary file, fsync,
//! rename) for the `sluice synth` command, the built-in demo model and the test fixtures.
//!
//! Every failure is a [`CheckpointError`] variant that names the file (and the tensor when
//! one is involved), so a corrupt download says exactly where it is corrupt.

use std::path::PathBuf;

use sluice_core::DType;

pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod safetensors;
pub mod verify;
pub mod writer;

pub use checkpoint::{Checkpoint, TensorEntry, INDEX_FILE, LANGUAGE_MODEL_PREFIX, SINGLE_FILE};
pub use config::{CheckpointConfig, CONFIG_FILE};
pub use convert::{convert_spine_int8, ConvertError, ConvertOptions, ConvertReport};
pub use safetensors::{parse_header, read_header, SafetensorsHeader, TensorInfo, MAX_HEADER_LEN};
pub use writer::{
    remove_stale_temps, write_index, write_json_atomic, write_safetensors, writer_is_gone,
    ShardWriter, TensorData, TensorSpec,
};

/// Everything that can go wrong reading or writing a checkpoint directory.
///
/// Variants carry the file (or directory) they concern and, where one is involved, the
/// tensor name, so a message alone is enough to find the problem.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An operating-system I/O error on `path`.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is too short to hold even the 8-byte header length.
    #[error("{path}: file is {len} bytes, too short for a safetensors header length")]
    FileTooShort {
        /// The shard file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The header length prefix is zero.
    #[error("{path}: safetensors header length is 0")]
    HeaderEmpty {
        /// The shard file.
        path: PathBuf,
    },
    /// The header length prefix exceeds [`MAX_HEADER_LEN`].
    #[error("{path}: safetensors header length {len} exceeds the {MAX_HEADER_LEN}-byte limit")]
    HeaderTooLarge {
        /// The shard file.
        path: PathBuf,
        /// The header length the file claims.
        len: u64,
    },
    /// The header length prefix points past the end of the file.
    #[error(
        "{path}: safetensors header of {len} bytes runs past the end of the {file_len}-byte file"
    )]
    HeaderPastEnd {
        /// The shard file.
        path: PathBuf,
        /// The header length the file claims.
        len: u64,
        /// The actual file length.
        file_len: u64,
    },
    /// The header is not valid UTF-8.
    #[error("{path}: safetensors header is not valid UTF-8 (first bad byte at header offset {valid_up_to})")]
    HeaderNotUtf8 {
        /// The shard file.
        path: PathBuf,
        /// Length of the valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// A JSON file (header, `config.json`, index) does not parse; the source names line and column.
    #[error("{path}: invalid JSON: {source}")]
    BadJson {
        /// The file holding the JSON.
        path: PathBuf,
        /// serde's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON document is valid but not the shape this file must have.
    #[error("{path}: {reason}")]
    BadStructure {
        /// The file holding the JSON.
        path: PathBuf,
        /// What is wrong, in words.
        reason: String,
    },
    /// A header entry for one tensor is malformed (missing field, wrong type).
    #[error("{path}: tensor {tensor:?}: malformed header entry: {source}")]
    BadEntry {
        /// The shard file.
        path: PathBuf,
        /// The tensor whose entry is malformed.
        tensor: String,
        /// serde's description of the problem.
        #[source]
        source: serde_json::Error,
    },
    /// The `__metadata__` entry is not a string-to-string map.
    #[error("{path}: __metadata__ must map strings to strings: {source}")]
    BadMetadata {
        /// The shard file.
        path: PathBuf,
        /// serde's description of the problem.
        #[source]
        source: serde_json::Error,
    },
    /// A tensor's dtype is not one sluice knows.
    #[error("{path}: tensor {tensor:?} has unknown dtype {dtype:?}")]
    UnknownDType {
        /// The shard file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype string as written.
        dtype: String,
    },
    /// A tensor's `data_offsets` begin after they end.
    #[error("{path}: tensor {tensor:?} has data_offsets [{begin}, {end}] with begin > end")]
    OffsetsReversed {
        /// The shard file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Offset of the first byte within the data section.
        begin: u64,
        /// Offset one past the last byte within the data section.
        end: u64,
    },
    /// A tensor's data runs past the end of the data section (a truncated file, usually).
    #[error("{path}: tensor {tensor:?} ends at data offset {end} but the data section is {data_len} bytes (truncated file?)")]
    OffsetsPastEnd {
        /// The shard file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The end offset the header claims.
        end: u64,
        /// The data section's actual length.
        data_len: u64,
    },
    /// The product of a tensor's shape, times its element size, overflows u64.
    #[error("{path}: tensor {tensor:?}: shape {shape:?} × element size overflows")]
    ShapeOverflow {
        /// The shard file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape as written.
        shape: Vec<u64>,
    },
    /// A tensor's byte range does not match dtype size × number of elements.
    #[error("{path}: tensor {tensor:?}: dtype × shape needs {expected} bytes, found {got}")]
    LengthMismatch {
        /// The shard file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Bytes required by dtype × shape.
        expected: u64,
        /// Bytes given by the offsets (or supplied to the writer).
        got: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("{path}: tensors {a:?} and {b:?} overlap")]
    Overlap {
        /// The shard file.
        path: PathBuf,
        /// The tensor that starts first.
        a: String,
        /// The tensor that starts inside `a`.
        b: String,
    },
    /// A tensor name appears twice in one header or in two shards.
    #[error("tensor {tensor:?} appears in {first} and again in {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// Where it was seen first.
        first: PathBuf,
        /// Where it was seen again (the same file for a repeated header key).
        second: PathBuf,
    },
    /// `config.json` is missing from the checkpoint directory.
    #[error("{dir}: no config.json")]
    MissingConfig {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// `config.json` has no `architectures` list (neither at top level nor in `text_config`).
    #[error("{path}: no \"architectures\" list")]
    MissingArchitectures {
        /// The config file.
        path: PathBuf,
    },
    /// The directory has neither `model.safetensors.index.json` nor `model.safetensors`.
    #[error("{dir}: no model.safetensors.index.json and no model.safetensors")]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// The index names a shard that is not a plain file name inside the directory.
    #[error("{index}: shard name {shard:?} is not a plain file name in the checkpoint directory")]
    UnsafeShardName {
        /// The index file.
        index: PathBuf,
        /// The offending shard name.
        shard: String,
    },
    /// The index names a shard file that does not exist.
    #[error("{dir}: shard {shard:?} (holding e.g. {tensor_example:?}) does not exist")]
    MissingShard {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The missing shard's file name.
        shard: String,
        /// One tensor the index places in that shard.
        tensor_example: String,
    },
    /// The index places a tensor in a shard whose header does not contain it.
    #[error("{shard}: the index places tensor {tensor:?} here but the shard header lacks it")]
    TensorNotInShard {
        /// The shard file the index names.
        shard: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// A tensor was asked for that the checkpoint does not contain.
    #[error("{dir}: no tensor {tensor:?}")]
    MissingTensor {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor asked for.
        tensor: String,
    },
    /// A tensor lies in a range this checkpoint does not map: a routed expert of a stream
    /// install's sparse shard, which only the expert store reads (see
    /// [`Checkpoint::open_with_shards`]).
    #[error(
        "{file}: tensor {tensor:?} is not held in this file (a routed expert of a stream \
         install: only the streaming expert store reads it)"
    )]
    NotMapped {
        /// The shard file.
        file: PathBuf,
        /// The tensor asked for.
        tensor: String,
    },
    /// A tensor has a different dtype than the model expects.
    #[error("{file}: tensor {tensor:?} has dtype {got}, expected {expected}")]
    DTypeMismatch {
        /// The shard file holding the tensor.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype the caller expects.
        expected: DType,
        /// The dtype in the file.
        got: DType,
    },
    /// A tensor has a different shape than the model expects.
    #[error("{file}: tensor {tensor:?} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The shard file holding the tensor.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape the caller expects.
        expected: Vec<u64>,
        /// The shape in the file.
        got: Vec<u64>,
    },
    /// A writer was given a tensor it cannot write (bad name, wrong order, too many bytes).
    #[error("{path}: cannot write tensor {tensor:?}: {reason}")]
    WriteRejected {
        /// The file being written.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong, in words.
        reason: String,
    },
    /// [`ShardWriter::finish`] was called before every declared tensor was fully written.
    #[error("{path}: finished after {written} of {total} tensors were fully written")]
    WriteIncomplete {
        /// The file being written.
        path: PathBuf,
        /// Tensors fully written.
        written: usize,
        /// Tensors declared.
        total: usize,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

impl CheckpointError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
