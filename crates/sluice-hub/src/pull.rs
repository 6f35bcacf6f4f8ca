//! Carrying out an [`InstallPlan`]: N workers, per-file outcomes, the manifest, the report.
//!
//! Each file is one job, largest first so the long downloads start early. A job either
//! confirms a file already here (hashing it when `--deep`, when it is small, or when no
//! earlier manifest vouches for it), links a blob from the Hugging Face cache, downloads the
//! whole file, or — in stream mode, for shards with routed experts — fetches its header and
//! spine. The manifest is rewritten after every finished file, so a killed pull loses at
//! most the files in flight, and a restart trusts what the manifest recorded.
//!
//! Failures do not stop other files, except those that will fail everything (disk full,
//! rejected token): then the remaining jobs are cancelled. The pull returns
//! [`HubError::Incomplete`] listing every failed file with its cause.

use std::collections::VecDeque;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::HubClient;
use crate::download::{verify_local, Worker};
use crate::error::{bytes, FileFailure, HubError, Result};
use crate::hf_cache::{symlink, tmp_sibling};
use crate::layout::{ensure_parent, sync_parent, InstallTarget};
use crate::manifest::{
    now_rfc3339, FileState, InstallManifest, ManifestFile, Source, MANIFEST_FORMAT,
};
use crate::plan::{InstallPlan, LocalState, Mode, PlannedFile};
use crate::progress::Progress;
use crate::sink::{FsSinks, SinkFactory};
use crate::stream::remove_stream_files;

/// Options for [`HubClient::pull`].
#[derive(Clone)]
pub struct PullOptions {
    /// Parallel downloads (`--workers`).
    pub workers: usize,
    /// Hash every file that is reused rather than downloaded (`--deep`).
    pub deep_verify: bool,
    /// Reused files up to this size are hashed even without `--deep` (it is cheap).
    pub cheap_verify_limit: u64,
    /// Where bytes are written; the real file system unless a test says otherwise.
    pub sinks: Arc<dyn SinkFactory>,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            workers: 8,
            deep_verify: false,
            cheap_verify_limit: 64 << 20,
            sinks: Arc::new(FsSinks),
        }
    }
}

/// How a reused file was put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// A hard link to the cache blob (same volume).
    Hardlink,
    /// A symbolic link to the cache blob (another volume).
    Symlink,
}

/// What happened to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// Downloaded in full and verified; `resumed_from` bytes came from an earlier `.part`.
    Downloaded {
        /// Bytes of an earlier partial download that were kept.
        resumed_from: u64,
    },
    /// Already installed; `hashed` says whether it was re-verified now.
    Present {
        /// Whether its hash was checked in this run.
        hashed: bool,
    },
    /// Linked from the Hugging Face cache.
    Linked {
        /// The cache blob.
        from: PathBuf,
        /// Hard or symbolic link.
        kind: LinkKind,
        /// Whether its hash was checked in this run.
        hashed: bool,
    },
    /// Stream mode: header and spine ranges fetched, routed experts left remote.
    Streamed {
        /// Spine ranges present.
        ranges: usize,
        /// Ranges that an earlier run had already fetched.
        resumed_ranges: usize,
        /// Bytes of routed experts left remote.
        expert_bytes: u64,
    },
    /// Stream mode: already streamed by an earlier pull.
    AlreadyStreamed,
}

/// One file's line in the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// Repository path.
    pub path: String,
    /// What happened.
    pub outcome: FileOutcome,
    /// Bytes received from the network for this file.
    pub downloaded: u64,
    /// Bytes that were already local (reused, present, resumed).
    pub reused: u64,
}

/// The result of a successful pull.
#[derive(Debug, Clone)]
pub struct InstallReport {
    /// `ORG/NAME`.
    pub repo: String,
    /// The pinned commit.
    pub commit: String,
    /// The mode installed.
    pub mode: Mode,
    /// The directory to load the model from.
    pub model_dir: PathBuf,
    /// The install manifest.
    pub manifest: PathBuf,
    /// Every file, in repository order.
    pub files: Vec<FileReport>,
    /// Total bytes received from the network.
    pub bytes_downloaded: u64,
    /// Total bytes already local.
    pub bytes_reused: u64,
    /// Wall time of the pull.
    pub elapsed: Duration,
}

