//! Resolving a repository revision to a pinned commit and its file list.
//!
//! Two hub API calls, answered the way huggingface.co answers them:
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{revision}` gives the commit (`sha`) and the
//!   file names (`siblings[].rfilename`);
//! - `GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true` gives, per file, its size,
//!   git blob id (`oid`) and, for LFS files, `lfs.oid` (the SHA-256 of the content). The hub
//!   pages this listing and links the next page in a `Link: <…>; rel="next"` header.
//!
//! Everything the hub sends is validated before use: the commit must be 40 hex digits (it
//! becomes a directory name), hashes must be hex of the right length, and file paths must be
//! relative, without `..`, empty or hidden-traversal components (they become file names).

use std::collections::HashMap;

use reqwest::header::LINK;
use reqwest::Url;
use serde::Deserialize;

use crate::client::{header_str, HubClient};
use crate::error::{HubError, Result};

/// Most tree pages followed before the listing is declared endless.
const MAX_TREE_PAGES: usize = 10_000;

/// One file of a repository at a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path inside the repository, `/`-separated, validated safe.
    pub path: String,
    /// Size in bytes (of the LFS object for LFS files).
    pub size: u64,
    /// SHA-256 of the content, lowercase hex; present for LFS files.
    pub sha256: Option<String>,
    /// Git blob id (SHA-1), lowercase hex; for non-LFS files it hashes the content itself.
    pub git_oid: Option<String>,
}

impl RemoteFile {
    /// Whether the file is stored in LFS (so has a content SHA-256 from the hub).
    pub fn is_lfs(&self) -> bool {
        self.sha256.is_some()
    }

    /// The name huggingface_hub gives this file's blob in its cache: the SHA-256 for LFS
    /// files, the git blob id for the others (both are what the hub sends as `ETag`).
    pub fn etag(&self) -> Option<&str> {
        self.sha256.as_deref().or(self.git_oid.as_deref())
    }

    /// Whether the file is a safetensors shard (by name).
    pub fn is_safetensors(&self) -> bool {
        self.path.ends_with(".safetensors")
    }
}

/// A repository revision resolved to a commit, with every file's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoInfo {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision as asked for (`main`, a tag, a branch, or a commit).
    pub revision: String,
    /// The commit it resolved to: 40 lowercase hex digits.
    pub commit: String,
    /// Every file, sorted by path.
    pub files: Vec<RemoteFile>,
}

impl RepoInfo {
    /// Sum of all file sizes.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[derive(Deserialize)]
struct ModelInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    oid: Option<String>,
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    oid: String,
    size: u64,
}

impl HubClient {
    /// Resolves `revision` of `repo` to a commit and lists its files with sizes and hashes.
    pub fn resolve(&self, repo: &str, revision: &str) -> Result<RepoInfo> {
        validate_repo(repo)?;
        validate_revision(revision)?;
        let mut segs = vec!["api", "models"];
        segs.extend(repo.split('/'));
        segs.extend(["revision", revision]);
        let url = self.url(&segs, None)?;
        let info: ModelInfo = self.get_json(&url)?;
        let commit = info.sha.ok_or_else(|| HubError::Json {
            url: url.to_string(),
            reason: "no `sha` (commit) in the model info".into(),
        })?;
        if !is_hex(&commit, 40) {
            return Err(HubError::Json {
                url: url.to_string(),
                reason: format!("commit {commit:?} is not 40 hex digits"),
            });
        }
        let commit = commit.to_ascii_lowercase();
        let tree = self.list_tree(repo, &commit)?;
        let mut files = Vec::with_capacity(info.siblings.len());
        for s in info.siblings {
            validate_path(&s.rfilename)?;
            let entry = tree.get(&s.rfilename).ok_or_else(|| HubError::Json {
                url: url.to_string(),
                reason: format!("{} is listed but missing from the tree listing", s.rfilename),
            })?;
            files.push(entry.clone());
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|a, b| a.path == b.path);
        Ok(RepoInfo { repo: repo.to_owned(), revision: revision.to_owned(), commit, files })
    }

    /// Follows the paginated recursive tree listing of `commit`.
    fn list_tree(&self, repo: &str, commit: &str) -> Result<HashMap<String, RemoteFile>> {
        let mut segs = vec!["api", "models"];
        segs.extend(repo.split('/'));
        segs.extend(["tree", commit]);
        let mut next = Some(self.url(&segs, Some("recursive=true"))?);
        let mut out = HashMap::new();
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_TREE_PAGES {
                return Err(HubError::Protocol {
                    url: url.to_string(),
                    reason: format!("tree listing longer than {MAX_TREE_PAGES} pages"),
                });
            }
            let resp = self.with_retries(|_| self.get(&url, None), |_, _| {})?;
            next = header_str(resp.headers(), LINK.as_str())
                .and_then(|l| next_link(&l))
                .and_then(|l| url.join(&l).ok());
            let body =
                resp.bytes().map_err(|e| HubError::Request { url: url.to_string(), source: e })?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body)
                .map_err(|e| HubError::Json { url: url.to_string(), reason: e.to_string() })?;
            for e in entries.into_iter().filter(|e| e.kind == "file") {
                let file = tree_file(&url, e)?;
                out.insert(file.path.clone(), file);
            }
        }
        Ok(out)
    }

    /// GET `url` (with retries) and parse the body as JSON.
    fn get_json<T: for<'de> Deserialize<'de>>(&self, url: &Url) -> Result<T> {
        let body = self.with_retries(
            |_| {
                self.get(url, None)?
                    .bytes()
                    .map_err(|e| HubError::Request { url: url.to_string(), source: e })
            },
            |_, _| {},
        )?;
        serde_json::from_slice(&body)
            .map_err(|e| HubError::Json { url: url.to_string(), reason: e.to_string() })
    }
}

fn tree_file(url: &Url, e: TreeEntry) -> Result<RemoteFile> {
    validate_path(&e.path)?;
    let bad = |what: &str, v: &str| HubError::Json {
        url: url.to_string(),
        reason: format!("{}: {what} {v:?} is not valid hex", e.path),
    };
    let git_oid = match e.oid {
        Some(o) if is_hex(&o, 40) => Some(o.to_ascii_lowercase()),
        Some(o) => return Err(bad("oid", &o)),
        None => None,
    };
    let (size, sha256) = match e.lfs {
        Some(lfs) if is_hex(&lfs.oid, 64) => (lfs.size, Some(lfs.oid.to_ascii_lowercase())),
        Some(lfs) => return Err(bad("lfs.oid", &lfs.oid)),
        None => (e.size, None),
    };
    Ok(RemoteFile { path: e.path, size, sha256, git_oid })
}

/// Extracts the `rel="next"` target from a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim().replace(' ', "");
            p == "rel=\"next\"" || p == "rel=next"
        });
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| target.to_owned())
    })
}

/// Whether `s` is exactly `len` hex digits.
pub(crate) fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Checks a repository id: `NAME` or `ORG/NAME`, each part of letters, digits, `-`, `_`, `.`,
/// not starting with `.` and at most 96 characters.
pub fn validate_repo(repo: &str) -> Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok = (1..=2).contains(&parts.len())
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with('.')
                && !p.contains("--")
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(HubError::InvalidRepo { repo: repo.to_owned() })
    }
}

/// Checks a revision name: non-empty, no control characters, no `.` or `..` component (it
/// may become `refs/{revision}` in a Hugging Face cache).
pub fn validate_revision(revision: &str) -> Result<()> {
    let ok = !revision.is_empty()
        && revision.len() <= 255
        && !revision.chars().any(char::is_control)
        && !revision.starts_with('/')
        && revision.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(HubError::InvalidRevision { revision: revision.to_owned() })
    }
}

/// Checks a repository file path: relative, `/`-separated, no empty, `.` or `..`
/// components, no backslashes or control characters.
pub fn validate_path(path: &str) -> Result<()> {
    let ok = !path.is_empty()
        && path.len() <= 4096
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(HubError::UnsafePath { path: path.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_are_refused() {
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a\\b", "./a", "a/\n"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        for good in ["config.json", "sub/dir/model.safetensors", ".gitattributes"] {
            assert!(validate_path(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn repo_ids() {
        assert!(validate_repo("moonshotai/Kimi-K3").is_ok());
        assert!(validate_repo("gpt2").is_ok());
        for bad in ["a/b/c", "../x", "a/", "a b/c", "a--b/c"] {
            assert!(validate_repo(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn revisions() {
        assert!(validate_revision("main").is_ok());
        assert!(validate_revision("refs/pr/1").is_ok());
        for bad in ["", "..", "a/../b", "/abs", "x\n"] {
            assert!(validate_revision(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn link_header_next() {
        let h = r#"<https://hub/api/models/a/b/tree/c?cursor=xyz>; rel="next""#;
        assert_eq!(next_link(h).as_deref(), Some("https://hub/api/models/a/b/tree/c?cursor=xyz"));
        assert_eq!(next_link(r#"<https://x>; rel="prev""#), None);
    }
}
