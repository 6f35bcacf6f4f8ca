//! Downloading one whole file: resumable, streamed through the hash, verified, published.
//!
//! The bytes go to `{final}.part` through a [`Sink`]. A `.part` left by an earlier run (even
//! one killed with SIGKILL) is hashed first and continued with `Range: bytes={len}-`; a 200
//! answer to that means the server will not resume, so the part is truncated and the hash
//! restarted. The hash runs over the bytes as they are written, so verification costs no
//! second read. Only after the length and hash match (SHA-256 for LFS files, the git blob
//! id for the others), and the file is synced, is it renamed to its final name. A mismatch
//! deletes the part, so the retry starts clean.
//!
//! Within one process the hash state survives failed attempts: after a dropped connection or
//! a stall the part is cut back to the bytes already hashed and the next attempt continues
//! from there without re-reading the file.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE};
use reqwest::StatusCode;
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::client::{header_str, parse_content_range, ByteRange, HubClient};
use crate::error::{HubError, Result};
use crate::layout::{ensure_parent, lock_exclusive, Layout};
use crate::progress::Progress;
use crate::repo::RemoteFile;
use crate::sink::{Sink, SinkFactory};

/// Size of the buffer each worker reads into before writing.
const CHUNK: usize = 1 << 20;

/// What one download worker needs.
pub(crate) struct Worker<'a> {
    pub client: HubClient,
    pub layout: &'a Layout,
    pub sinks: &'a dyn SinkFactory,
    pub progress: &'a dyn Progress,
    pub abort: &'a AtomicBool,
}

/// The running hashes of a file's bytes: SHA-256 always, git blob SHA-1 when the hub gave a
/// git blob id for a non-LFS file.
#[derive(Clone)]
pub(crate) struct Hashes {
    pub sha256: Sha256,
    git: Option<Sha1>,
}

impl Hashes {
    pub fn new(file: &RemoteFile) -> Self {
        let git = (!file.is_lfs() && file.git_oid.is_some()).then(|| {
            let mut h = Sha1::new();
            h.update(format!("blob {}\0", file.size).as_bytes());
            h
        });
        Self { sha256: Sha256::new(), git }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.sha256.update(data);
        if let Some(g) = &mut self.git {
            g.update(data);
        }
    }

    /// Checks the hashes against the hub's; returns the SHA-256 hex on success.
    pub fn verify(self, file: &RemoteFile) -> Result<String> {
        let sha256 = hex(&self.sha256.finalize());
        if let Some(want) = &file.sha256 {
            if *want != sha256 {
                return Err(mismatch(file, "SHA-256", want, sha256));
            }
        }
        if let (Some(g), Some(want)) = (self.git, &file.git_oid) {
            let got = hex(&g.finalize());
            if *want != got {
                return Err(mismatch(file, "git SHA-1", want, got));
            }
        }
        Ok(sha256)
    }
}

fn mismatch(file: &RemoteFile, algo: &'static str, want: &str, got: String) -> HubError {
    HubError::HashMismatch { file: file.path.clone(), algo, expected: want.to_owned(), got }
}

/// Lowercase hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        s
    })
}

/// Hashes the first `len` bytes of `path` into `hashes`.
pub(crate) fn hash_file_prefix(path: &Path, len: u64, hashes: &mut Hashes) -> Result<()> {
    let f = File::open(path).map_err(|e| HubError::io(path, e))?;
    let mut r = f.take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = r.read(&mut buf).map_err(|e| HubError::io(path, e))?;
        if n == 0 {
            return Ok(());
        }
        hashes.update(&buf[..n]);
    }
}

/// Hashes a whole local file and checks it against the hub's size and hashes.
pub(crate) fn verify_local(path: &Path, file: &RemoteFile) -> Result<String> {
    let len = std::fs::metadata(path).map_err(|e| HubError::io(path, e))?.len();
    if len != file.size {
        return Err(HubError::SizeMismatch {
            file: file.path.clone(),
            expected: file.size,
            got: len,
        });
    }
    let mut h = Hashes::new(file);
    hash_file_prefix(path, len, &mut h)?;
    h.verify(file)
}

/// One transfer into a sink: the file, where its bytes go, and how far it got.
pub(crate) struct Transfer<'a> {
    /// The repository file.
    pub file: &'a RemoteFile,
    /// The partial file on disk (named in errors).
    pub part: &'a Path,
    /// Where the bytes are written, at their offsets in the file.
    pub sink: &'a mut dyn Sink,
    /// Next byte to receive.
    pub pos: u64,
    /// One past the last byte wanted.
    pub end: u64,
    /// Bytes received so far by this transfer.
    pub received: u64,
}

