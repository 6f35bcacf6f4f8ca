//! The capacity plan: what each install mode needs, what is already here, and what fits.
//!
//! Planning moves no file content. It resolves nothing itself (it takes a [`RepoInfo`]),
//! reads each safetensors shard's header (two small range requests, or the local copy when
//! the shard is already here) to split spine from routed experts, looks for every file in
//! the install target, in `.part` files and in the Hugging Face cache, and measures free space
//! on the target volume through the injectable [`FreeSpace`] trait.
//!
//! - **full** needs every file; **stream** needs every file except the routed-expert bytes of
//!   expert shards (their headers and spine tensors are fetched, experts later on demand).
//! - Bytes already local (installed, reusable from the cache, or in a `.part`) are not needed
//!   again. Headroom on what remains is 2% + 1 GiB.
//! - `--full` refuses when the need exceeds free space, `--stream` likewise; with no mode,
//!   full is chosen when it fits, stream otherwise, and the plan says why.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::client::HubClient;
use crate::error::{bytes, HubError, Result};
use crate::fetcher::RangeFetcher;
use crate::hf_cache::HfCache;
use crate::layout::{InstallTarget, Layout};
use crate::manifest::{FileState, InstallManifest};
use crate::repo::{is_hex, validate_path, validate_repo, RemoteFile, RepoInfo};
use crate::shard::{fetch_header, RoutedTensors, ShardHeader, DEFAULT_COALESCE_GAP};

/// Fixed part of the headroom added to any non-zero need.
pub const HEADROOM_FIXED: u64 = 1 << 30;
/// Proportional part of the headroom, in percent of the need.
pub const HEADROOM_PERCENT: u64 = 2;

/// Free space on the volume holding a path; a trait so tests can pretend a disk is small.
pub trait FreeSpace: Send + Sync {
    /// Bytes available to an unprivileged writer on the volume holding `path`.
    fn free_bytes(&self, path: &Path) -> io::Result<u64>;
}

/// [`FreeSpace`] from `statvfs(2)`: `f_bavail × f_frsize`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatvfsFreeSpace;

impl FreeSpace for StatvfsFreeSpace {
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        let st = rustix::fs::statvfs(path).map_err(io::Error::from)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }
}

/// What a pull installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every file, verified.
    Full,
    /// Everything but the routed experts, which are fetched by range on first use.
    Stream,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "full",
            Self::Stream => "stream",
        })
    }
}

/// The mode asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModeRequest {
    /// Full when it fits, stream otherwise.
    #[default]
    Auto,
    /// `--full`: refuse when it does not fit.
    Full,
    /// `--stream`.
    Stream,
}

/// Options for [`HubClient::plan`].
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// The mode asked for.
    pub mode: ModeRequest,
    /// `--dir`; `None` means the environment's Hugging Face cache.
    pub dir: Option<PathBuf>,
    /// The Hugging Face cache to reuse files from (`None`: do not look).
    pub reuse_cache: Option<HfCache>,
    /// Parallel requests for shard headers.
    pub workers: usize,
    /// Spine ranges closer than this are fetched together.
    pub coalesce_gap: u64,
    /// The tensors that are routed experts (from the model family; see
    /// [`RoutedTensors`]). With none, stream mode has nothing to leave out.
    pub routed: RoutedTensors,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            mode: ModeRequest::Auto,
            dir: None,
            reuse_cache: HfCache::from_env(),
            workers: 8,
            coalesce_gap: DEFAULT_COALESCE_GAP,
            routed: RoutedTensors::none(),
        }
    }
}

/// What is already on this machine for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalState {
    /// Nothing.
    Missing,
    /// A `.part` of this many bytes, to resume.
    Partial(u64),
    /// Already under its final name in the target, with the right size.
    Installed(PathBuf),
    /// A blob of the right size in the Hugging Face cache, to link instead of download.
    InCache(PathBuf),
    /// A finished stream install of this shard (`.header` and `.sparse`), recorded in the
    /// previous manifest of the same commit.
    Streamed,
}

/// One file of the plan.
#[derive(Debug, Clone)]
pub struct PlannedFile {
    /// The hub's metadata.
    pub file: RemoteFile,
    /// The shard header, for safetensors files.
    pub header: Option<ShardHeader>,
    /// Why a `.safetensors` file's header could not be used (it is then installed whole).
    pub header_error: Option<String>,
    /// What is already here.
    pub local: LocalState,
}

