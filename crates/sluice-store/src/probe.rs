//! Storage read bandwidth as the expert store sees it: `block`-byte aligned reads at scattered
//! offsets of the given files, `depth` of them in flight through the chosen read backend
//! (io_uring or the pread pool, [`crate::backend`]), uncached (O_DIRECT, F_NOCACHE) when the file
//! system allows it so the page cache does not flatter the number. This is the denominator of the storage bound that
//! `sluice bench` reports against.

use crate::arena::Arena;
use crate::backend::{IoBackend, ReadTask, Readers, SpanError, SpanTarget};
use crate::index::Span;
use crate::io::{IoMode, ShardFiles};
use crate::reader::Priority;
use crate::StoreError;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
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
    /// Reads in flight (queue depth or threads).
    pub readers: usize,
    /// Whether every read bypassed the page cache.
    pub direct: bool,
    /// The read backend that ran: `io_uring` or `pread`.
    pub backend: &'static str,
}

/// One block read into one probe buffer; reports to the probe loop when it ends.
struct BlockRead {
    target: SpanTarget,
    buffer: usize,
    tx: mpsc::Sender<(usize, Result<u64, SpanError>)>,
    done: bool,
}

// SAFETY: the probe loop gives buffer `buffer` (an arena slot that outlives the backend) to one
// block read at a time and touches it only after that read has reported back.
unsafe impl ReadTask for BlockRead {
    fn start(&mut self) -> Vec<SpanTarget> {
        vec![self.target]
    }

    fn finish(mut self: Box<Self>, result: Result<u64, SpanError>) {
        self.done = true;
        // The probe loop outlives every read it waits for; nothing to do if it stopped early.
        let _ = self.tx.send((self.buffer, result));
    }
}

impl Drop for BlockRead {
    fn drop(&mut self) {
        if !self.done {
            let error = std::io::Error::other("probe read dropped unrun");
            let _ = self.tx.send((self.buffer, Err(SpanError { span: self.target.span, error })));
        }
    }
}

/// Reads up to `max_bytes` from `paths` in `block`-byte reads (rounded to 4 KiB), `depth` in
/// flight through `backend`, at offsets spread over the files in a fixed shuffled order.
pub fn storage_read(
    paths: &[PathBuf],
    block: usize,
    depth: usize,
    max_bytes: u64,
    backend: IoBackend,
) -> Result<StorageProbe, StoreError> {
    let block = block.div_ceil(4096).max(1) * 4096;
    let depth = depth.max(1);
    // Checked before opening: a FIFO would block the open, and a device's length is not its
    // size, so either would measure nothing and report 0 GB/s as if it were a result.
    let mut lens = Vec::with_capacity(paths.len());
    for p in paths {
        let meta =
            std::fs::metadata(p).map_err(|e| StoreError::Io { path: p.clone(), source: e })?;
        if !meta.is_file() {
            return Err(StoreError::ProbeInput(format!(
                "{}: not a regular file; the storage probe reads files (a checkpoint's shards or \
                 a large file on the disk to measure)",
                p.display()
            )));
        }
        lens.push(meta.len());
    }
    let mut blocks: Vec<(usize, u64)> = Vec::new();
    for (i, len) in lens.iter().enumerate() {
        let n = len / block as u64;
        blocks.extend((0..n).map(|b| (i, b * block as u64)));
    }
    if blocks.is_empty() || max_bytes < block as u64 {
        let largest = lens.iter().max().copied().unwrap_or(0);
        return Err(StoreError::ProbeInput(format!(
            "nothing to measure: {} bytes to read at most and the largest file holds {largest} \
             bytes, but each read is one {block}-byte block; read a larger file or give a \
             smaller block",
            max_bytes
        )));
    }
    let files = Arc::new(ShardFiles::open(paths, IoMode::Direct)?);
    // A fixed permutation (multiplicative hash order) so reads are scattered but repeatable.
    blocks.sort_by_key(|&(f, o)| (o / block as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ f as u64);
    let take = usize::try_from(max_bytes / block as u64).unwrap_or(usize::MAX).min(blocks.len());
    blocks.truncate(take);
    let arena = Arena::new(depth, block as u64)?;
    // Declared after the arena, so it is dropped (every read ended) before the arena is freed.
    let readers = Readers::start(backend, depth, files.clone())?;
    let (tx, rx) = mpsc::channel();
    let submit = |buffer: usize, (file, offset): (usize, u64)| {
        let span = Span { file, offset, len: block as u64, region: 0 };
        // SAFETY: slot `buffer` is handed to this one read until it reports back (see
        // `BlockRead`); the raw pointer is only used by the backend.
        let buf = unsafe { arena.slot_mut(buffer) }.as_mut_ptr();
        let target = SpanTarget { span, buf, len: block };
        let task = BlockRead { target, buffer, tx: tx.clone(), done: false };
        readers.submit(Priority::Demand, Box::new(task));
    };
    let start = Instant::now();
    let mut queue = blocks.iter().copied();
    let mut in_flight = 0usize;
    for (b, blk) in (0..depth).zip(queue.by_ref()) {
        submit(b, blk);
        in_flight += 1;
    }
    readers.kick();
    let mut total = 0u64;
    let mut failed: Option<SpanError> = None;
    while in_flight > 0 {
        let Ok((b, r)) = rx.recv() else { break };
        in_flight -= 1;
        match r {
            Ok(n) => total += n,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        if failed.is_none() {
            if let Some(blk) = queue.next() {
                submit(b, blk);
                in_flight += 1;
                readers.kick();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    if let Some(e) = failed {
        return Err(StoreError::Read {
            path: files.path(e.span.file).to_path_buf(),
            offset: e.span.offset,
            len: e.span.len,
            source: e.error,
        });
    }
    let direct = (0..paths.len()).all(|i| files.direct(i));
    #[allow(clippy::cast_precision_loss)]
    let gbps = total as f64 / secs / 1e9;
    let backend = readers.name();
    Ok(StorageProbe { bytes: total, secs, gbps, block, readers: depth, direct, backend })
}

/// Drops the page-cache pages of the whole file at `path` ([`crate::platform::advice`]), so
/// the next read of it comes from storage. Pages another process has mapped stay cached.
pub fn drop_file_cache(path: &std::path::Path) -> std::io::Result<()> {
    crate::platform::advice::drop_file(path)
}