impl InstallReport {
    /// Download throughput in bytes per second over the whole pull.
    pub fn throughput(&self) -> u64 {
        let micros = self.elapsed.as_micros().max(1);
        u64::try_from(u128::from(self.bytes_downloaded) * 1_000_000 / micros).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for InstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count =
            |p: fn(&FileOutcome) -> bool| self.files.iter().filter(|r| p(&r.outcome)).count();
        writeln!(
            f,
            "installed {} @ {} ({} mode) in {}",
            self.repo,
            self.commit,
            self.mode,
            self.model_dir.display()
        )?;
        writeln!(
            f,
            "  downloaded {} in {:.1}s ({}/s); reused {}",
            bytes(self.bytes_downloaded),
            self.elapsed.as_secs_f64(),
            bytes(self.throughput()),
            bytes(self.bytes_reused)
        )?;
        writeln!(
            f,
            "  {} files: {} downloaded, {} already present, {} linked from the HF cache, {} streamed",
            self.files.len(),
            count(|o| matches!(o, FileOutcome::Downloaded { .. })),
            count(|o| matches!(o, FileOutcome::Present { .. })),
            count(|o| matches!(o, FileOutcome::Linked { .. })),
            count(|o| matches!(o, FileOutcome::Streamed { .. } | FileOutcome::AlreadyStreamed)),
        )?;
        write!(f, "  manifest {}", self.manifest.display())
    }
}

