//! `sluice-install.json`: the record of a pinned install.
//!
//! Written atomically (scratch file, fsync, rename, directory fsync) when a pull starts —
//! with `complete: false`, which pins the commit so a resumed pull cannot silently mix
//! revisions — and again when it ends. `complete: true` means every file listed is present
//! and was verified: full files by the hub's SHA-256 (LFS) or git blob id (others), stream
//! shards by their header and per-range lengths, with each range's SHA-256 recorded so a
//! later check can detect local corruption.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{HubError, Result};
use crate::layout::write_atomic;
use crate::plan::Mode;

/// The manifest format version written by this crate.
pub const MANIFEST_FORMAT: u32 = 1;

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallManifest {
    /// Format version ([`MANIFEST_FORMAT`]).
    pub format: u32,
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to; every file is from this commit.
    pub commit: String,
    /// The hub endpoint used.
    pub endpoint: String,
    /// `full` or `stream`.
    pub mode: Mode,
    /// `dir` or `hf-cache`.
    pub layout: String,
    /// When the install was first started (RFC 3339, UTC).
    pub created: String,
    /// When this manifest was written (RFC 3339, UTC).
    pub updated: String,
    /// Whether every file is present and verified.
    pub complete: bool,
    /// Every file of the commit.
    pub files: Vec<ManifestFile>,
}

/// The state of one file in an install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileState {
    /// Not yet installed.
    Pending,
    /// Present in full and verified.
    Full,
    /// A stream-mode shard: header and spine ranges present, routed experts remote.
    Stream,
}

/// Where an installed file's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Downloaded by this or an earlier pull.
    Downloaded,
    /// Already present under its final name.
    Present,
    /// Linked from the Hugging Face cache.
    HfCache,
}

/// One file of the install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path inside the repository (and the model directory).
    pub path: String,
    /// Size of the whole file on the hub.
    pub size: u64,
    /// SHA-256 of the whole file: the hub's for LFS files, computed here for the others
    /// once downloaded; absent while unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Git blob id from the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_oid: Option<String>,
    /// Install state.
    pub state: FileState,
    /// Where the bytes came from, once installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// For stream-mode shards: what is local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamShard>,
}

/// The local part of a stream-mode shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamShard {
    /// The header file, relative to the model directory: `{path}.header` (8 + N bytes).
    pub header: String,
    /// The sparse shard, relative to the model directory: `{path}.sparse`, `size` bytes long,
    /// holding the header and `ranges` at their original offsets and holes elsewhere.
    pub sparse: String,
    /// N, the JSON header length.
    pub header_len: u64,
    /// Bytes of routed-expert tensors left remote.
    pub expert_bytes: u64,
    /// Byte ranges present in the sparse file besides `0 .. 8 + N`, ascending.
    pub ranges: Vec<RangeRecord>,
}

/// One present byte range of a sparse shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRecord {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// SHA-256 of the range's bytes as received.
    pub sha256: String,
}

impl InstallManifest {
    /// Reads and parses the manifest at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| HubError::io(path, e))?;
        let m: Self = serde_json::from_slice(&bytes)
            .map_err(|e| HubError::Manifest { path: path.to_path_buf(), reason: e.to_string() })?;
        if m.format != MANIFEST_FORMAT {
            return Err(HubError::Manifest {
                path: path.to_path_buf(),
                reason: format!("format {} (this sluice reads {MANIFEST_FORMAT})", m.format),
            });
        }
        Ok(m)
    }

    /// Writes the manifest to `path` atomically, stamping `updated`.
    pub fn write(&mut self, path: &Path) -> Result<()> {
        self.updated = now_rfc3339();
        let mut json = serde_json::to_vec_pretty(self)
            .map_err(|e| HubError::Manifest { path: path.to_path_buf(), reason: e.to_string() })?;
        json.push(b'\n');
        write_atomic(path, &json)
    }

    /// The entry for `path`, if listed.
    pub fn file(&self, path: &str) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// The current time as RFC 3339 UTC with second precision, e.g. `2026-11-29T17:39:00Z`.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    rfc3339(secs)
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC.
pub fn rfc3339(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`
/// (public-domain algorithm, restricted here to dates after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_970_340), "2026-11-29T16:39:00Z");
    }

    #[test]
    fn round_trips_through_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sluice-install.json");
        let mut m = InstallManifest {
            format: MANIFEST_FORMAT,
            repo: "o/n".into(),
            revision: "main".into(),
            commit: "0".repeat(40),
            endpoint: "http://127.0.0.1:1".into(),
            mode: Mode::Stream,
            layout: "dir".into(),
            created: now_rfc3339(),
            updated: String::new(),
            complete: true,
            files: vec![ManifestFile {
                path: "a.safetensors".into(),
                size: 10,
                sha256: None,
                git_oid: None,
                state: FileState::Stream,
                source: Some(Source::Downloaded),
                stream: Some(StreamShard {
                    header: "a.safetensors.header".into(),
                    sparse: "a.safetensors.sparse".into(),
                    header_len: 2,
                    expert_bytes: 0,
                    ranges: vec![RangeRecord { start: 10, end: 20, sha256: "ab".into() }],
                }),
            }],
        };
        m.write(&path).expect("write");
        assert_eq!(InstallManifest::read(&path).expect("read"), m);
    }
}
