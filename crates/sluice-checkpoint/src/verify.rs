//! Structural verification of a checkpoint directory, file by file, without trusting any of
//! it: every shard the index names must exist, its safetensors header must parse, every
//! tensor's byte range must lie inside the file with the length its dtype and shape need, and
//! every tensor the index places in a shard must be there. Unlike [`crate::Checkpoint::open`],
//! which stops at the first problem, this reports every file, so `sluice verify` can say
//! which shard is truncated and which tensor it cuts. Content changes that keep the structure
//! intact are only caught by hashing (`sluice verify` does that when an install manifest
//! records the SHA-256 of each file).

use crate::checkpoint::{INDEX_FILE, SINGLE_FILE};
use crate::safetensors::read_header;
use crate::{CheckpointError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The verdict on one shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardCheck {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Its length in bytes (0 when missing).
    pub len: u64,
    /// Tensors its header lists.
    pub tensors: usize,
    /// What is wrong with it, `None` when its structure is sound.
    pub problem: Option<String>,
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

/// The shard files of the checkpoint in `dir` (from its index, or the single file) with the
/// tensors the index places in each, sorted by file name.
pub fn shard_names(dir: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let index_path = dir.join(INDEX_FILE);
    match std::fs::read(&index_path) {
        Ok(bytes) => {
            let raw: RawIndex = serde_json::from_slice(&bytes)
                .map_err(|source| CheckpointError::BadJson { path: index_path.clone(), source })?;
            let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (tensor, shard) in raw.weight_map {
                if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
                    return Err(CheckpointError::UnsafeShardName { index: index_path, shard });
                }
                shards.entry(shard).or_default().push(tensor);
            }
            Ok(shards)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.join(SINGLE_FILE).exists() {
                Ok(BTreeMap::from([(SINGLE_FILE.to_owned(), Vec::new())]))
            } else {
                Err(CheckpointError::NoWeights { dir: dir.to_path_buf() })
            }
        }
        Err(e) => Err(CheckpointError::io(index_path, e)),
    }
}

/// Checks one shard: header, tensor ranges against the file length, the index's tensors.
pub fn check_shard(dir: &Path, file: &str, indexed: &[String]) -> ShardCheck {
    let path = dir.join(file);
    let len = std::fs::metadata(&path).map_or(0, |m| m.len());
    let mut check = ShardCheck { file: file.to_owned(), len, tensors: 0, problem: None };
    match read_header(&path) {
        Err(CheckpointError::OffsetsPastEnd { tensor, end, data_len, .. }) => {
            check.problem = Some(format!(
                "truncated or altered: tensor {tensor} ends at data byte {end} but the file holds \
                 only {data_len} data bytes ({len} bytes in all)"
            ));
        }
        Err(CheckpointError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            let example = indexed.first().map_or(String::new(), |t| format!(" (holds {t})"));
            check.problem = Some(format!("missing: the index names this file{example}"));
        }
        Err(e) => check.problem = Some(format!("bad header: {e}")),
        Ok(h) => {
            check.tensors = h.tensors.len();
            let have: std::collections::BTreeSet<&str> =
                h.tensors.iter().map(|t| t.name.as_str()).collect();
            if let Some(t) = indexed.iter().find(|t| !have.contains(t.as_str())) {
                check.problem = Some(format!(
                    "altered: the index places tensor {t} here but the header lacks it"
                ));
            }
        }
    }
    check
}

/// Checks every shard of the checkpoint in `dir`.
pub fn check_structure(dir: &Path) -> Result<Vec<ShardCheck>> {
    Ok(shard_names(dir)?.iter().map(|(f, ts)| check_shard(dir, f, ts)).collect())
}

/// The verdict on one file a manifest records with its size and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordCheck {
    /// File name inside the directory.
    pub file: String,
    /// Bytes hashed.
    pub bytes: u64,
    /// What is wrong with it, `None` when size and hash match the record.
    pub problem: Option<String>,
}

/// Re-hashes every file of `records` (the output list of `sluice-int8-manifest.json`) under
/// `dir` and compares size and SHA-256, calling `progress(bytes)` as it reads. A flipped byte
/// anywhere in a converted shard fails here, which the structural checks cannot see.
pub fn check_records(
    dir: &Path,
    records: &[crate::convert::FileRecord],
    progress: &mut dyn FnMut(u64),
) -> Vec<RecordCheck> {
    records
        .iter()
        .map(|r| {
            let mut check = RecordCheck { file: r.name.clone(), bytes: 0, problem: None };
            if !crate::checkpoint::is_plain_file_name(&r.name) {
                check.problem = Some("the manifest names a path outside the directory".into());
                return check;
            }
            match hash_with_progress(&dir.join(&r.name), progress) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    check.problem = Some("missing: the int8 manifest records this file".into());
                }
                Err(e) => check.problem = Some(format!("cannot read: {e}")),
                Ok((n, sha)) => {
                    check.bytes = n;
                    if n != r.size {
                        check.problem = Some(format!(
                            "truncated or extended: {n} bytes, the int8 manifest records {}",
                            r.size
                        ));
                    } else if sha != r.sha256 {
                        check.problem = Some(format!(
                            "altered: SHA-256 {sha}, the int8 manifest records {}",
                            r.sha256
                        ));
                    }
                }
            }
            check
        })
        .collect()
}

/// Size and lowercase hex SHA-256 of the file at `path`, reporting bytes read to `progress`.
fn hash_with_progress(
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<(u64, String)> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = crate::checkpoint::open_regular(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        let n = n as u64;
        size += n;
        progress(n);
    }
    Ok((size, crate::convert::hex(&h.finalize())))
}
