//! Opening a checkpoint directory into one validated tensor manifest.
//!
//! [`Checkpoint::open`] reads `config.json`, then either the shard index
//! (`model.safetensors.index.json`) or a single `model.safetensors`, maps every shard, parses
//! and validates every header, and cross-checks the index against the headers. After that
//! the manifest is trusted: lookups return [`TensorEntry`] values whose byte ranges are known
//! to lie inside their shard, and [`Checkpoint::expect`] checks dtype and shape once, at
//! model load, with an error that names the shard file.
//!
//! A stream install's sparse shards are different: the expert disk cache writes routed experts
//! into their holes and punches them out again while the checkpoint is open. A `&[u8]` over
//! bytes that change under it is undefined behaviour, so [`Checkpoint::open_with_shards`] never
//! maps those ranges: such a shard is mapped piece by piece, each piece a run of the tensors it
//! does hold, and the routed experts are located (for the store's own reads) but never mapped.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use serde::Deserialize;
use serde_json::Value;
use sluice_core::DType;

use crate::config::CheckpointConfig;
use crate::safetensors::parse_header;
use crate::{CheckpointError, Result};

/// File name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// File name of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// Prefix of language-model tensors in multimodal releases such as Kimi K3.
pub const LANGUAGE_MODEL_PREFIX: &str = "language_model.";

/// One tensor of the manifest. Its byte range was validated against its shard at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Full tensor name as stored (including any `language_model.` prefix).
    pub name: String,
    /// Index of the shard holding it, into [`Checkpoint::shard_paths`].
    pub shard: usize,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Absolute offset of the first byte in the shard file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl TensorEntry {
    /// Absolute offset one past the last byte in the shard file.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> u64 {
        // Validated at open: numel × dtype size == len, so this cannot overflow.
        self.shape.iter().product()
    }
}

/// The index file as written: `{"metadata": {...}, "weight_map": {tensor: shard_file}}`.
#[derive(Deserialize)]
struct RawIndex {
    #[serde(default)]
    metadata: Option<Value>,
    weight_map: BTreeMap<String, String>,
}

/// Which tensors of which shard [`Checkpoint::open_with_shards`] leaves unmapped: `(shard
/// name, tensor name) -> bool`.
type Unmapped<'a> = dyn Fn(&str, &str) -> bool + 'a;

/// One shard's bytes in memory.
#[derive(Debug)]
enum ShardMap {
    /// The whole file.
    Whole(Mmap),
    /// Only these runs of tensors, each its own mapping, by ascending start offset (a sparse
    /// shard; nothing between the runs is mapped).
    Pieces(Vec<(u64, Mmap)>),
}

impl ShardMap {
    /// The bytes `offset .. offset + len`, if one mapping holds them all.
    fn get(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let (base, map) = match self {
            Self::Whole(m) => (0, m),
            Self::Pieces(p) => {
                let i = p.partition_point(|(start, _)| *start <= offset).checked_sub(1)?;
                let (start, m) = p.get(i)?;
                (*start, m)
            }
        };
        let start = usize::try_from(offset.checked_sub(base)?).ok()?;
        map.get(start..start.checked_add(usize::try_from(len).ok()?)?)
    }
}

/// One opened shard.
#[derive(Debug)]
struct Shard {
    map: ShardMap,
    metadata: BTreeMap<String, String>,
}

/// An opened, validated checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    config: CheckpointConfig,
    shard_paths: Vec<PathBuf>,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorEntry>,
    index_metadata: Option<Value>,
    prefix: &'static str,
}

