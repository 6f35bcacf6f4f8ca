//! The records a conversion keeps: `sluice-int8-manifest.json` (written last; its presence
//! marks a complete output), the progress journal that makes a conversion resumable, and the
//! optional install manifest of the source (`sluice-install.json`, written by `sluice pull`)
//! that source files are verified against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::{ConvertError, ConvertOptions};

/// File name of the manifest of a converted directory.
pub const MANIFEST_FILE: &str = "sluice-int8-manifest.json";
/// The manifest format written by this version.
pub const FORMAT_VERSION: u32 = 1;
/// The `kind` field of the manifest.
pub const MANIFEST_KIND: &str = "sluice-int8-spine";
/// File name of the progress journal inside the destination (hidden; not an output file).
pub const JOURNAL_FILE: &str = ".sluice-int8-progress.json";
/// File name of the install manifest `sluice pull` writes into a model directory.
pub const INSTALL_MANIFEST: &str = "sluice-install.json";

/// The default output directory of a conversion of `src`: its sibling `NAME-int8` (for
/// `/models/K3` that is `/models/K3-int8`). `src` is made absolute first so that `.` and a
/// trailing `/` name the same sibling.
pub fn default_output(src: &Path) -> PathBuf {
    let abs = src.canonicalize().unwrap_or_else(|_| src.to_path_buf());
    let name = abs.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    abs.with_file_name(format!("{name}-int8"))
}

/// True when `dir` holds a finished int8 conversion: its manifest, written last, is present
/// and names this format.
pub fn is_converted(dir: &Path) -> bool {
    Int8Manifest::read(&dir.join(MANIFEST_FILE)).is_ok()
}

/// Size and SHA-256 of one file, named relative to its directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// File name inside the directory.
    pub name: String,
    /// Length in bytes.
    pub size: u64,
    /// SHA-256, 64 lowercase hex digits.
    pub sha256: String,
}

/// `sluice-int8-manifest.json`: what was converted, from what, with which options. Contains
/// no paths, times or host names, so that the same source and options give the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Int8Manifest {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// [`MANIFEST_KIND`].
    pub kind: String,
    /// The options the conversion ran with.
    pub options: ConvertOptions,
    /// Every source file read (shards, index, copied files), sorted by name.
    pub source: Vec<FileRecord>,
    /// Every output file except this manifest, sorted by name.
    pub output: Vec<FileRecord>,
    /// Tensors stored as row-int8 (each with its `_scale` companion), sorted.
    pub quantized: Vec<String>,
}

impl Int8Manifest {
    /// Reads and checks the manifest at `path`.
    pub fn read(path: &Path) -> Result<Self, ConvertError> {
        let bytes = std::fs::read(path).map_err(|e| ConvertError::io(path, e))?;
        let m: Self = serde_json::from_slice(&bytes)
            .map_err(|e| ConvertError::BadManifest { path: path.into(), reason: e.to_string() })?;
        if m.format != FORMAT_VERSION || m.kind != MANIFEST_KIND {
            let reason =
                format!("{} format {} (this sluice reads {FORMAT_VERSION})", m.kind, m.format);
            return Err(ConvertError::BadManifest { path: path.into(), reason });
        }
        Ok(m)
    }
}

/// One converted or copied file recorded by the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The source file as it was read.
    pub source: FileRecord,
    /// The source file's modification time (ns since the epoch) when it was read: a source
    /// whose size and time are unchanged is not hashed again on resume.
    pub source_mtime_ns: u128,
    /// The output file written from it.
    pub output: FileRecord,
    /// Tensors of this file stored as row-int8.
    pub quantized: Vec<String>,
}

/// The progress journal: finished files, keyed by name, for one set of options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Journal {
    /// The options the finished files were made with.
    pub options: ConvertOptions,
    /// Finished files by name.
    pub done: BTreeMap<String, JournalEntry>,
}

impl Journal {
    /// The journal in `dst` if it exists, parses and was made with `options`; otherwise an
    /// empty one (a journal from other options or an older format is simply not reused).
    pub fn load(dst: &Path, options: &ConvertOptions) -> Self {
        let fresh = Self { options: options.clone(), done: BTreeMap::new() };
        match std::fs::read(dst.join(JOURNAL_FILE)) {
            Ok(bytes) => match serde_json::from_slice::<Self>(&bytes) {
                Ok(j) if j.options == *options => j,
                _ => fresh,
            },
            Err(_) => fresh,
        }
    }

    /// Writes the journal into `dst` atomically.
    pub fn save(&self, dst: &Path) -> Result<(), ConvertError> {
        let value = serde_json::to_value(self).map_err(|e| ConvertError::BadManifest {
            path: dst.join(JOURNAL_FILE),
            reason: e.to_string(),
        })?;
        crate::write_json_atomic(&dst.join(JOURNAL_FILE), &value)?;
        Ok(())
    }
}

/// Modification time of `path` in ns since the epoch (0 when the platform cannot say).
pub fn mtime_ns(path: &Path) -> Result<u128, ConvertError> {
    let meta = std::fs::metadata(path).map_err(|e| ConvertError::io(path, e))?;
    Ok(meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos()))
}

/// The fields of `sluice-install.json` a conversion checks (the file has more).
#[derive(Debug, Deserialize)]
struct Install {
    #[serde(default)]
    complete: Option<bool>,
    #[serde(default)]
    files: Vec<InstallFile>,
}

#[derive(Debug, Deserialize)]
struct InstallFile {
    path: String,
    size: u64,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    state: Option<String>,
}

/// What an install manifest says about the source directory's files (nothing when the
/// source has none).
#[derive(Debug, Default)]
pub struct Expected {
    files: BTreeMap<String, (u64, Option<String>)>,
}

impl Expected {
    /// Reads `src/sluice-install.json` when present: refuses an incomplete install or a
    /// stream-mode one (its shards lack the routed experts) and checks every listed top-level
    /// file's size now; SHA-256 is checked by [`Expected::check_sha`] as files are hashed.
    pub fn load(src: &Path) -> Result<Self, ConvertError> {
        let path = src.join(INSTALL_MANIFEST);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(ConvertError::io(&path, e)),
        };
        let bad = |reason: String| ConvertError::BadManifest { path: path.clone(), reason };
        let install: Install = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if install.complete == Some(false) {
            return Err(bad(
                "the install is incomplete (`complete: false`); finish the pull first".into(),
            ));
        }
        let mut files = BTreeMap::new();
        for f in install.files {
            if f.state.as_deref().is_some_and(|s| s != "full") {
                return Err(bad(format!(
                    "{} is not fully installed (state {:?})",
                    f.path, f.state
                )));
            }
            if f.path.contains('/') {
                continue;
            }
            let on_disk = src.join(&f.path);
            let len = std::fs::metadata(&on_disk).map_err(|e| ConvertError::io(&on_disk, e))?.len();
            if len != f.size {
                return Err(ConvertError::SourceMismatch {
                    path: on_disk,
                    what: "size",
                    expected: f.size.to_string(),
                    got: len.to_string(),
                });
            }
            files.insert(f.path, (f.size, f.sha256));
        }
        Ok(Self { files })
    }

    /// Refuses `record` when the install manifest lists its file with another SHA-256.
    pub fn check_sha(&self, dir: &Path, record: &FileRecord) -> Result<(), ConvertError> {
        match self.files.get(&record.name) {
            Some((_, Some(sha))) if !sha.eq_ignore_ascii_case(&record.sha256) => {
                Err(ConvertError::SourceMismatch {
                    path: dir.join(&record.name),
                    what: "sha256",
                    expected: sha.clone(),
                    got: record.sha256.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}