impl PlannedFile {
    /// Whether stream mode fetches only this file's header and spine (it is a shard with
    /// routed experts and is not already here in full).
    pub fn streams(&self) -> bool {
        self.header.as_ref().is_some_and(ShardHeader::has_experts)
            && !matches!(self.local, LocalState::Installed(_) | LocalState::InCache(_))
    }

    /// Bytes of this file a stream install holds.
    pub fn stream_bytes(&self, gap: u64) -> u64 {
        match &self.header {
            Some(h) if h.has_experts() => {
                h.data_offset() + h.spine_spans(gap).iter().map(|s| s.len()).sum::<u64>()
            }
            _ => self.file.size,
        }
    }

    fn local_bytes(&self) -> u64 {
        match self.local {
            LocalState::Missing | LocalState::Streamed => 0,
            LocalState::Partial(n) => n.min(self.file.size),
            LocalState::Installed(_) | LocalState::InCache(_) => self.file.size,
        }
    }
}

/// Byte totals for one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeNeeds {
    /// Bytes the install holds when complete.
    pub total: u64,
    /// Bytes still to download.
    pub to_download: u64,
    /// `to_download` plus headroom: what must be free.
    pub required: u64,
}

/// The outcome of the capacity check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The chosen mode fits.
    Fits,
    /// No mode was asked for and full does not fit (short by `full_shortfall`); stream does.
    StreamFallback {
        /// How much more space a full install would need.
        full_shortfall: u64,
    },
    /// The asked-for (or fallback) mode does not fit.
    Refused {
        /// How much more space it would need.
        shortfall: u64,
    },
}

/// A capacity plan, printable with `Display`.
#[derive(Debug, Clone)]
pub struct InstallPlan {
    /// The resolved repository.
    pub info: RepoInfo,
    /// Where the install goes.
    pub layout: Layout,
    /// The mode asked for.
    pub requested: ModeRequest,
    /// The mode chosen.
    pub mode: Mode,
    /// Every file with its local state.
    pub files: Vec<PlannedFile>,
    /// Needs of a full install.
    pub full: ModeNeeds,
    /// Needs of a stream install.
    pub stream: ModeNeeds,
    /// The volume measured (nearest existing ancestor of the model directory).
    pub volume: PathBuf,
    /// Free bytes there.
    pub free: u64,
    /// The capacity verdict for `mode`.
    pub verdict: Verdict,
    /// Spine ranges closer than this are fetched together.
    pub coalesce_gap: u64,
    /// The manifest of an earlier pull of the same commit into the same place, if any.
    pub previous: Option<InstallManifest>,
}

/// Headroom for a need of `n` bytes: 2% + 1 GiB, none when nothing is needed.
pub fn headroom(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        n / 100 * HEADROOM_PERCENT + HEADROOM_FIXED
    }
}

impl InstallPlan {
    /// Needs of the chosen mode.
    pub fn needs(&self) -> ModeNeeds {
        match self.mode {
            Mode::Full => self.full,
            Mode::Stream => self.stream,
        }
    }

    /// `Err(InsufficientSpace)` with the shortfall when the verdict is a refusal.
    pub fn check(&self) -> Result<()> {
        match self.verdict {
            Verdict::Refused { shortfall } => Err(HubError::InsufficientSpace {
                volume: self.volume.clone(),
                mode: self.mode.to_string(),
                required: self.needs().required,
                free: self.free,
                shortfall,
            }),
            _ => Ok(()),
        }
    }
}