impl Checkpoint {
    /// Opens the checkpoint directory `dir`: reads `config.json`, the shard index (or the
    /// single `model.safetensors`), maps every shard and validates every header.
    ///
    /// Shard names in the index must be plain file names in `dir`; symbolic links (as in a
    /// Hugging Face cache snapshot) are followed.
    ///
    /// # Safety note
    ///
    /// Shards are memory-mapped read-only. The files must not be truncated or modified while
    /// the checkpoint is open: doing so is outside this type's contract (reads of a truncated
    /// mapping fault with SIGBUS, and a modified file may change bytes already validated).
    /// sluice itself never writes to a file it has opened as a checkpoint.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_inner(dir, &|name| dir.join(name), None)
    }

    /// Like [`Checkpoint::open`], but shard `name` (as the index or `model.safetensors`
    /// names it) is read from `shard_path(name)`, and tensor `t` of shard `name` is not mapped
    /// when `unmapped(name, t)`.
    ///
    /// A stream install keeps each expert shard as `{name}.sparse` (same length and offsets,
    /// routed experts as holes), and its expert disk cache writes experts into those holes and
    /// punches them out again while the checkpoint is open. Such a shard is therefore mapped
    /// only in runs of the tensors it holds; the `unmapped` tensors are in the manifest, with
    /// their offsets, for readers of the file ([`Checkpoint::locate`]), but
    /// [`Checkpoint::tensor`] and [`Checkpoint::expect`] refuse them
    /// ([`CheckpointError::NotMapped`]) and no slice the checkpoint hands out covers them. The
    /// mapped runs keep [`Checkpoint::open`]'s read-only contract.
    pub fn open_with_shards(
        dir: &Path,
        shard_path: &dyn Fn(&str) -> PathBuf,
        unmapped: &dyn Fn(&str, &str) -> bool,
    ) -> Result<Self> {
        Self::open_inner(dir, shard_path, Some(unmapped))
    }

    fn open_inner(
        dir: &Path,
        shard_path: &dyn Fn(&str) -> PathBuf,
        unmapped: Option<&Unmapped<'_>>,
    ) -> Result<Self> {
        let config = CheckpointConfig::load(dir)?;
        let index_path = dir.join(INDEX_FILE);
        let (weight_map, index_metadata) = match std::fs::read(&index_path) {
            Ok(bytes) => {
                let raw: RawIndex = serde_json::from_slice(&bytes).map_err(|source| {
                    CheckpointError::BadJson { path: index_path.clone(), source }
                })?;
                (Some(raw.weight_map), raw.metadata)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
            Err(e) => return Err(CheckpointError::io(index_path, e)),
        };

        // Shard file name → one tensor the index places there (for error messages).
        let mut shard_names: BTreeMap<&str, &str> = BTreeMap::new();
        match &weight_map {
            Some(map) => {
                if map.is_empty() {
                    return Err(CheckpointError::BadStructure {
                        path: index_path,
                        reason: "weight_map lists no tensors".to_owned(),
                    });
                }
                for (tensor, shard) in map {
                    if !is_plain_file_name(shard) {
                        return Err(CheckpointError::UnsafeShardName {
                            index: index_path,
                            shard: shard.clone(),
                        });
                    }
                    shard_names.entry(shard).or_insert(tensor);
                }
            }
            None => {
                if !shard_path(SINGLE_FILE).exists() {
                    return Err(CheckpointError::NoWeights { dir: dir.to_path_buf() });
                }
                shard_names.insert(SINGLE_FILE, "");
            }
        }

        let mut shard_paths = Vec::with_capacity(shard_names.len());
        let mut shards = Vec::with_capacity(shard_names.len());
        let mut tensors: BTreeMap<String, TensorEntry> = BTreeMap::new();
        for (i, (&name, &example)) in shard_names.iter().enumerate() {
            let path = shard_path(name);
            let unmapped_here = unmapped.map(|u| move |t: &str| u(name, t));
            let opened =
                open_shard(&path, unmapped_here.as_ref().map(|u| u as &dyn Fn(&str) -> bool))
                    .map_err(|e| match e {
                        CheckpointError::Io { source, .. }
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            CheckpointError::MissingShard {
                                dir: dir.to_path_buf(),
                                shard: name.to_owned(),
                                tensor_example: example.to_owned(),
                            }
                        }
                        other => other,
                    })?;
            let (map, header) = opened;
            for info in header.tensors {
                if let Some(first) = tensors.get(&info.name) {
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: info.name,
                        first: shard_paths.get(first.shard).cloned().unwrap_or_default(),
                        second: path,
                    });
                }
                let entry = TensorEntry {
                    name: info.name.clone(),
                    shard: i,
                    dtype: info.dtype,
                    shape: info.shape,
                    offset: info.data_start,
                    len: info.len,
                };
                tensors.insert(info.name, entry);
            }
            shards.push(Shard { map, metadata: header.metadata });
            shard_paths.push(path);
        }

        if let Some(map) = &weight_map {
            let position: BTreeMap<&str, usize> =
                shard_names.keys().enumerate().map(|(i, &name)| (name, i)).collect();
            for (tensor, shard) in map {
                let want = position.get(shard.as_str());
                if want.is_none() || tensors.get(tensor).map(|e| &e.shard) != want {
                    return Err(CheckpointError::TensorNotInShard {
                        shard: dir.join(shard),
                        tensor: tensor.clone(),
                    });
                }
            }
        }

        let prefix = match tensors.range(LANGUAGE_MODEL_PREFIX.to_owned()..).next() {
            Some((name, _)) if name.starts_with(LANGUAGE_MODEL_PREFIX) => LANGUAGE_MODEL_PREFIX,
            _ => "",
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            shard_paths,
            shards,
            tensors,
            index_metadata,
            prefix,
        })
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every shard file, in the order [`TensorEntry::shard`] indexes (sorted by file name).
    pub fn shard_paths(&self) -> &[PathBuf] {
        &self.shard_paths
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = &TensorEntry> + '_ {
        self.tensors.values()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the checkpoint holds no tensors (only possible for an empty single file).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor called `name`, if present.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// The tensor called `name`, or [`CheckpointError::MissingTensor`]; a tensor this
    /// checkpoint does not map is [`CheckpointError::NotMapped`].
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry> {
        let entry = self.tensors.get(name).ok_or_else(|| CheckpointError::MissingTensor {
            dir: self.dir.clone(),
            tensor: name.to_owned(),
        })?;
        if !self.is_mapped(entry) {
            return Err(CheckpointError::NotMapped {
                file: self.shard_file(entry).to_path_buf(),
                tensor: name.to_owned(),
            });
        }
        Ok(entry)
    }

    /// The tensor called `name`, checked to have `dtype` and `shape`. Errors name the shard.
    pub fn expect(&self, name: &str, dtype: DType, shape: &[u64]) -> Result<&TensorEntry> {
        self.check(self.tensor(name)?, name, dtype, shape)
    }

    /// Like [`Checkpoint::expect`], but also for a tensor this checkpoint does not map (a
    /// routed expert of a sparse shard): where its bytes are in the shard file, for a store
    /// that reads the file itself. [`Checkpoint::bytes`] has nothing for such an entry.
    pub fn locate(&self, name: &str, dtype: DType, shape: &[u64]) -> Result<&TensorEntry> {
        let entry = self.tensors.get(name).ok_or_else(|| CheckpointError::MissingTensor {
            dir: self.dir.clone(),
            tensor: name.to_owned(),
        })?;
        self.check(entry, name, dtype, shape)
    }

    /// `entry` (called `name`) if it has `dtype` and `shape`.
    fn check<'a>(
        &self,
        entry: &'a TensorEntry,
        name: &str,
        dtype: DType,
        shape: &[u64],
    ) -> Result<&'a TensorEntry> {
        if entry.dtype != dtype {
            return Err(CheckpointError::DTypeMismatch {
                file: self.shard_file(entry).to_path_buf(),
                tensor: name.to_owned(),
                expected: dtype,
                got: entry.dtype,
            });
        }
        if entry.shape != shape {
            return Err(CheckpointError::ShapeMismatch {
                file: self.shard_file(entry).to_path_buf(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                got: entry.shape.clone(),
            });
        }
        Ok(entry)
    }

    /// The bytes of `entry`, straight from the shard's memory map.
    ///
    /// # Panics
    ///
    /// If `entry` did not come from this checkpoint, or is one it does not map (entries from
    /// [`Checkpoint::tensor`] and [`Checkpoint::expect`] were validated at open and are
    /// always mapped; [`Checkpoint::try_bytes`] does not panic).
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        self.try_bytes(entry)
            .expect("invariant: a mapped entry of this checkpoint, validated at open")
    }

    /// The bytes of `entry`, or `None` if it is not a tensor this checkpoint maps.
    pub fn try_bytes(&self, entry: &TensorEntry) -> Option<&[u8]> {
        if entry.len == 0 {
            return self.shards.get(entry.shard).map(|_| &[][..]);
        }
        self.shards.get(entry.shard)?.map.get(entry.offset, entry.len)
    }

    /// Whether the bytes of `entry` are mapped (false for a routed expert of a sparse shard).
    pub fn is_mapped(&self, entry: &TensorEntry) -> bool {
        self.try_bytes(entry).is_some()
    }

    /// The shard file holding `entry` (empty if `entry` is not from this checkpoint).
    pub fn shard_file(&self, entry: &TensorEntry) -> &Path {
        self.shard_paths.get(entry.shard).map_or(Path::new(""), PathBuf::as_path)
    }

    /// The `__metadata__` map of shard `shard`, if that shard exists.
    pub fn shard_metadata(&self, shard: usize) -> Option<&BTreeMap<String, String>> {
        self.shards.get(shard).map(|s| &s.metadata)
    }

    /// The index's `metadata` object (usually `{"total_size": N}`), if an index was read.
    pub fn index_metadata(&self) -> Option<&Value> {
        self.index_metadata.as_ref()
    }

    /// `"language_model."` when tensors carry that prefix (the K3 multimodal release), else
    /// `""`. Model ports prepend it to the names in their tensor roster.
    pub fn name_prefix(&self) -> &str {
        self.prefix
    }
}

