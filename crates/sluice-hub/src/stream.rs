//! Stream-mode install of one expert shard: its header and spine, never its routed experts.
//!
//! Two files appear beside where the shard would be:
//!
//! - `{shard}.header` — the shard's first 8 + N bytes, verbatim (length prefix and JSON);
//! - `{shard}.sparse` — a sparse file as long as the shard, holding the header and every
//!   non-expert tensor at **its original offset**, with holes where the routed experts are.
//!   Any safetensors reader can parse it unchanged, and the expert store can later fill holes
//!   in place with bytes from [`crate::RangeFetcher`]. The install manifest lists which ranges
//!   are present (a hole reads as zeros, so presence must come from the manifest, never from
//!   the bytes).
//!
//! Resumability: the ranges go to `{shard}.sparse.part`, and after each range is written and
//! synced a line `start end sha256` is appended to `{shard}.sparse.part.ranges`. A restarted
//! pull skips the ranges listed there. When all are present the part is synced and renamed to
//! `{shard}.sparse` and the log removed.
//!
//! The hub's SHA-256 covers the whole shard, so spine ranges cannot be checked against it;
//! they are checked by length and `Content-Range`, and each range's own SHA-256 is recorded
//! so later local corruption is detectable.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::download::{hex, Transfer, Worker};
use crate::error::{HubError, Result};
use crate::layout::{ensure_parent, lock_exclusive, sync_parent, with_suffix, write_atomic};
use crate::manifest::{RangeRecord, StreamShard};
use crate::repo::RemoteFile;
use crate::shard::{ShardHeader, Span};

/// What a stream-shard install did.
pub(crate) struct Streamed {
    /// The manifest record.
    pub record: StreamShard,
    /// Bytes received from the network.
    pub received: u64,
    /// Ranges already present from an earlier run.
    pub resumed_ranges: usize,
}

impl Worker<'_> {
    /// Installs the header and spine of `file` (whose header is `header`).
    pub fn download_stream(
        &self,
        file: &RemoteFile,
        header: &ShardHeader,
        gap: u64,
    ) -> Result<Streamed> {
        let (header_path, sparse) = self.layout.stream_paths(file);
        ensure_parent(&header_path)?;
        if fs::read(&header_path).ok().as_deref() != Some(header.bytes.as_slice()) {
            write_atomic(&header_path, &header.bytes)?;
        }
        let part = with_suffix(&sparse, ".part");
        let _lock = lock_exclusive(&part, &file.path)?;
        let log = with_suffix(&part, ".ranges");
        let spans = header.spine_spans(gap);
        let mut done = read_log(&log);
        // A log from a different header (another commit or gap) is useless: start over.
        if done.iter().any(|r| !spans.contains(&Span { start: r.start, end: r.end })) {
            done.clear();
            let _ = fs::remove_file(&log);
        }
        let resumed_ranges = done.len();
        let todo: Vec<Span> = {
            let have: HashSet<(u64, u64)> = done.iter().map(|r| (r.start, r.end)).collect();
            spans.iter().copied().filter(|s| !have.contains(&(s.start, s.end))).collect()
        };
        let total: u64 = todo.iter().map(Span::len).sum();
        self.progress.file_start(&file.path, total, 0);
        let result = self.fetch_spans(file, header, &part, &log, &todo, &mut done);
        self.progress.file_end(&file.path);
        let received = result?;
        fs::rename(&part, &sparse).map_err(|e| HubError::io(&sparse, e))?;
        sync_parent(&sparse)?;
        let _ = fs::remove_file(&log);
        done.sort_by_key(|r| r.start);
        Ok(Streamed {
            record: StreamShard {
                header: format!("{}.header", file.path),
                sparse: format!("{}.sparse", file.path),
                header_len: header.header_len(),
                expert_bytes: header.expert_bytes(),
                ranges: done,
            },
            received,
            resumed_ranges,
        })
    }

    fn fetch_spans(
        &self,
        file: &RemoteFile,
        header: &ShardHeader,
        part: &Path,
        log: &Path,
        todo: &[Span],
        done: &mut Vec<RangeRecord>,
    ) -> Result<u64> {
        let mut sink = self.sinks.open(part).map_err(|e| HubError::write(part, &file.path, e))?;
        let len = fs::metadata(part).map_err(|e| HubError::io(part, e))?.len();
        // With nothing recorded, old bytes (another commit's, a torn run's) are cleared so
        // the holes really are holes; then the file takes the shard's length.
        if done.is_empty() && len != 0 {
            sink.set_len(0).map_err(|e| HubError::write(part, &file.path, e))?;
        }
        sink.set_len(file.size).map_err(|e| HubError::write(part, &file.path, e))?;
        sink.write_all_at(0, &header.bytes).map_err(|e| HubError::write(part, &file.path, e))?;
        let mut received = 0;
        for span in todo {
            let mut pos = span.start;
            let mut hash = Sha256::new();
            self.retrying(&file.path, |progressed| {
                let mut tee = HashingSink { inner: sink.as_mut(), hash: &mut hash };
                let mut t =
                    Transfer { file, part, sink: &mut tee, pos, end: span.end, received: 0 };
                let r = self.receive(&mut t, None);
                (pos, received, *progressed) = (t.pos, received + t.received, t.received > 0);
                r
            })?;
            sink.sync().map_err(|e| HubError::write(part, &file.path, e))?;
            let rec =
                RangeRecord { start: span.start, end: span.end, sha256: hex(&hash.finalize()) };
            append_log(log, &rec).map_err(|e| HubError::write(log, &file.path, e))?;
            done.push(rec);
        }
        sink.sync().map_err(|e| HubError::write(part, &file.path, e))?;
        Ok(received)
    }
}

/// A sink that hashes what it writes (spine ranges are written in order within a range).
struct HashingSink<'a> {
    inner: &'a mut dyn crate::sink::Sink,
    hash: &'a mut Sha256,
}

impl crate::sink::Sink for HashingSink<'_> {
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all_at(offset, buf)?;
        self.hash.update(buf);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync(&mut self) -> std::io::Result<()> {
        self.inner.sync()
    }
}

/// Reads the completed-range log; a torn last line (from a crash) is ignored.
fn read_log(log: &Path) -> Vec<RangeRecord> {
    let Ok(text) = fs::read_to_string(log) else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let mut it = line.split(' ');
            let start = it.next()?.parse().ok()?;
            let end = it.next()?.parse().ok()?;
            let sha256 = it.next().filter(|s| crate::repo::is_hex(s, 64))?.to_owned();
            (it.next().is_none() && end > start).then_some(RangeRecord { start, end, sha256 })
        })
        .collect()
}

fn append_log(log: &Path, r: &RangeRecord) -> std::io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(log)?;
    writeln!(f, "{} {} {}", r.start, r.end, r.sha256)?;
    f.sync_all()
}

/// Removes stream-mode leftovers of `file` once a full copy is installed.
pub(crate) fn remove_stream_files(header: &Path, sparse: &Path) {
    let part: PathBuf = with_suffix(sparse, ".part");
    for p in [header.to_path_buf(), sparse.to_path_buf(), with_suffix(&part, ".ranges"), part] {
        let _ = fs::remove_file(p);
    }
}
