//! Warm starts: the expert cache's hot set — per MoE layer, the experts used and how often —
//! written next to the model (or in the cache directory when the model directory is read-only)
//! at exit and periodically, and read back at the next start so the experts most likely to be
//! needed are read before they are asked for.
//!
//! The file (`.sluice-hotset.json`) holds a format version, the model's fingerprint (SHA-256
//! of `config.json` and of each shard's name and size, plus the expert counts per layer), the
//! counts, and a SHA-256 of the counts. It is written atomically (a temporary file, `fsync`,
//! rename, `fsync` of the directory). A file that is corrupt, from another model, or names an
//! expert the model does not have is refused with a reason (the caller warns and starts cold);
//! whatever the file says, only which experts are cached early changes, never an output.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::index::ExpertIndex;

/// The file's name in the model directory.
pub const FILE_NAME: &str = ".sluice-hotset.json";
/// The format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Why a hot-set file was not used.
#[derive(Debug, thiserror::Error)]
pub enum HotSetError {
    /// No file (a first start): not a warning.
    #[error("no hot-set file")]
    Missing,
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a hot set this model can use.
    #[error("{path}: {why}; ignored (starting cold)")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// Per layer of the expert index, `(expert id, uses)` of the experts used, most used first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSet {
    /// One list per layer of the index (empty for dense layers).
    pub layers: Vec<Vec<(u32, u64)>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    format_version: u32,
    fingerprint: String,
    checksum: String,
    layers: Vec<Vec<(u32, u64)>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        use std::fmt::Write as _;
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn checksum(layers: &[Vec<(u32, u64)>]) -> String {
    let mut h = Sha256::new();
    for (l, v) in layers.iter().enumerate() {
        h.update((l as u64).to_le_bytes());
        for &(id, n) in v {
            h.update(id.to_le_bytes());
            h.update(n.to_le_bytes());
        }
        h.update(u64::MAX.to_le_bytes());
    }
    hex(&h.finalize())
}

/// The model's fingerprint: `config.json` in `dir`, each shard's file name and size, and the
/// expert count of each layer of `index`. Cheap (no shard is read) and changes when the model
/// does.
pub fn fingerprint(dir: &Path, index: &ExpertIndex) -> String {
    let mut h = Sha256::new();
    h.update(std::fs::read(dir.join("config.json")).unwrap_or_default());
    for p in index.paths() {
        h.update(p.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        h.update(std::fs::metadata(p).map_or(0, |m| m.len()).to_le_bytes());
    }
    for l in 0..index.num_layers() {
        h.update((index.experts(l) as u64).to_le_bytes());
    }
    hex(&h.finalize())
}

/// Where the hot set of the model in `dir` lives: `dir/.sluice-hotset.json` when `dir` is
/// writable, else `cache_dir/hotset-FINGERPRINT.json`.
pub fn path_for(dir: &Path, cache_dir: &Path, fingerprint: &str) -> PathBuf {
    let probe = dir.join(format!(".sluice-hotset-probe-{}", std::process::id()));
    let writable = std::fs::File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    if writable {
        dir.join(FILE_NAME)
    } else {
        cache_dir.join(format!("hotset-{}.json", fingerprint.get(..16).unwrap_or(fingerprint)))
    }
}

impl HotSet {
    /// Reads and checks the hot set at `path` for a model with `fingerprint` and `index`.
    pub fn load(path: &Path, fingerprint: &str, index: &ExpertIndex) -> Result<Self, HotSetError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(HotSetError::Missing),
            Err(source) => return Err(HotSetError::Io { path: path.into(), source }),
        };
        crate::telemetry::count_state_read(bytes.len() as u64);
        let bad = |why: String| HotSetError::Unusable { path: path.into(), why };
        let f: File = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a hot-set file (corrupt?): {e}")))?;
        if f.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {} (this sluice reads {FORMAT_VERSION})",
                f.format_version
            )));
        }
        if f.fingerprint != fingerprint {
            return Err(bad("written for another model (fingerprint differs)".into()));
        }
        if checksum(&f.layers) != f.checksum {
            return Err(bad("checksum mismatch (corrupt)".into()));
        }
        if f.layers.len() != index.num_layers() {
            return Err(bad(format!(
                "{} layers, the model has {}",
                f.layers.len(),
                index.num_layers()
            )));
        }
        for (l, v) in f.layers.iter().enumerate() {
            if let Some(&(id, _)) = v.iter().find(|&&(id, _)| index.get(l, id).is_none()) {
                return Err(bad(format!(
                    "names expert {id} of layer {l}, which the model does not have ({} experts)",
                    index.experts(l)
                )));
            }
        }
        Ok(Self { layers: f.layers })
    }

    /// Writes the hot set to `path` atomically (temporary file, `fsync`, rename, directory
    /// `fsync`).
    pub fn save(&self, path: &Path, fingerprint: &str) -> Result<(), HotSetError> {
        let io = |source| HotSetError::Io { path: path.into(), source };
        let f = File {
            format_version: FORMAT_VERSION,
            fingerprint: fingerprint.into(),
            checksum: checksum(&self.layers),
            layers: self.layers.clone(),
        };
        let text = serde_json::to_vec(&f).map_err(|e| io(std::io::Error::other(e)))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut out = std::fs::File::create(&tmp)?;
            out.write_all(&text)?;
            out.sync_all()?;
            std::fs::rename(&tmp, path)?;
            // The rename is durable once the directory is.
            std::fs::File::open(dir)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        crate::telemetry::count_state_write(text.len() as u64);
        Ok(())
    }

    /// Every `(layer, expert)` of the set, most used first (ties by layer then id, so the
    /// order is deterministic).
    pub fn order(&self) -> Vec<(usize, u32)> {
        let mut all: Vec<(u64, usize, u32)> = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, v)| v.iter().map(move |&(id, n)| (n, l, id)))
            .filter(|&(n, _, _)| n > 0)
            .collect();
        all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        all.into_iter().map(|(_, l, id)| (l, id)).collect()
    }

    /// Halves every count (dropping those that reach 0), so older use weighs less.
    pub fn decay(&mut self) {
        for v in &mut self.layers {
            for e in v.iter_mut() {
                e.1 /= 2;
            }
            v.retain(|e| e.1 > 0);
        }
    }

    /// Adds `other`'s counts to this one's (a hot set carried across runs accumulates).
    pub fn merge(&mut self, other: &HotSet) {
        if self.layers.len() < other.layers.len() {
            self.layers.resize(other.layers.len(), Vec::new());
        }
        for (l, v) in other.layers.iter().enumerate() {
            for &(id, n) in v {
                match self.layers[l].iter_mut().find(|e| e.0 == id) {
                    Some(e) => e.1 = e.1.saturating_add(n),
                    None => self.layers[l].push((id, n)),
                }
            }
            self.layers[l].sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        }
    }
}