/// True when `name` is a single normal path component: no separators, no `..`, not absolute.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    if name.contains(['/', '\\', '\0']) {
        return false;
    }
    let mut parts = Path::new(name).components();
    matches!((parts.next(), parts.next()), (Some(Component::Normal(p)), None) if p == name)
}

/// Opens `path` for reading if it is a regular file (symlinks followed). Anything else is
/// refused before `open`: a FIFO would block the open until some writer appears (forever, for a
/// checkpoint), and a device or socket is not a file of weights.
pub(crate) fn open_regular(path: &Path) -> std::io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let msg = format!("not a regular file ({})", file_kind(&meta.file_type()));
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
    }
    File::open(path)
}

/// What a file type is, for messages.
pub(crate) fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Opens one shard: parses its header and maps it read-only, whole or, when some tensor is
/// `unmapped`, as runs of the other tensors only (its header then read without mapping).
fn open_shard(
    path: &Path,
    unmapped: Option<&dyn Fn(&str) -> bool>,
) -> Result<(ShardMap, crate::safetensors::SafetensorsHeader)> {
    let Some(unmapped) = unmapped else {
        let map = map_shard(path)?;
        let header = parse_header(path, &map)?;
        return Ok((ShardMap::Whole(map), header));
    };
    let header = crate::safetensors::read_header(path)?;
    if !header.tensors.iter().any(|t| unmapped(&t.name)) {
        let map = map_shard(path)?;
        // Parsed again from the map: the file may have changed since `read_header`.
        let header = parse_header(path, &map)?;
        return Ok((ShardMap::Whole(map), header));
    }
    // Runs of tensors, in file order, broken by every unmapped one.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut open_run = false;
    for t in &header.tensors {
        if unmapped(&t.name) {
            open_run = false;
        } else if t.len > 0 {
            let end = t.data_start + t.len;
            match runs.last_mut() {
                Some((_, e)) if open_run => *e = (*e).max(end),
                _ => runs.push((t.data_start, end)),
            }
            open_run = true;
        }
    }
    let file = open_regular(path).map_err(|e| CheckpointError::io(path, e))?;
    let mut pieces = Vec::with_capacity(runs.len());
    for (start, end) in runs {
        let len = usize::try_from(end - start)
            .map_err(|_| CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: end })?;
        // SAFETY: as in `map_shard`, for the bytes of tensors that the expert store never
        // writes: the range holds only tensors that are not `unmapped`, and no other range of
        // the file is mapped (the pages at its ends may hold a neighbour's bytes, which no
        // slice handed out covers). `read_header` checked the range lies inside the file.
        let map = unsafe { memmap2::MmapOptions::new().offset(start).len(len).map(&file) }
            .map_err(|e| CheckpointError::io(path, e))?;
        pieces.push((start, map));
    }
    Ok((ShardMap::Pieces(pieces), header))
}

/// Opens and maps one shard read-only.
fn map_shard(path: &Path) -> Result<Mmap> {
    let file = open_regular(path).map_err(|e| CheckpointError::io(path, e))?;
    let len = file.metadata().map_err(|e| CheckpointError::io(path, e))?.len();
    if len < 8 {
        // Also avoids mapping an empty file, which some platforms refuse.
        return Err(CheckpointError::FileTooShort { path: path.to_path_buf(), len });
    }
    // SAFETY: the mapping is read-only and sluice never writes to a checkpoint it has open.
    // Memory safety additionally requires that no other process truncates or rewrites the
    // file while it is mapped; that is outside our contract and documented on
    // `Checkpoint::open`. Every range later read from the map is validated against its
    // length by `parse_header` first.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_file_names() {
        for ok in ["model.safetensors", "model-00001-of-000096.safetensors", "a..b"] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../evil", "/etc/passwd", "a/b", "a\\b", "./a", "a/", "a\0b"] {
            assert!(!is_plain_file_name(bad), "{bad:?}");
        }
    }
}
