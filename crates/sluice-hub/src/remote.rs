//! The hub as the expert store's remote source, and what a run needs from an install.
//!
//! [`HubRemote`] implements `sluice_store::RemoteSource` with a [`RangeFetcher`]: shard `i`
//! of the expert index is the repository file `files[i]`, fetched at the install's pinned
//! commit (retries, backoff, `Retry-After`, `Content-Range` and length checks are the
//! fetcher's). [`Install`] reads `sluice-install.json` and says how to open the install: which
//! shards are sparse, and which hub to ask (the manifest's endpoint, unless `HF_ENDPOINT`
//! names another; the token from `HF_TOKEN`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sluice_store::{RemoteError, RemoteSource};

use crate::client::{HubClient, HubConfig};
use crate::error::{HubError, Result};
use crate::fetcher::RangeFetcher;
use crate::layout::MANIFEST_FILE;
use crate::manifest::{FileState, InstallManifest};
use crate::plan::Mode;

/// Byte ranges of a pinned repository's shards, for the expert store.
#[derive(Debug)]
pub struct HubRemote {
    fetcher: RangeFetcher,
    repo: String,
    endpoint: String,
    files: Vec<String>,
}

impl HubRemote {
    /// A source for `repo` at `commit` whose shard `i` is the repository file `files[i]`.
    pub fn new(client: HubClient, repo: &str, commit: &str, files: Vec<String>) -> Result<Self> {
        for f in &files {
            crate::repo::validate_path(f)?;
        }
        let endpoint = client.endpoint().to_owned();
        let fetcher = RangeFetcher::new(client, repo, commit)?;
        Ok(Self { fetcher, repo: repo.to_owned(), endpoint, files })
    }
}

impl RemoteSource for HubRemote {
    fn describe(&self) -> String {
        let c = self.fetcher.commit();
        format!("{}@{} on {}", self.repo, c.get(..12).unwrap_or(c), self.endpoint)
    }

    fn fetch(
        &self,
        file: usize,
        offset: u64,
        buf: &mut [u8],
    ) -> std::result::Result<(), RemoteError> {
        let path =
            self.files.get(file).ok_or_else(|| format!("no repository file for shard {file}"))?;
        self.fetcher.fetch_range_into(path, offset, buf).map_err(|e| Box::new(e) as RemoteError)
    }
}

/// An install directory with a `sluice-install.json`.
#[derive(Debug, Clone)]
pub struct Install {
    /// The model directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: InstallManifest,
}

impl Install {
    /// Reads `dir/sluice-install.json`; `Ok(None)` when there is none (a plain checkpoint).
    pub fn detect(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(MANIFEST_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let manifest = InstallManifest::read(&path)?;
        Ok(Some(Self { dir: dir.to_path_buf(), manifest }))
    }

    /// True for a stream install (some shards sparse, routed experts fetched on use).
    pub fn is_stream(&self) -> bool {
        self.manifest.mode == Mode::Stream
    }

    /// Repository path → sparse file (relative to the model directory) of every stream shard.
    pub fn sparse_shards(&self) -> BTreeMap<String, String> {
        self.manifest
            .files
            .iter()
            .filter(|f| f.state == FileState::Stream)
            .filter_map(|f| Some((f.path.clone(), f.stream.as_ref()?.sparse.clone())))
            .collect()
    }

    /// Refuses an install that a run cannot use: unfinished, or files still pending.
    pub fn check_runnable(&self) -> Result<()> {
        let why = if !self.manifest.complete {
            Some("the pull did not finish".to_owned())
        } else {
            self.manifest
                .files
                .iter()
                .find(|f| f.state == FileState::Pending)
                .map(|f| format!("{} is not installed", f.path))
        };
        match why {
            Some(reason) => Err(HubError::Manifest {
                path: self.dir.join(MANIFEST_FILE),
                reason: format!(
                    "{reason}; re-run `sluice pull {} --dir {}` to finish it",
                    self.manifest.repo,
                    self.dir.display()
                ),
            }),
            None => Ok(()),
        }
    }

    /// The hub configuration for run-time fetches: the manifest's endpoint, unless
    /// `HF_ENDPOINT` is set (then that, e.g. a mirror); the token from `HF_TOKEN`.
    pub fn hub_config(&self) -> HubConfig {
        let mut cfg = HubConfig::from_env();
        if std::env::var("HF_ENDPOINT").ok().filter(|s| !s.trim().is_empty()).is_none() {
            let token = cfg.token.take();
            cfg = HubConfig::new(self.manifest.endpoint.clone());
            cfg.token = token;
        }
        cfg
    }

    /// A remote source for this install whose shard `i` is the repository file `files[i]`.
    pub fn remote(&self, cfg: HubConfig, files: Vec<String>) -> Result<HubRemote> {
        HubRemote::new(HubClient::new(cfg)?, &self.manifest.repo, &self.manifest.commit, files)
    }
}
