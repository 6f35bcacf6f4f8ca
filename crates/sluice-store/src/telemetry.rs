//! What a run, a request or a benchmark costs the machine: bytes read and written (all of the
//! process's, and sluice's own expert reads, expert disk-cache writes and state files apart),
//! swap traffic, major page faults, peak memory against the budget, the page-cache share of the
//! model's files, and the model disk's lifetime write counter before and after — so a week of
//! use can be added up.
//!
//! Use: take a [`Sample`] at the start, then [`Telemetry::since`] (or [`Sample::delta`] between
//! two samples) for the difference. Figures the OS refuses are `None` ("n/a" in text, `null` in
//! JSON), never an error and never a zero that was not measured. The OS reads live in
//! [`crate::platform::machine`]; sluice's own byte counts are process-wide counters here, which
//! the streaming store, the expert disk cache and the state cache bump.
//!
//! Swap counters are system-wide (Linux counts swap per system, not per process): another
//! program's swapping in the same window is included, which is what a user asking "did this
//! run make my machine swap" wants to see.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::platform::{counters, machine};

static EXPERT_READ: AtomicU64 = AtomicU64::new(0);
static CACHE_WRITTEN: AtomicU64 = AtomicU64::new(0);
static STATE_READ: AtomicU64 = AtomicU64::new(0);
static STATE_WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` of routed experts read from storage by the streaming store.
pub fn count_expert_read(bytes: u64) {
    EXPERT_READ.fetch_add(bytes, Ordering::Relaxed);
}

/// Counts `bytes` written into the expert disk cache (stream mode).
pub fn count_cache_write(bytes: u64) {
    CACHE_WRITTEN.fetch_add(bytes, Ordering::Relaxed);
}

/// Counts `bytes` of state files (prompt-state cache, hot set) read from storage.
pub fn count_state_read(bytes: u64) {
    STATE_READ.fetch_add(bytes, Ordering::Relaxed);
}

/// Counts `bytes` of state files (prompt-state cache, hot set) written to storage.
pub fn count_state_write(bytes: u64) {
    STATE_WRITTEN.fetch_add(bytes, Ordering::Relaxed);
}

/// The machine's counters at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    io: Option<machine::ProcessIo>,
    swap: Option<machine::SwapPages>,
    major_faults: Option<u64>,
    disk: Option<machine::BlockDevice>,
    disk_written: Option<u64>,
    own: [u64; 4],
}

impl Sample {
    /// The counters now, with the lifetime write counter of the disk holding `model` (a file
    /// or directory; `None` leaves the disk out).
    pub fn now(model: Option<&Path>) -> Self {
        let disk = model.and_then(machine::block_device);
        Self::with_disk(disk)
    }

    fn with_disk(disk: Option<machine::BlockDevice>) -> Self {
        let disk_written = disk.as_ref().and_then(machine::disk_written);
        Self {
            at: Instant::now(),
            io: machine::process_io(),
            swap: machine::swap_pages(),
            major_faults: machine::major_faults(),
            disk,
            disk_written,
            own: [
                EXPERT_READ.load(Ordering::Relaxed),
                CACHE_WRITTEN.load(Ordering::Relaxed),
                STATE_READ.load(Ordering::Relaxed),
                STATE_WRITTEN.load(Ordering::Relaxed),
            ],
        }
    }

    /// A new sample of the same disk as this one.
    pub fn again(&self) -> Self {
        Self::with_disk(self.disk.clone())
    }

    /// What changed from `start` to this sample. Peak RSS is the process's peak so far.
    pub fn delta(&self, start: &Sample) -> Telemetry {
        let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        let page = machine::page_size();
        let own = |i: usize| self.own[i].saturating_sub(start.own[i]);
        Telemetry {
            seconds: self.at.saturating_duration_since(start.at).as_secs_f64(),
            process_read_bytes: d(self.io.map(|i| i.read), start.io.map(|i| i.read)),
            process_written_bytes: d(self.io.map(|i| i.written), start.io.map(|i| i.written)),
            expert_read_bytes: own(0),
            expert_cache_written_bytes: own(1),
            state_read_bytes: own(2),
            state_written_bytes: own(3),
            swap_in_bytes: d(self.swap.map(|s| s.pages_in), start.swap.map(|s| s.pages_in))
                .map(|p| p * page),
            swap_out_bytes: d(self.swap.map(|s| s.pages_out), start.swap.map(|s| s.pages_out))
                .map(|p| p * page),
            major_faults: d(self.major_faults, start.major_faults),
            peak_rss_bytes: Some(counters::peak_rss()).filter(|&p| p > 0),
            budget_bytes: None,
            disk: self.disk.as_ref().map(|b| b.name.clone()),
            disk_written_before_bytes: start.disk_written,
            disk_written_after_bytes: self.disk_written,
            model_page_cache: None,
        }
    }
}

/// What the machine paid between two [`Sample`]s.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Telemetry {
    /// Wall seconds covered.
    pub seconds: f64,
    /// Bytes the process caused to be read from storage (page-cache hits excluded).
    pub process_read_bytes: Option<u64>,
    /// Bytes the process caused to be written to storage.
    pub process_written_bytes: Option<u64>,
    /// Routed-expert bytes the streaming store read (a mapped store reads by page faults,
    /// counted in `process_read_bytes` and `major_faults` only).
    pub expert_read_bytes: u64,
    /// Bytes written into the expert disk cache (stream mode).
    pub expert_cache_written_bytes: u64,
    /// Bytes of state files (prompt-state cache, hot set) read.
    pub state_read_bytes: u64,
    /// Bytes of state files (prompt-state cache, hot set) written.
    pub state_written_bytes: u64,
    /// Bytes swapped in, system-wide.
    pub swap_in_bytes: Option<u64>,
    /// Bytes swapped out, system-wide.
    pub swap_out_bytes: Option<u64>,
    /// Major page faults of the process (a page read from storage on touch).
    pub major_faults: Option<u64>,
    /// The process's peak resident memory so far.
    pub peak_rss_bytes: Option<u64>,
    /// The `--memory` budget, where the caller knows it.
    pub budget_bytes: Option<u64>,
    /// The disk holding the model.
    pub disk: Option<String>,
    /// The disk's lifetime bytes written at the start.
    pub disk_written_before_bytes: Option<u64>,
    /// The disk's lifetime bytes written at the end.
    pub disk_written_after_bytes: Option<u64>,
    /// How much of the model's files the page cache holds at the end.
    pub model_page_cache: Option<PageCacheShare>,
}

impl Telemetry {
    /// What changed from `start` until now.
    pub fn since(start: &Sample) -> Self {
        start.again().delta(start)
    }

    /// With the budget that peak RSS is compared against.
    #[must_use]
    pub fn with_budget(mut self, budget: u64) -> Self {
        self.budget_bytes = Some(budget);
        self
    }

    /// With the page-cache share of `files` (see [`page_cache_share`]).
    #[must_use]
    pub fn with_page_cache(mut self, files: &[PathBuf]) -> Self {
        self.model_page_cache = page_cache_share(files);
        self
    }

    /// Bytes the disk wrote in the window (everyone's writes, not only sluice's).
    pub fn disk_written_bytes(&self) -> Option<u64> {
        Some(self.disk_written_after_bytes?.saturating_sub(self.disk_written_before_bytes?))
    }
}

/// How much of a model's files is in the page cache, estimated from sampled pages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PageCacheShare {
    /// Resident fraction of the sampled pages, weighted by file size.
    pub fraction: f64,
    /// Estimated resident bytes (`fraction` × the files' size).
    pub resident_bytes: u64,
    /// The files' total size.
    pub file_bytes: u64,
    /// Bytes actually checked.
    pub sampled_bytes: u64,
    /// Seconds the sampling took (one `mincore` call per window, 64 windows per file).
    pub cost_s: f64,
}

/// Windows per file and pages per window that [`page_cache_share`] checks.
const WINDOWS: u64 = 64;
const WINDOW_PAGES: u64 = 256;

/// The page-cache share of `files`: 64 evenly spread windows of 256 pages per file are checked
/// with `mincore` (≤ 64 MiB looked at per file with 4 KiB pages, 64 system calls), so the cost
/// does not grow with the model. `None` where no file could be checked.
pub fn page_cache_share(files: &[PathBuf]) -> Option<PageCacheShare> {
    let t0 = Instant::now();
    let page = machine::page_size();
    let (mut weighted, mut total, mut sampled, mut any) = (0f64, 0u64, 0u64, false);
    for path in files {
        let Ok(f) = std::fs::File::open(path) else { continue };
        let Some((res, n)) = machine::resident_pages(&f, WINDOWS, WINDOW_PAGES) else { continue };
        let len = f.metadata().map_or(0, |m| m.len());
        any = true;
        total += len;
        sampled += n * page;
        if n > 0 {
            #[allow(clippy::cast_precision_loss)]
            let share = res as f64 / n as f64 * len as f64;
            weighted += share;
        }
    }
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    any.then(|| PageCacheShare {
        fraction: if total > 0 { weighted / total as f64 } else { 0.0 },
        resident_bytes: weighted as u64,
        file_bytes: total,
        sampled_bytes: sampled.min(total),
        cost_s: t0.elapsed().as_secs_f64(),
    })
}

/// The `*.safetensors` files directly in `dir` (a model's shards), sorted.
pub fn model_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

/// `value` or "n/a".
fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| v.to_string())
}

impl fmt::Display for Telemetry {
    /// One line for `--stats`: every figure in bytes, "n/a" where the OS did not say.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "machine: {:.3}s, process read {} / written {} bytes (experts read {}, expert disk \
             cache written {}, state files read {} / written {}), swap in {} / out {} bytes \
             (system-wide), major faults {}, peak rss {} of budget {} bytes",
            self.seconds,
            opt(self.process_read_bytes),
            opt(self.process_written_bytes),
            self.expert_read_bytes,
            self.expert_cache_written_bytes,
            self.state_read_bytes,
            self.state_written_bytes,
            opt(self.swap_in_bytes),
            opt(self.swap_out_bytes),
            opt(self.major_faults),
            opt(self.peak_rss_bytes),
            opt(self.budget_bytes),
        )?;
        match &self.model_page_cache {
            Some(p) => write!(
                f,
                ", model page cache {:.1}% ({} of {} bytes, sampled {} bytes in {:.4}s)",
                p.fraction * 100.0,
                p.resident_bytes,
                p.file_bytes,
                p.sampled_bytes,
                p.cost_s
            )?,
            None => write!(f, ", model page cache n/a")?,
        }
        write!(
            f,
            ", disk {} written {} bytes (lifetime {} -> {})",
            self.disk.as_deref().unwrap_or("n/a"),
            opt(self.disk_written_bytes()),
            opt(self.disk_written_before_bytes),
            opt(self.disk_written_after_bytes),
        )
    }
}