/// The result of a whole-file download.
pub(crate) struct Downloaded {
    /// Bytes received from the network by this call.
    pub received: u64,
    /// Bytes of the `.part` that were already there when this call started.
    pub resumed_from: u64,
    /// SHA-256 of the whole file.
    pub sha256: String,
}

impl Worker<'_> {
    /// Downloads `file` to its final name, resuming any `.part`, with retries.
    pub fn download_full(&self, file: &RemoteFile) -> Result<Downloaded> {
        let part = self.layout.part_path(file)?;
        ensure_parent(&part)?;
        let on_disk = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        self.progress.file_start(&file.path, file.size, on_disk.min(file.size));
        let mut state: Option<(u64, Hashes)> = None;
        let mut received = 0u64;
        let result = self.retrying(&file.path, |progressed| {
            self.attempt_full(file, &part, &mut state, &mut received, progressed)
        });
        self.progress.file_end(&file.path);
        let sha256 = result?;
        self.layout.publish(file, &part)?;
        // Bytes of the final file that did not cross the network in this run: zero when a
        // restart (a 200 to a Range, a checksum mismatch) discarded the earlier part.
        Ok(Downloaded { received, resumed_from: file.size.saturating_sub(received), sha256 })
    }

    fn attempt_full(
        &self,
        file: &RemoteFile,
        part: &Path,
        state: &mut Option<(u64, Hashes)>,
        received: &mut u64,
        progressed: &mut bool,
    ) -> Result<String> {
        let _lock = lock_exclusive(part, &file.path)?;
        let mut sink = self.sinks.open(part).map_err(|e| HubError::write(part, &file.path, e))?;
        let on_disk = std::fs::metadata(part).map_err(|e| HubError::io(part, e))?.len();
        let (mut pos, mut hashes) = match state.take() {
            // Bytes past what was hashed may be a half-written chunk: cut them off.
            Some((len, h)) if len <= on_disk => (len, h),
            _ if on_disk > file.size => (0, Hashes::new(file)),
            _ => {
                let mut h = Hashes::new(file);
                hash_file_prefix(part, on_disk, &mut h)?;
                (on_disk, h)
            }
        };
        if pos != on_disk {
            sink.set_len(pos).map_err(|e| HubError::write(part, &file.path, e))?;
        }
        let outcome = if pos < file.size {
            let mut t =
                Transfer { file, part, sink: sink.as_mut(), pos, end: file.size, received: 0 };
            let r = self.receive(&mut t, Some(&mut hashes));
            (pos, *received, *progressed) = (t.pos, *received + t.received, t.received > 0);
            r
        } else {
            Ok(())
        };
        *state = Some((pos, hashes.clone()));
        outcome?;
        sink.sync().map_err(|e| HubError::write(part, &file.path, e))?;
        drop(sink);
        *state = None;
        match hashes.verify(file) {
            Ok(sha) => Ok(sha),
            Err(e) => {
                // Never leave bytes that failed verification to be resumed.
                let _ = std::fs::remove_file(part);
                self.progress.rewind(&file.path, 0);
                Err(e)
            }
        }
    }

    /// One GET of `t.file` bytes `t.pos..t.end` into `t.sink` at the same offsets, advancing
    /// `t.pos` after each write and counting the bytes in `t.received`. With `restart` hashes
    /// (whole-file mode), a 200 answer to a range request restarts the file from byte 0;
    /// without, it is a protocol error.
    pub(crate) fn receive(
        &self,
        t: &mut Transfer<'_>,
        mut restart: Option<&mut Hashes>,
    ) -> Result<()> {
        let (file, part, end) = (t.file, t.part, t.end);
        let url = self.client.resolve_url(&self.layout.repo, &self.layout.commit, &file.path)?;
        let whole = restart.is_some() && end == file.size;
        let range = (t.pos > 0 || !whole)
            .then_some(ByteRange { start: t.pos, end: if whole { None } else { Some(end) } });
        let mut resp = self.client.get(&url, range)?;
        let here = resp.url().to_string();
        let protocol = |reason: String| HubError::Protocol { url: here.clone(), reason };
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => {
                let cr = header_str(resp.headers(), CONTENT_RANGE.as_str()).unwrap_or_default();
                match parse_content_range(&cr) {
                    Some((s, e, total))
                        if s == t.pos && e == end && total.is_none_or(|n| n == file.size) => {}
                    _ => {
                        return Err(protocol(format!(
                            "{}: asked for bytes {}..{end}, got Content-Range {cr:?}",
                            file.path, t.pos
                        )))
                    }
                }
            }
            StatusCode::OK if t.pos == 0 && whole => {}
            StatusCode::OK => match restart.as_deref_mut() {
                Some(h) if whole => {
                    // The server ignored the Range: start over from byte 0.
                    t.sink.set_len(0).map_err(|e| HubError::write(part, &file.path, e))?;
                    t.pos = 0;
                    *h = Hashes::new(file);
                    self.progress.rewind(&file.path, 0);
                    self.progress.note(&format!("{}: server ignored Range; restarting", file.path));
                }
                _ => return Err(protocol(format!("{}: range request answered 200", file.path))),
            },
            s => return Err(protocol(format!("{}: unexpected status {s}", file.path))),
        }
        let want = end - t.pos;
        if let Some(cl) = header_str(resp.headers(), CONTENT_LENGTH.as_str()) {
            if cl.trim().parse::<u64>().ok() != Some(want) {
                return Err(protocol(format!(
                    "{}: Content-Length {cl}, expected {want}",
                    file.path
                )));
            }
        }
        let mut buf = vec![0u8; CHUNK];
        let start = t.pos;
        while t.pos < end {
            if self.abort.load(Ordering::Relaxed) {
                return Err(HubError::Cancelled { file: file.path.clone() });
            }
            let room = usize::try_from(end - t.pos).unwrap_or(CHUNK).min(CHUNK);
            let n = read_some(&mut resp, &mut buf[..room]).map_err(|e| HubError::Transfer {
                url: here.clone(),
                file: file.path.clone(),
                received: t.pos - start,
                expected: want,
                source: e,
            })?;
            if n == 0 {
                return Err(HubError::Transfer {
                    url: here.clone(),
                    file: file.path.clone(),
                    received: t.pos - start,
                    expected: want,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                });
            }
            let data = &buf[..n];
            t.sink.write_all_at(t.pos, data).map_err(|e| HubError::write(part, &file.path, e))?;
            if let Some(h) = restart.as_deref_mut() {
                h.update(data);
            }
            let n64 = u64::try_from(n).unwrap_or(u64::MAX);
            t.pos += n64;
            t.received += n64;
            self.progress.bytes(&file.path, n64);
        }
        let mut probe = [0u8; 1];
        if matches!(resp.read(&mut probe), Ok(n) if n > 0) {
            return Err(protocol(format!("{}: more than the {want} bytes expected", file.path)));
        }
        Ok(())
    }

    /// Runs `op` with the retry policy; a failed attempt that made progress resets the
    /// count, so a long download over a flaky link is not abandoned for old failures.
    pub(crate) fn retrying<T>(
        &self,
        file: &str,
        mut op: impl FnMut(&mut bool) -> Result<T>,
    ) -> Result<T> {
        let policy = &self.client.config().retry;
        let max = policy.max_attempts.max(1);
        let (mut failures, mut total, mut mismatches) = (0u32, 0u32, 0u32);
        loop {
            let mut progressed = false;
            match op(&mut progressed) {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && !self.abort.load(Ordering::Relaxed) => {
                    // Bytes that failed verification are no progress, and fetching the same
                    // wrong bytes a third time would only waste bandwidth.
                    let mismatch = matches!(e, HubError::HashMismatch { .. });
                    mismatches += u32::from(mismatch);
                    failures = if progressed && !mismatch { 1 } else { failures + 1 };
                    total += 1;
                    if failures >= max || total >= max.saturating_mul(8) || mismatches >= 2 {
                        return Err(e);
                    }
                    let wait = policy.delay(failures, &e);
                    self.progress
                        .note(&format!("{file}: {e}; retrying in {:.1}s", wait.as_secs_f64()));
                    std::thread::sleep(wait);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads at least one byte unless at end of stream, filling as much of `buf` as arrives
/// promptly (so writes and hash updates work on large chunks).
fn read_some(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Keep what arrived; the error will surface on the next call.
            Err(_) if filled > 0 => break,
            Err(e) => return Err(e),
        }
        if filled >= buf.len() / 4 {
            break;
        }
    }
    Ok(filled)
}
