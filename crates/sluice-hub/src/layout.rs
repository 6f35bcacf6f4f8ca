//! Where an install's files go: a plain directory, or a Hugging Face cache.
//!
//! Both layouts share one rule: a file appears under its final name only after every byte
//! was verified, flushed (`fsync`) and renamed into place, and the rename is made durable by
//! syncing the directory. Until then its bytes live in `{final}.part`, which a later run
//! resumes. In a plain directory the final name is `{dir}/{path}`; in a cache it is the blob
//! `blobs/{etag}`, and a relative snapshot link `snapshots/{commit}/{path}` is added after.
//!
//! Files that are not hub files — stream-mode headers and sparse shards, the install manifest
//! — live in the model directory (`{dir}` or `snapshots/{commit}`).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};
use crate::hf_cache::HfCache;
use crate::repo::RemoteFile;

/// File name of the install manifest inside the model directory.
pub const MANIFEST_FILE: &str = "sluice-install.json";

/// The kind of place an install is written to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallTarget {
    /// A plain checkpoint directory: `{root}/{path}`.
    Dir {
        /// The directory.
        root: PathBuf,
    },
    /// A Hugging Face hub cache (blobs, snapshot links, refs).
    HfCache(HfCache),
}

impl InstallTarget {
    /// The target for `--dir`: a Hugging Face cache when `dir` is (inside) one, a plain
    /// directory otherwise. Without `--dir`, the environment's Hugging Face cache, so a
    /// plain `sluice pull` shares its copy with other tools; `./models/ORG--NAME` when no
    /// cache location can be derived (no `HOME`).
    pub fn choose(dir: Option<&Path>, repo: &str) -> Self {
        match dir {
            Some(d) => HfCache::detect(d, repo)
                .map(Self::HfCache)
                .unwrap_or_else(|| Self::Dir { root: d.to_path_buf() }),
            None => HfCache::from_env().map(Self::HfCache).unwrap_or_else(|| Self::Dir {
                root: Path::new("models").join(repo.replace('/', "--")),
            }),
        }
    }
}

/// An install target bound to one repository and commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The target.
    pub target: InstallTarget,
    /// `ORG/NAME`.
    pub repo: String,
    /// The pinned commit.
    pub commit: String,
}

impl Layout {
    /// Binds `target` to `repo` at `commit`.
    pub fn new(target: InstallTarget, repo: &str, commit: &str) -> Self {
        Self { target, repo: repo.to_owned(), commit: commit.to_owned() }
    }

    /// The directory a model loader opens: `{dir}` or `snapshots/{commit}`.
    pub fn model_dir(&self) -> PathBuf {
        match &self.target {
            InstallTarget::Dir { root } => root.clone(),
            InstallTarget::HfCache(c) => c.snapshot_dir(&self.repo, &self.commit),
        }
    }

    /// The install manifest's path.
    pub fn manifest_path(&self) -> PathBuf {
        self.model_dir().join(MANIFEST_FILE)
    }

    /// The cache this layout writes into, if any.
    pub fn hf_cache(&self) -> Option<&HfCache> {
        match &self.target {
            InstallTarget::HfCache(c) => Some(c),
            InstallTarget::Dir { .. } => None,
        }
    }

    /// Where `file`'s verified bytes live under their final name.
    pub fn final_path(&self, file: &RemoteFile) -> Result<PathBuf> {
        match &self.target {
            InstallTarget::Dir { root } => Ok(root.join(&file.path)),
            InstallTarget::HfCache(c) => {
                let etag = file.etag().ok_or_else(|| HubError::Protocol {
                    url: file.path.clone(),
                    reason: "the hub gave no oid for this file, so it has no cache blob name"
                        .into(),
                })?;
                Ok(c.blob_path(&self.repo, etag))
            }
        }
    }

    /// `{final}.part`: where an unfinished download lives.
    pub fn part_path(&self, file: &RemoteFile) -> Result<PathBuf> {
        Ok(with_suffix(&self.final_path(file)?, ".part"))
    }

    /// The stream-mode header (`{path}.header`) and sparse shard (`{path}.sparse`) paths.
    pub fn stream_paths(&self, file: &RemoteFile) -> (PathBuf, PathBuf) {
        let base = self.model_dir().join(&file.path);
        (with_suffix(&base, ".header"), with_suffix(&base, ".sparse"))
    }

    /// Moves a verified, synced `part` to `file`'s final name, makes the rename durable, and
    /// in a cache links the snapshot entry to the blob.
    pub(crate) fn publish(&self, file: &RemoteFile, part: &Path) -> Result<PathBuf> {
        let dest = self.final_path(file)?;
        fs::rename(part, &dest).map_err(|e| HubError::io(&dest, e))?;
        sync_parent(&dest)?;
        self.link(file)?;
        Ok(dest)
    }

    /// In a cache, (re)creates `snapshots/{commit}/{path}` → `blobs/{etag}`; a no-op in a
    /// plain directory.
    pub(crate) fn link(&self, file: &RemoteFile) -> Result<()> {
        if let (InstallTarget::HfCache(c), Some(etag)) = (&self.target, file.etag()) {
            c.link_snapshot(&self.repo, &self.commit, &file.path, etag).map_err(|e| {
                HubError::io(c.snapshot_dir(&self.repo, &self.commit).join(&file.path), e)
            })?;
        }
        Ok(())
    }

    /// The nearest existing ancestor of the model directory: the volume to measure.
    pub fn volume(&self) -> PathBuf {
        let mut p = self.model_dir();
        loop {
            if p.exists() {
                return p;
            }
            match p.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => p = parent.to_path_buf(),
                _ => return PathBuf::from("."),
            }
        }
    }
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Creates the parent directory of `path`.
pub(crate) fn ensure_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            fs::create_dir_all(p).map_err(|e| HubError::io(p, e))
        }
        _ => Ok(()),
    }
}

/// Syncs the directory holding `path`, so a rename into it survives a crash.
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    #[cfg(unix)]
    if let Some(p) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::File::open(p).and_then(|d| d.sync_all()).map_err(|e| HubError::io(p, e))?;
    }
    let _ = path;
    Ok(())
}

/// Opens (creating) `path` and takes an exclusive advisory lock on it, so two pulls into the
/// same place cannot write one partial file at once. The lock goes with the returned handle,
/// and with the process if it dies.
pub(crate) fn lock_exclusive(path: &Path, file: &str) -> Result<fs::File> {
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| HubError::write(path, file, e))?;
    #[cfg(unix)]
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        HubError::Busy { path: path.to_path_buf(), file: file.to_owned(), source: e.into() }
    })?;
    Ok(f)
}

/// Writes `bytes` to `path` atomically: a scratch file beside it, fsync, rename, dir sync.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    ensure_parent(path)?;
    let tmp = crate::hf_cache::tmp_sibling(path);
    let res = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(HubError::write(&tmp, &path.to_string_lossy(), e));
    }
    fs::rename(&tmp, path).map_err(|e| HubError::io(path, e))?;
    sync_parent(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_file_has_one_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let part = dir.path().join("f.part");
        let held = lock_exclusive(&part, "f").expect("first lock");
        let err = lock_exclusive(&part, "f").expect_err("second writer refused");
        assert!(matches!(err, HubError::Busy { .. }), "{err}");
        drop(held);
        lock_exclusive(&part, "f").expect("free again");
    }
}