impl HubClient {
    /// Builds the capacity plan for installing `info` with `opts`, measuring free space with
    /// `space`. Fetches shard headers (small range requests) but no file content.
    pub fn plan(
        &self,
        info: &RepoInfo,
        opts: &PlanOptions,
        space: &dyn FreeSpace,
    ) -> Result<InstallPlan> {
        // A RepoInfo may be built by hand: check what becomes a path before using it.
        validate_repo(&info.repo)?;
        if !is_hex(&info.commit, 40) {
            return Err(HubError::InvalidRevision { revision: info.commit.clone() });
        }
        for f in &info.files {
            validate_path(&f.path)?;
            for (h, n) in [(&f.sha256, 64), (&f.git_oid, 40)] {
                if h.as_deref().is_some_and(|h| !is_hex(h, n)) {
                    return Err(HubError::UnsafePath {
                        path: format!("{} (bad hash {h:?})", f.path),
                    });
                }
            }
        }
        let target = InstallTarget::choose(opts.dir.as_deref(), &info.repo);
        let layout = Layout::new(target, &info.repo, &info.commit);
        let previous = InstallManifest::read(&layout.manifest_path())
            .ok()
            .filter(|m| m.repo == info.repo && m.commit == info.commit);
        let reuse = opts.reuse_cache.as_ref().filter(|c| layout.hf_cache() != Some(*c));
        let mut files = Vec::with_capacity(info.files.len());
        for f in &info.files {
            let local = local_state(&layout, reuse, info, f, previous.as_ref())?;
            files.push(PlannedFile { file: f.clone(), header: None, header_error: None, local });
        }
        self.fetch_headers(info, &layout, &mut files, opts)?;

        let gap = opts.coalesce_gap;
        let sum = |f: &dyn Fn(&PlannedFile) -> u64| files.iter().map(f).sum::<u64>();
        let full_total = sum(&|p| p.file.size);
        let full_dl = sum(&|p| p.file.size - p.local_bytes());
        let stream_total = sum(&|p| if p.streams() { p.stream_bytes(gap) } else { p.file.size });
        // A streamed shard's header is already in hand from planning; only its spine moves.
        let stream_dl = sum(&|p| {
            if p.local == LocalState::Streamed {
                0
            } else if p.streams() {
                p.stream_bytes(gap) - p.header.as_ref().map_or(0, ShardHeader::data_offset)
            } else {
                p.file.size - p.local_bytes()
            }
        });
        let needs = |total, dl| ModeNeeds { total, to_download: dl, required: dl + headroom(dl) };
        let (full, stream) = (needs(full_total, full_dl), needs(stream_total, stream_dl));

        let volume = layout.volume();
        let free = space.free_bytes(&volume).map_err(|e| HubError::io(&volume, e))?;
        let short = |n: &ModeNeeds| n.required.saturating_sub(free);
        let (mode, verdict) = match opts.mode {
            ModeRequest::Full | ModeRequest::Stream => {
                let (mode, n) = if opts.mode == ModeRequest::Full {
                    (Mode::Full, full)
                } else {
                    (Mode::Stream, stream)
                };
                match short(&n) {
                    0 => (mode, Verdict::Fits),
                    s => (mode, Verdict::Refused { shortfall: s }),
                }
            }
            ModeRequest::Auto => match (short(&full), short(&stream)) {
                (0, _) => (Mode::Full, Verdict::Fits),
                (f, 0) => (Mode::Stream, Verdict::StreamFallback { full_shortfall: f }),
                (_, s) => (Mode::Stream, Verdict::Refused { shortfall: s }),
            },
        };
        Ok(InstallPlan {
            info: info.clone(),
            layout,
            requested: opts.mode,
            mode,
            files,
            full,
            stream,
            volume,
            free,
            verdict,
            coalesce_gap: gap,
            previous,
        })
    }

    /// Reads every safetensors header: from the local copy when the file (or its stream-mode
    /// `.header`) is here, else by range requests, `workers` at a time.
    fn fetch_headers(
        &self,
        info: &RepoInfo,
        layout: &Layout,
        files: &mut [PlannedFile],
        opts: &PlanOptions,
    ) -> Result<()> {
        let (workers, routed) = (opts.workers, &opts.routed);
        let fetcher = RangeFetcher::new(self.clone(), &info.repo, &info.commit)?;
        let queue =
            Mutex::new(files.iter_mut().filter(|p| p.file.is_safetensors()).collect::<Vec<_>>());
        let first_err = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers.clamp(1, 64) {
                s.spawn(|| loop {
                    let Some(p) = queue.lock().ok().and_then(|mut q| q.pop()) else { return };
                    let got = match &p.local {
                        LocalState::Installed(path) | LocalState::InCache(path) => {
                            local_header(path, &p.file, routed)
                        }
                        LocalState::Streamed => {
                            local_header(&layout.stream_paths(&p.file).0, &p.file, routed)
                        }
                        _ => fetch_header(&fetcher, &p.file, routed),
                    };
                    match got {
                        Ok(h) => p.header = Some(h),
                        // Not a valid shard: it is installed whole in either mode, and the
                        // plan says so; the checkpoint loader will report it if it matters.
                        Err(HubError::BadHeader { reason, .. }) => p.header_error = Some(reason),
                        Err(e) => {
                            if let Ok(mut slot) = first_err.lock() {
                                slot.get_or_insert(e);
                            }
                            return;
                        }
                    }
                });
            }
        });
        match first_err.into_inner() {
            Ok(Some(e)) => Err(e),
            _ => Ok(()),
        }
    }
}

