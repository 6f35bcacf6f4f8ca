//! The standard Hugging Face hub cache, read and written the way `huggingface_hub` does.
//!
//! Layout under the cache root (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`):
//!
//! ```text
//! models--ORG--NAME/
//!   blobs/{etag}                       content; etag = SHA-256 (LFS) or git blob id
//!   refs/{revision}                    the commit a branch or tag pointed to
//!   snapshots/{commit}/{path}          relative symlink to ../../blobs/{etag}
//! ```
//!
//! sluice reuses any blob already there instead of downloading it again, and when an install
//! targets the cache it writes blobs, snapshot links and refs the same way, so transformers,
//! vLLM and `huggingface-cli` share the one copy.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::repo::RemoteFile;

/// The cache root from the environment, following `huggingface_hub`'s precedence.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("HF_HUB_CACHE") {
        return Some(p);
    }
    if let Some(p) = var("HF_HOME") {
        return Some(p.join("hub"));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Some(p.join("huggingface").join("hub"));
    }
    var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub"))
}

/// The cache folder name of a model repository: `models--ORG--NAME`.
pub fn repo_folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A Hugging Face hub cache rooted at one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfCache {
    root: PathBuf,
}

impl HfCache {
    /// The cache rooted at `root` (which need not exist yet).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The cache named by the environment (see [`default_cache_dir`]).
    pub fn from_env() -> Option<Self> {
        default_cache_dir().map(Self::new)
    }

    /// Recognises `dir` as a location inside a Hugging Face cache for `repo`: the cache
    /// root itself (it holds `models--*` folders, or is the environment's cache root), the
    /// repository folder `models--ORG--NAME`, or one of its `snapshots/{commit}` folders.
    pub fn detect(dir: &Path, repo: &str) -> Option<Self> {
        let folder = repo_folder_name(repo);
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        if name(dir).as_deref() == Some(folder.as_str()) {
            return dir.parent().map(Self::new);
        }
        let up2 = dir.parent().and_then(Path::parent);
        if dir.parent().and_then(name).as_deref() == Some("snapshots")
            && up2.and_then(name).as_deref() == Some(folder.as_str())
        {
            return up2.and_then(Path::parent).map(Self::new);
        }
        let canon = |p: &Path| fs::canonicalize(p).ok();
        if let (Some(env), Some(d)) = (default_cache_dir(), canon(dir)) {
            if canon(&env).as_deref() == Some(d.as_path()) {
                return Some(Self::new(dir));
            }
        }
        let holds_models = fs::read_dir(dir).ok()?.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with("models--")
                && e.file_type().is_ok_and(|t| t.is_dir())
        });
        holds_models.then(|| Self::new(dir))
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `{root}/models--ORG--NAME`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(repo_folder_name(repo))
    }

    /// `{repo_dir}/blobs/{etag}`.
    pub fn blob_path(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag)
    }

    /// `{repo_dir}/snapshots/{commit}`.
    pub fn snapshot_dir(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The blob holding `file`'s content, if the cache has one of the right size. Looks up
    /// the blob by etag first, then follows the file's snapshot link at `commit`.
    pub fn find(&self, repo: &str, commit: &str, file: &RemoteFile) -> Option<PathBuf> {
        let size_ok = |p: &Path| fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == file.size);
        if let Some(etag) = file.etag() {
            let blob = self.blob_path(repo, etag);
            if size_ok(&blob) {
                return Some(blob);
            }
        }
        let snap = self.snapshot_dir(repo, commit).join(&file.path);
        let target = fs::canonicalize(&snap).ok()?;
        size_ok(&target).then_some(target)
    }

    /// Points `snapshots/{commit}/{path}` at `blobs/{etag}` with a relative symlink, as
    /// `huggingface_hub` does, replacing any existing entry atomically.
    pub fn link_snapshot(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        etag: &str,
    ) -> io::Result<()> {
        let link = self.snapshot_dir(repo, commit).join(path);
        let parent =
            link.parent().ok_or_else(|| io::Error::other("snapshot link has no parent"))?;
        fs::create_dir_all(parent)?;
        // From snapshots/{commit}/{dirs…}/ back up to the repository folder.
        let depth = 2 + path.split('/').count() - 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let tmp = tmp_sibling(&link);
        let _ = fs::remove_file(&tmp);
        symlink(&target, &tmp)?;
        fs::rename(&tmp, &link)
    }

    /// Records that `revision` resolved to `commit` (`refs/{revision}`), unless the
    /// revision is the commit itself.
    pub fn write_ref(&self, repo: &str, revision: &str, commit: &str) -> io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir(repo).join("refs").join(revision);
        let parent = path.parent().ok_or_else(|| io::Error::other("ref has no parent"))?;
        fs::create_dir_all(parent)?;
        let tmp = tmp_sibling(&path);
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(commit.as_bytes())?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &path)
    }

    /// The commit `refs/{revision}` points to, if recorded.
    pub fn read_ref(&self, repo: &str, revision: &str) -> Option<String> {
        let s = fs::read_to_string(self.repo_dir(repo).join("refs").join(revision)).ok()?;
        Some(s.trim().to_owned())
    }
}

/// `{path}.tmp-{pid}`: a scratch name beside `path` for atomic replacement.
pub(crate) fn tmp_sibling(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(s)
}

#[cfg(unix)]
pub(crate) fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
pub(crate) fn symlink(_target: &Path, _link: &Path) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "symlinks are only supported on unix"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_names_match_huggingface_hub() {
        assert_eq!(repo_folder_name("moonshotai/Kimi-K3"), "models--moonshotai--Kimi-K3");
        assert_eq!(repo_folder_name("gpt2"), "models--gpt2");
    }

    #[test]
    fn snapshot_links_are_relative_and_resolve() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cache = HfCache::new(tmp.path());
        let blob = cache.blob_path("o/n", "abc");
        fs::create_dir_all(blob.parent().expect("parent")).expect("mkdir");
        fs::write(&blob, b"hello").expect("write");
        cache.link_snapshot("o/n", "c0", "sub/dir/f.txt", "abc").expect("link");
        let link = cache.snapshot_dir("o/n", "c0").join("sub/dir/f.txt");
        assert_eq!(fs::read_link(&link).expect("readlink"), Path::new("../../../../blobs/abc"));
        assert_eq!(fs::read(&link).expect("read"), b"hello");
        cache.write_ref("o/n", "main", "c0").expect("ref");
        assert_eq!(cache.read_ref("o/n", "main").as_deref(), Some("c0"));
        assert_eq!(HfCache::detect(&cache.repo_dir("o/n"), "o/n"), Some(cache.clone()));
        assert_eq!(HfCache::detect(tmp.path(), "o/n"), Some(cache.clone()));
        assert_eq!(HfCache::detect(&cache.snapshot_dir("o/n", "c0"), "o/n"), Some(cache));
    }
}
