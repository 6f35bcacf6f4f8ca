//! The storage section of `sluice doctor`: free space of the model's filesystem, uncached read
//! and write bandwidth of the model's disk, and the swap areas (with a warning when one is on
//! the model's disk, where swap traffic competes with expert reads and adds to its wear).
//!
//! The write test writes a temporary file in the model directory (`.sluice-write-test-PID`,
//! created new, never an existing file) in 4 MiB blocks, uncached where the filesystem allows
//! (`O_DIRECT` / `F_NOCACHE`), until 256 MiB or 2 seconds, then `fsync`s it — the time includes
//! the sync, so the figure is what reached the disk — and removes it. Where the directory is
//! read-only or the disk full, the check says so instead of a figure.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::arena::Arena;
use crate::platform::{advice, machine};

/// Block size of the read and write tests.
pub const BLOCK: usize = 4 << 20;
/// Most bytes either test moves.
pub const MAX_BYTES: u64 = 256 << 20;
/// Longest the write test writes before it syncs.
pub const MAX_WRITE_TIME: Duration = Duration::from_secs(2);

/// One bandwidth measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Bandwidth {
    /// Bytes moved.
    pub bytes: u64,
    /// Wall seconds (the final `fsync` included for writes).
    pub secs: f64,
    /// `bytes / secs / 1e9`.
    pub gbps: f64,
    /// Whether the page cache was bypassed.
    pub direct: bool,
}

/// The storage section.
#[derive(Debug, Clone, Serialize)]
pub struct StorageReport {
    /// Free bytes on the model's filesystem (for an unprivileged user).
    pub free_bytes: Option<u64>,
    /// Size of that filesystem.
    pub total_bytes: Option<u64>,
    /// The model's disk (`vda`, `nvme0n1`), where the OS says.
    pub disk: Option<String>,
    /// Uncached read bandwidth over the model's shards, or why it was not measured.
    pub read: Result<Bandwidth, String>,
    /// Write bandwidth of a temporary file in the model directory, or why not.
    pub write: Result<Bandwidth, String>,
    /// The active swap areas (`None` where the OS does not list them).
    pub swap: Option<Vec<SwapEntry>>,
    /// Warnings about swap (on the model's disk, or enabled at all).
    pub warnings: Vec<String>,
}

/// One swap area, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct SwapEntry {
    /// The swap file or partition.
    pub path: PathBuf,
    /// Its disk, where known.
    pub disk: Option<String>,
    /// Size in bytes.
    pub bytes: u64,
}

/// Checks the storage of the model in `dir` (whose shards are `files`).
pub fn check(dir: &Path, files: &[PathBuf]) -> StorageReport {
    let mut r = check_space_and_swap(dir);
    r.read = read_bandwidth(files);
    r.write = write_bandwidth(dir, MAX_BYTES, MAX_WRITE_TIME);
    r
}

/// Free space, the disk and swap only (no bandwidth test: `read` and `write` say so).
pub fn check_space_and_swap(dir: &Path) -> StorageReport {
    let space = machine::free_space(dir);
    let disk = machine::block_device(dir).map(|d| d.name);
    let read = Err("not measured".into());
    let write = Err("not measured".into());
    let swap = machine::swap_areas().map(|areas| {
        areas
            .into_iter()
            .map(|a| SwapEntry { path: a.path, disk: a.disk, bytes: a.size })
            .collect::<Vec<_>>()
    });
    let warnings = swap_warnings(swap.as_deref(), disk.as_deref());
    StorageReport {
        free_bytes: space.map(|s| s.0),
        total_bytes: space.map(|s| s.1),
        disk,
        read,
        write,
        swap,
        warnings,
    }
}

/// A warning for each swap area on `disk`, and one when swap is on at all.
pub fn swap_warnings(swap: Option<&[SwapEntry]>, disk: Option<&str>) -> Vec<String> {
    let Some(areas) = swap.filter(|a| !a.is_empty()) else { return Vec::new() };
    let mut w = Vec::new();
    for a in areas {
        if disk.is_some() && a.disk.as_deref() == disk {
            w.push(format!(
                "swap {} is on the model's disk ({}): swap traffic competes with expert reads \
                 and adds to the disk's wear; move it or turn it off (swapoff {})",
                a.path.display(),
                disk.unwrap_or("?"),
                a.path.display()
            ));
        }
    }
    w.push(format!(
        "swap is enabled ({} area(s)): sluice keeps within --memory, but other programs pushed \
         to swap by the page cache write to the disk; see docs/OPERATIONS.md (vm.swappiness, \
         swapoff)",
        areas.len()
    ));
    w
}

/// Uncached read bandwidth over `files` (their cached pages dropped first), through the
/// expert store's own reader.
pub fn read_bandwidth(files: &[PathBuf]) -> Result<Bandwidth, String> {
    if files.is_empty() {
        return Err("no safetensors shards to read".into());
    }
    for f in files {
        let _ = advice::drop_file(f);
    }
    let p = crate::probe::storage_read(files, BLOCK, 8, MAX_BYTES, crate::IoBackend::Auto)
        .map_err(|e| e.to_string())?;
    Ok(Bandwidth { bytes: p.bytes, secs: p.secs, gbps: p.gbps, direct: p.direct })
}

/// Write bandwidth of a temporary file in `dir`: at most `max_bytes` or `max_time` of 4 MiB
/// writes, then `fsync`; the file is removed whatever happens.
pub fn write_bandwidth(
    dir: &Path,
    max_bytes: u64,
    max_time: Duration,
) -> Result<Bandwidth, String> {
    let path = dir.join(format!(".sluice-write-test-{}", std::process::id()));
    let result = write_file(&path, max_bytes, max_time);
    let _ = std::fs::remove_file(&path);
    result.map_err(|e| format!("cannot write a test file in {}: {e}", dir.display()))
}

fn write_file(path: &Path, max_bytes: u64, max_time: Duration) -> io::Result<Bandwidth> {
    let arena = Arena::new(1, BLOCK as u64).map_err(io::Error::other)?;
    // SAFETY: this function is the arena's only user.
    let buf = unsafe { arena.slot_mut(0) };
    // Not zeros: a compressing or deduplicating disk would flatter them.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x.to_le_bytes()[0];
    }
    let (mut f, direct) = match machine::create_direct(path) {
        Some(f) => (f, true),
        None => (File::options().write(true).create_new(true).open(path)?, false),
    };
    let t0 = Instant::now();
    let mut bytes = 0u64;
    while bytes < max_bytes.max(BLOCK as u64) && (bytes == 0 || t0.elapsed() < max_time) {
        f.write_all(buf)?;
        bytes += BLOCK as u64;
    }
    f.sync_all()?;
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    #[allow(clippy::cast_precision_loss)]
    let gbps = bytes as f64 / secs / 1e9;
    drop(f);
    if !direct {
        let _ = advice::drop_file(path);
    }
    Ok(Bandwidth { bytes, secs, gbps, direct })
}