impl HubClient {
    /// Carries out `plan`: refuses if it does not fit, then installs every file with
    /// `opts.workers` parallel workers, reporting to `progress`.
    pub fn pull(
        &self,
        plan: &InstallPlan,
        opts: &PullOptions,
        progress: &dyn Progress,
    ) -> Result<InstallReport> {
        plan.check()?;
        let started = Instant::now();
        let layout = &plan.layout;
        let model_dir = layout.model_dir();
        fs::create_dir_all(&model_dir).map_err(|e| HubError::write(&model_dir, "", e))?;
        let manifest_path = layout.manifest_path();
        let mut manifest = start_manifest(plan, self.endpoint());
        manifest.write(&manifest_path)?;
        let manifest = Mutex::new(manifest);

        let mut jobs: Vec<&PlannedFile> = plan.files.iter().collect();
        jobs.sort_by_key(|p| {
            (matches!(p.local, LocalState::Missing | LocalState::Partial(_)), p.file.size)
        });
        let queue = Mutex::new(jobs.into_iter().collect::<VecDeque<_>>());
        let results = Mutex::new(Vec::new());
        let abort = AtomicBool::new(false);
        progress.begin(plan.needs().to_download, plan.files.len());
        std::thread::scope(|s| {
            for _ in 0..opts.workers.clamp(1, 256) {
                s.spawn(|| {
                    let w = Worker {
                        client: self.fork(),
                        layout,
                        sinks: opts.sinks.as_ref(),
                        progress,
                        abort: &abort,
                    };
                    while let Some(pf) = queue.lock().ok().and_then(|mut q| q.pop_back()) {
                        let r = if abort.load(Ordering::Relaxed) {
                            Err(HubError::Cancelled { file: pf.file.path.clone() })
                        } else {
                            install_one(&w, plan, pf, opts)
                        };
                        let r = r.and_then(|(report, entry)| {
                            let mut m = manifest.lock().map_err(|_| poisoned(&manifest_path))?;
                            if let Some(slot) = m.files.iter_mut().find(|e| e.path == entry.path) {
                                *slot = entry;
                            }
                            m.write(&manifest_path)?;
                            Ok(report)
                        });
                        if r.as_ref().is_err_and(HubError::is_fatal_for_all) {
                            abort.store(true, Ordering::Relaxed);
                        }
                        if let Ok(mut out) = results.lock() {
                            out.push((pf.file.path.clone(), r));
                        }
                    }
                });
            }
        });
        progress.end();

        let mut manifest = manifest.into_inner().map_err(|_| poisoned(&manifest_path))?;
        let mut files = Vec::new();
        let mut failures = Vec::new();
        for (file, r) in results.into_inner().map_err(|_| poisoned(&manifest_path))? {
            match r {
                Ok(rep) => files.push(rep),
                Err(error) => failures.push(FileFailure { file, error }),
            }
        }
        if !failures.is_empty() {
            manifest.write(&manifest_path)?;
            failures.sort_by_key(|f| matches!(f.error, HubError::Cancelled { .. }));
            return Err(HubError::Incomplete { failures });
        }
        manifest.complete = true;
        manifest.write(&manifest_path)?;
        if let Some(cache) = layout.hf_cache() {
            cache
                .write_ref(&layout.repo, &plan.info.revision, &layout.commit)
                .map_err(|e| HubError::io(cache.repo_dir(&layout.repo).join("refs"), e))?;
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(InstallReport {
            repo: layout.repo.clone(),
            commit: layout.commit.clone(),
            mode: plan.mode,
            model_dir,
            manifest: manifest_path,
            bytes_downloaded: files.iter().map(|f| f.downloaded).sum(),
            bytes_reused: files.iter().map(|f| f.reused).sum(),
            files,
            elapsed: started.elapsed(),
        })
    }
}

fn poisoned(path: &Path) -> HubError {
    HubError::Manifest {
        path: path.to_path_buf(),
        reason: "a worker panicked while writing it".into(),
    }
}

/// The manifest at the start of a pull: every file pending, except those an earlier
/// manifest of the same commit recorded and that are still here.
fn start_manifest(plan: &InstallPlan, endpoint: &str) -> InstallManifest {
    let prev = plan.previous.as_ref();
    let files = plan
        .files
        .iter()
        .map(|p| {
            let kept = prev.and_then(|m| m.file(&p.file.path)).filter(|e| {
                matches!(p.local, LocalState::Installed(_) | LocalState::Streamed)
                    && e.state != FileState::Pending
                    && e.size == p.file.size
            });
            kept.cloned().unwrap_or_else(|| entry(p, FileState::Pending, None, None))
        })
        .collect();
    let now = now_rfc3339();
    InstallManifest {
        format: MANIFEST_FORMAT,
        repo: plan.info.repo.clone(),
        revision: plan.info.revision.clone(),
        commit: plan.info.commit.clone(),
        endpoint: endpoint.to_owned(),
        mode: plan.mode,
        layout: match plan.layout.target {
            InstallTarget::Dir { .. } => "dir".into(),
            InstallTarget::HfCache(_) => "hf-cache".into(),
        },
        created: prev.map(|m| m.created.clone()).unwrap_or_else(|| now.clone()),
        updated: now,
        complete: false,
        files,
    }
}

fn entry(
    p: &PlannedFile,
    state: FileState,
    source: Option<Source>,
    sha256: Option<String>,
) -> ManifestFile {
    ManifestFile {
        path: p.file.path.clone(),
        size: p.file.size,
        sha256: sha256.or_else(|| p.file.sha256.clone()),
        git_oid: p.file.git_oid.clone(),
        state,
        source,
        stream: None,
    }
}

type Done = (FileReport, ManifestFile);

/// Installs one file according to its local state and the plan's mode.
fn install_one(
    w: &Worker<'_>,
    plan: &InstallPlan,
    p: &PlannedFile,
    opts: &PullOptions,
) -> Result<Done> {
    let f = &p.file;
    let report = |outcome, downloaded, reused| FileReport {
        path: f.path.clone(),
        outcome,
        downloaded,
        reused,
    };
    match &p.local {
        LocalState::Installed(path) => {
            let vouched = plan.previous.as_ref().and_then(|m| m.file(&f.path)).is_some_and(|e| {
                e.state == FileState::Full
                    && e.size == f.size
                    && (f.sha256.is_none() || e.sha256 == f.sha256)
            });
            let hash = opts.deep_verify || f.size <= opts.cheap_verify_limit || !vouched;
            let sha = if hash {
                match verify_local(path, f) {
                    Ok(sha) => Some(sha),
                    Err(e) => {
                        w.progress.note(&format!(
                            "{}: installed copy is bad ({e}); downloading again",
                            f.path
                        ));
                        let _ = fs::remove_file(path);
                        return download(w, p);
                    }
                }
            } else {
                plan.previous.as_ref().and_then(|m| m.file(&f.path)).and_then(|e| e.sha256.clone())
            };
            w.layout.link(f)?;
            Ok((
                report(FileOutcome::Present { hashed: hash }, 0, f.size),
                entry(p, FileState::Full, Some(Source::Present), sha),
            ))
        }
        LocalState::InCache(blob) => {
            let hash = opts.deep_verify || f.size <= opts.cheap_verify_limit;
            let sha = if hash {
                match verify_local(blob, f) {
                    Ok(sha) => Some(sha),
                    Err(e) => {
                        w.progress.note(&format!(
                            "{}: cached copy is bad ({e}); downloading instead",
                            f.path
                        ));
                        return download(w, p);
                    }
                }
            } else {
                None
            };
            let kind = link_from_cache(w, p, blob)?;
            let outcome = FileOutcome::Linked { from: blob.clone(), kind, hashed: hash };
            Ok((report(outcome, 0, f.size), entry(p, FileState::Full, Some(Source::HfCache), sha)))
        }
        LocalState::Streamed if plan.mode == Mode::Stream => {
            let prev = plan.previous.as_ref().and_then(|m| m.file(&f.path)).cloned();
            let e = prev.ok_or_else(|| HubError::Manifest {
                path: w.layout.manifest_path(),
                reason: format!("{} was streamed but is no longer listed", f.path),
            })?;
            Ok((report(FileOutcome::AlreadyStreamed, 0, 0), e))
        }
        _ if plan.mode == Mode::Stream && p.streams() => {
            let header = p.header.as_ref().ok_or_else(|| HubError::BadHeader {
                file: f.path.clone(),
                reason: "header was not fetched during planning".into(),
            })?;
            let s = w.download_stream(f, header, plan.coalesce_gap)?;
            let outcome = FileOutcome::Streamed {
                ranges: s.record.ranges.len(),
                resumed_ranges: s.resumed_ranges,
                expert_bytes: s.record.expert_bytes,
            };
            let mut e = entry(p, FileState::Stream, Some(Source::Downloaded), None);
            e.stream = Some(s.record);
            Ok((report(outcome, s.received, 0), e))
        }
        _ => download(w, p),
    }
}

fn download(w: &Worker<'_>, p: &PlannedFile) -> Result<Done> {
    let d = w.download_full(&p.file)?;
    let (header, sparse) = w.layout.stream_paths(&p.file);
    remove_stream_files(&header, &sparse);
    let outcome = FileOutcome::Downloaded { resumed_from: d.resumed_from };
    let rep = FileReport {
        path: p.file.path.clone(),
        outcome,
        downloaded: d.received,
        reused: d.resumed_from,
    };
    Ok((rep, entry(p, FileState::Full, Some(Source::Downloaded), Some(d.sha256))))
}

/// Puts a cache blob at `p`'s final name: a hard link when on the same volume, else a
/// symbolic link; atomically, through a scratch name.
fn link_from_cache(w: &Worker<'_>, p: &PlannedFile, blob: &Path) -> Result<LinkKind> {
    let dest = w.layout.final_path(&p.file)?;
    ensure_parent(&dest)?;
    let tmp = tmp_sibling(&dest);
    let _ = fs::remove_file(&tmp);
    let kind = match fs::hard_link(blob, &tmp) {
        Ok(()) => LinkKind::Hardlink,
        Err(_) => {
            let abs = fs::canonicalize(blob).map_err(|e| HubError::io(blob, e))?;
            symlink(&abs, &tmp).map_err(|e| HubError::io(&tmp, e))?;
            LinkKind::Symlink
        }
    };
    fs::rename(&tmp, &dest).map_err(|e| HubError::io(&dest, e))?;
    sync_parent(&dest)?;
    w.layout.link(&p.file)?;
    Ok(kind)
}