/// Reads the header of a local copy of `file`.
fn local_header(path: &Path, file: &RemoteFile, routed: &RoutedTensors) -> Result<ShardHeader> {
    use std::io::Read;
    let mut f = fs::File::open(path).map_err(|e| HubError::io(path, e))?;
    let mut prefix = [0u8; 8];
    f.read_exact(&mut prefix).map_err(|e| HubError::io(path, e))?;
    let n = u64::from_le_bytes(prefix).min(crate::shard::MAX_HEADER_LEN);
    let mut bytes = prefix.to_vec();
    f.take(n).read_to_end(&mut bytes).map_err(|e| HubError::io(path, e))?;
    ShardHeader::parse(&file.path, bytes, file.size, routed)
}

fn local_state(
    layout: &Layout,
    reuse: Option<&HfCache>,
    info: &RepoInfo,
    f: &RemoteFile,
    previous: Option<&InstallManifest>,
) -> Result<LocalState> {
    let final_path = layout.final_path(f)?;
    let size = |p: &Path| fs::metadata(p).ok().filter(|m| m.is_file()).map(|m| m.len());
    if size(&final_path) == Some(f.size) {
        return Ok(LocalState::Installed(final_path));
    }
    if let Some(blob) = reuse.and_then(|c| c.find(&info.repo, &info.commit, f)) {
        return Ok(LocalState::InCache(blob));
    }
    let (header, sparse) = layout.stream_paths(f);
    let streamed = previous
        .and_then(|m| m.files.iter().find(|e| e.path == f.path))
        .is_some_and(|e| e.state == FileState::Stream && e.stream.is_some());
    if streamed && size(&header).is_some() && size(&sparse) == Some(f.size) {
        return Ok(LocalState::Streamed);
    }
    match size(&layout.part_path(f)?) {
        Some(n) if n > 0 && n <= f.size => Ok(LocalState::Partial(n)),
        _ => Ok(LocalState::Missing),
    }
}

impl fmt::Display for InstallPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.info;
        let shards = self
            .files
            .iter()
            .filter(|p| p.header.as_ref().is_some_and(ShardHeader::has_experts))
            .count();
        let here =
            self.files.iter().filter(|p| matches!(p.local, LocalState::Installed(_))).count();
        let cached =
            self.files.iter().filter(|p| matches!(p.local, LocalState::InCache(_))).count();
        let partial =
            self.files.iter().filter(|p| matches!(p.local, LocalState::Partial(_))).count();
        writeln!(f, "repository  {} @ {} → commit {}", i.repo, i.revision, i.commit)?;
        let kind = match self.layout.target {
            InstallTarget::Dir { .. } => "directory",
            InstallTarget::HfCache(_) => "Hugging Face cache",
        };
        writeln!(f, "target      {} ({kind})", self.layout.model_dir().display())?;
        writeln!(
            f,
            "files       {} ({} shards with routed experts); {here} installed, {cached} reusable from the HF cache, {partial} partial",
            self.files.len(),
            shards
        )?;
        for (name, n) in [("full", self.full), ("stream", self.stream)] {
            writeln!(
                f,
                "{name:<11} {} in total, {} to download, {} with headroom",
                bytes(n.total),
                bytes(n.to_download),
                bytes(n.required)
            )?;
        }
        for p in &self.files {
            if let Some(e) = &p.header_error {
                writeln!(
                    f,
                    "warning     {}: not a valid safetensors shard ({e}); installed whole",
                    p.file.path
                )?;
            }
        }
        writeln!(f, "free        {} on {}", bytes(self.free), self.volume.display())?;
        let need = self.needs();
        match self.verdict {
            Verdict::Fits => write!(f, "mode        {} — fits ({} spare)", self.mode, bytes(self.free - need.required)),
            Verdict::StreamFallback { full_shortfall } => write!(
                f,
                "mode        stream — a full install would be short by {}; routed experts will be fetched on first use",
                bytes(full_shortfall)
            ),
            Verdict::Refused { shortfall } => write!(
                f,
                "mode        {} — does not fit: short by {} (need {}, free {})",
                self.mode,
                bytes(shortfall),
                bytes(need.required),
                bytes(self.free)
            ),
        }
    }
}
