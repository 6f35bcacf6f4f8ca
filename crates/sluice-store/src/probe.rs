//! Storage read bandwidth as the expert store sees it: `readers` threads, each reading
//! `block`-byte aligned blocks at scattered offsets of the given files (O_DIRECT when the file
//! system allows it, so the page cache does not flatter the number). This is the denominator of
//! the storage bound that `sluice bench` reports against.

use crate::arena::Arena;
use crate::io::{IoMode, ReadAt, ShardFiles};
use crate::StoreError;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// One storage measurement.
#[derive(Debug, Clone, Serialize)]
pub struct StorageProbe {
    /// Bytes read.
    pub bytes: u64,
    /// Wall seconds.
    pub secs: f64,
    /// `bytes / secs / 1e9`.
    pub gbps: f64,
    /// Block size of each read.
    pub block: usize,
    /// Reads in flight (threads).
    pub readers: usize,
    /// Whether every read bypassed the page cache.
    pub direct: bool,
}

/// Reads up to `max_bytes` from `paths` in `block`-byte reads (rounded to 4 KiB) with `readers`
/// threads, at offsets spread over the files in a fixed shuffled order.
pub fn storage_read(
    paths: &[PathBuf],
    block: usize,
    readers: usize,
    max_bytes: u64,
) -> Result<StorageProbe, StoreError> {
    let block = block.div_ceil(4096).max(1) * 4096;
    let readers = readers.max(1);
    let files = ShardFiles::open(paths, IoMode::Direct)?;
    let mut blocks: Vec<(usize, u64)> = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let len =
            std::fs::metadata(p).map_err(|e| StoreError::Io { path: p.clone(), source: e })?.len();
        let n = len / block as u64;
        blocks.extend((0..n).map(|b| (i, b * block as u64)));
    }
    // A fixed permutation (multiplicative hash order) so reads are scattered but repeatable.
    blocks.sort_by_key(|&(f, o)| (o / block as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ f as u64);
    let take = usize::try_from(max_bytes / block as u64).unwrap_or(usize::MAX).min(blocks.len());
    blocks.truncate(take);
    let arena = Arena::new(readers, block as u64)?;
    let start = Instant::now();
    let results: Vec<std::io::Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|t| {
                let (files, arena, blocks) = (&files, &arena, &blocks);
                s.spawn(move || -> std::io::Result<u64> {
                    // SAFETY: thread `t` is the only user of slot `t` for the whole scope.
                    let buf = unsafe { arena.slot_mut(t) };
                    let mut got = 0u64;
                    for &(f, off) in blocks.iter().skip(t).step_by(readers) {
                        let n = files.read_at(f, off, &mut buf[..block])?;
                        got += n as u64;
                    }
                    Ok(got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Err(std::io::Error::other("a probe reader panicked")))
            })
            .collect()
    });
    let mut total = 0u64;
    for r in results {
        total += r.map_err(|e| StoreError::Io {
            path: paths.first().cloned().unwrap_or_default(),
            source: e,
        })?;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let direct = (0..paths.len()).all(|i| files.direct(i));
    #[allow(clippy::cast_precision_loss)]
    let gbps = total as f64 / secs / 1e9;
    Ok(StorageProbe { bytes: total, secs, gbps, block, readers, direct })
}

/// Drops the page-cache pages of the whole file at `path` (`posix_fadvise(POSIX_FADV_DONTNEED)`),
/// so the next read of it comes from storage. Pages another process has mapped stay cached.
pub fn drop_file_cache(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    // SAFETY: `posix_fadvise` only reads its integer arguments; the descriptor stays open for
    // the call, and advice on any range is harmless to memory safety.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}
