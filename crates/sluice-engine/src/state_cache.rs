//! The on-disk prompt-state cache (`--state-cache DIR`): the sequence state after a prompt
//! prefix, kept in files so that a later request — in this process or the next one — restores
//! the longest cached prefix of its prompt and prefills only the rest.
//!
//! **What is written.** The engine hands over a [`StateSnapshot`] (shared, immutable) at every
//! `every`-token boundary of a prompt, at message boundaries the caller names, at the end of a
//! prompt (with the logits predicting the next position, so an identical prompt needs no pass)
//! and at the end of a generation. A background thread encodes and writes it
//! ([`crate::state_file`]: its chunks hash on the writer's own thread pool while the body is
//! written): temp file, fsync, rename, directory fsync. The token path only
//! queues the snapshot; the queue holds at most [`QUEUE`] snapshots, so a writer that falls
//! behind the disk makes the engine wait rather than hold unbounded memory.
//!
//! **Lookup.** An in-memory index (built at open from the files' headers) maps prefix keys to
//! files; one pass over the prompt computes the keys of every cached length, and the longest
//! hit is read and checked (fingerprint, prefix ids, state shape, checksum). A file that fails a
//! check is refused with a warning on stderr, deleted, and the next shorter hit is tried: a bad
//! file costs a recomputation, never a wrong state.
//!
//! **Size.** The files' total stays under `max_bytes`: after each write the least recently used
//! files (by the index's clock, seeded at open from the files' modification times, which a
//! restore refreshes) are deleted. Temporary files left by a killed process (`*.tmp-PID` whose
//! process is gone) are deleted at open.
//!
//! **Test hook.** With `SLUICE_STATE_CACHE_PAUSE` set in the environment, the writer stops
//! forever after fsyncing its first temporary file, having printed the line
//! `sluice: state cache paused before renaming PATH` on stderr — so a test reading the
//! process's stderr can SIGKILL it at exactly that point without sleeping.

use crate::state_file::{self, prefix_keys, Expect, Key, Refusal};
use sluice_models::{StateShape, StateSnapshot};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Snapshots queued for the writer before the engine waits.
pub const QUEUE: usize = 4;

// A prefill pass's captures wait for room in the writer's share of the plan
// ([`StateCache::make_room`]), which holds at most `QUEUE` of them besides the one written.
const _: () = assert!(sluice_models::MAX_CAPTURES <= QUEUE);

/// The most memory a state cache makes a generation hold besides its live state, for the
/// memory plan: the restored snapshot (kept while the prefill runs, since later snapshots share
/// its rows), the snapshot the writer is encoding and [`QUEUE`] queued ones. Each holds its own
/// copy of the fixed-size part of a snapshot (`snapshot_fixed`, [`sluice_models::StateShape::fixed_bytes`]:
/// the committed recurrent and conv states, half of what the live state holds, which keeps a
/// working copy of each) and a logits row (`vocab` f32); the per-position rows (MLA latents)
/// of snapshots along one prompt are shared segments, so together they hold at most one copy
/// of the planned `context`.
pub fn held_bytes(snapshot_fixed: u64, per_position: u64, context: usize, vocab: usize) -> u64 {
    let copies = QUEUE as u64 + 2;
    copies
        .saturating_mul(snapshot_fixed.saturating_add(4 * vocab as u64))
        .saturating_add(per_position.saturating_mul(context as u64))
}
/// Extension of a complete state file.
const EXT: &str = "state";

/// Settings of a [`StateCache`].
#[derive(Debug, Clone)]
pub struct StateCacheConfig {
    /// Directory of the files (created if missing).
    pub dir: PathBuf,
    /// Most bytes of files kept.
    pub max_bytes: u64,
    /// Write a snapshot every this many prompt tokens (0: only at boundaries and ends).
    pub every: usize,
}

/// Why the cache could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StateCacheError {
    /// The directory could not be created or listed, or the writer thread not started.
    #[error("state cache {dir}: {source}")]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Counters of a [`StateCache`] (totals since open).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateCacheStats {
    /// Files written.
    pub files_written: u64,
    /// Bytes of files written.
    pub bytes_written: u64,
    /// Snapshots restored from files.
    pub restores: u64,
    /// Bytes of files restored.
    pub bytes_restored: u64,
    /// Prompt tokens restored instead of prefilled.
    pub tokens_restored: u64,
    /// Files refused (corrupt, truncated, another model or format).
    pub refused: u64,
    /// Files evicted for size.
    pub evicted: u64,
    /// Writes that failed (the snapshot is dropped; nothing else changes).
    pub write_errors: u64,
    /// Nanoseconds the writer spent writing files (encode, write, fsync, rename).
    pub write_ns: u64,
    /// Nanoseconds spent reading, checking and decoding restored files.
    pub restore_ns: u64,
    /// Files held now.
    pub files: u64,
    /// Bytes held now.
    pub bytes_held: u64,
}

/// A state restored from the cache.
#[derive(Debug)]
pub struct Restored {
    /// The snapshot of the first `pos` prompt tokens.
    pub snapshot: StateSnapshot,
    /// Prompt tokens it holds.
    pub pos: usize,
    /// The logits predicting position `pos`, when the file kept them.
    pub logits: Option<Vec<f32>>,
    /// Bytes of the file.
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct FileEntry {
    tokens: usize,
    logits: bool,
    bytes: u64,
    last_used: u64,
}

#[derive(Debug, Default)]
struct Index {
    files: HashMap<Key, FileEntry>,
    /// Cached prefix lengths with how many files have each.
    lengths: BTreeMap<usize, usize>,
    bytes: u64,
    clock: u64,
}

impl Index {
    fn insert(&mut self, key: Key, e: FileEntry) {
        if let Some(old) = self.files.insert(key, e) {
            self.forget(old);
        }
        *self.lengths.entry(e.tokens).or_default() += 1;
        self.bytes += e.bytes;
    }

    fn remove(&mut self, key: &Key) -> Option<FileEntry> {
        let e = self.files.remove(key)?;
        self.forget(e);
        Some(e)
    }

    fn forget(&mut self, e: FileEntry) {
        self.bytes -= e.bytes;
        if let Some(n) = self.lengths.get_mut(&e.tokens) {
            *n -= 1;
            if *n == 0 {
                self.lengths.remove(&e.tokens);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    files_written: AtomicU64,
    bytes_written: AtomicU64,
    restores: AtomicU64,
    bytes_restored: AtomicU64,
    tokens_restored: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    write_errors: AtomicU64,
    write_ns: AtomicU64,
    restore_ns: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    cfg: StateCacheConfig,
    fingerprint: [u8; 32],
    shape: StateShape,
    vocab: usize,
    index: Mutex<Index>,
    counters: Counters,
}

/// One snapshot for the writer.
struct Job {
    key: Key,
    tokens: Vec<u32>,
    snap: Arc<StateSnapshot>,
    logits: Option<Arc<[f32]>>,
}

/// The cache (see the module docs). Dropping it waits for queued writes.
#[derive(Debug)]
pub struct StateCache {
    inner: Arc<Inner>,
    tx: Mutex<Option<SyncSender<Job>>>,
    /// Jobs queued and not yet finished (for [`StateCache::flush`]).
    pending: Arc<(Mutex<u64>, std::sync::Condvar)>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl StateCache {
    /// Opens (creating) the cache for a model with `fingerprint`
    /// ([`state_file::model_fingerprint`]) whose states have `shape` and whose vocabulary has
    /// `vocab` tokens. Deletes abandoned temporary files and indexes the files present.
    pub fn open(
        cfg: StateCacheConfig,
        fingerprint: [u8; 32],
        shape: StateShape,
        vocab: usize,
    ) -> Result<Self, StateCacheError> {
        let io = |source| StateCacheError::Io { dir: cfg.dir.clone(), source };
        std::fs::create_dir_all(&cfg.dir).map_err(io)?;
        let (index, refused) = scan(&cfg.dir).map_err(io)?;
        let inner = Arc::new(Inner {
            cfg,
            fingerprint,
            shape,
            vocab,
            index: Mutex::new(index),
            counters: Counters { refused: AtomicU64::new(refused), ..Counters::default() },
        });
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let pending = Arc::new((Mutex::new(0u64), std::sync::Condvar::new()));
        let w = (Arc::clone(&inner), Arc::clone(&pending));
        let writer = std::thread::Builder::new()
            .name("sluice-state-cache".into())
            .spawn(move || writer(&w.0, &rx, &w.1))
            .map_err(|e| StateCacheError::Io { dir: inner.cfg.dir.clone(), source: e })?;
        inner.evict();
        Ok(Self { inner, tx: Mutex::new(Some(tx)), pending, writer: Mutex::new(Some(writer)) })
    }

    /// The token interval between snapshots.
    pub fn every(&self) -> usize {
        self.inner.cfg.every
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.inner.cfg.dir
    }

    /// The longest cached prefix of `prompt` longer than `min` tokens, restored. A prefix
    /// covering the whole prompt is used only when its file kept the logits (otherwise at least
    /// one token must still be fed). Files that fail a check are refused (warning, deleted).
    pub fn lookup(&self, prompt: &[u32], min: usize) -> Option<Restored> {
        let candidates: Vec<(usize, Key, FileEntry)> = {
            let idx = self.inner.index.lock().unwrap_or_else(PoisonError::into_inner);
            let lengths = idx.lengths.range(min + 1..=prompt.len()).map(|(&n, _)| n);
            prefix_keys(&self.inner.fingerprint, prompt, lengths.collect::<Vec<_>>())
                .into_iter()
                .filter_map(|(n, k)| idx.files.get(&k).map(|e| (n, k, *e)))
                .filter(|(n, _, e)| *n < prompt.len() || e.logits)
                .collect()
        };
        for (n, key, _) in candidates.into_iter().rev() {
            let path = self.inner.path(&key);
            let want = Expect {
                fingerprint: &self.inner.fingerprint,
                key,
                tokens: &prompt[..n],
                shape: &self.inner.shape,
                vocab: self.inner.vocab,
            };
            let t0 = std::time::Instant::now();
            let read = state_file::read_file(&path, &want);
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.inner.counters.restore_ns.fetch_add(ns, Ordering::Relaxed);
            match read {
                Ok(c) => {
                    let c_ = &self.inner.counters;
                    c_.restores.fetch_add(1, Ordering::Relaxed);
                    c_.bytes_restored.fetch_add(c.bytes, Ordering::Relaxed);
                    c_.tokens_restored.fetch_add(n as u64, Ordering::Relaxed);
                    self.inner.touch(&key, &path);
                    return Some(Restored {
                        snapshot: c.snap,
                        pos: n,
                        logits: c.logits,
                        bytes: c.bytes,
                    });
                }
                Err(Refusal::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Another process sharing the directory evicted it.
                    self.inner.lock().remove(&key);
                }
                Err(why) => {
                    eprintln!(
                        "sluice: warning: state cache file {} refused ({why}); deleting it and \
                         recomputing",
                        path.display()
                    );
                    self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
                    self.inner.lock().remove(&key);
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        None
    }

    /// Queues the state after `tokens` for writing (nothing when that prefix is already
    /// cached). Returns the bytes the file will take (0 when nothing was queued). Waits only
    /// when [`QUEUE`] writes are already pending.
    pub fn submit(
        &self,
        tokens: &[u32],
        snap: Arc<StateSnapshot>,
        logits: Option<Arc<[f32]>>,
    ) -> u64 {
        if tokens.is_empty() || snap.len() != tokens.len() {
            return 0;
        }
        let key = state_file::prefix_key(&self.inner.fingerprint, tokens);
        {
            let mut idx = self.inner.lock();
            idx.clock += 1;
            let clock = idx.clock;
            if let Some(e) = idx.files.get_mut(&key) {
                // Already there (with logits when these have them): only its use is new.
                if e.logits || logits.is_none() {
                    e.last_used = clock;
                    return 0;
                }
            }
        }
        let bytes = state_file::file_len(tokens.len(), logits.as_ref().map(|l| l.len()), &snap);
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(tx) = tx {
            *self.pending.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            if tx.send(Job { key, tokens: tokens.to_vec(), snap, logits }).is_err() {
                self.done_one();
                return 0;
            }
        }
        bytes
    }

    fn done_one(&self) {
        finish_one(&self.pending);
    }

    /// Waits until every queued snapshot is written (or failed).
    pub fn flush(&self) {
        self.drain_to(0);
    }

    /// Waits until the writer holds at most `n` snapshots (queued or being written).
    fn drain_to(&self, n: u64) {
        let (m, cv) = &*self.pending;
        let mut held = m.lock().unwrap_or_else(PoisonError::into_inner);
        while *held > n {
            held = cv.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until `k` more snapshots (at most [`QUEUE`]) can be held outside the writer —
    /// the captures of a prefill pass, held in the state until the pass ends and then queued —
    /// within what [`held_bytes`] charges: the writer then holds at most `QUEUE + 1 − k` (the
    /// one it writes and the queued ones), so it and the captures together never hold more than
    /// the `QUEUE + 1` the plan counts besides the restored snapshot.
    pub fn make_room(&self, k: usize) {
        let k = k.min(QUEUE) as u64;
        self.drain_to(QUEUE as u64 + 1 - k);
    }

    /// The counters.
    pub fn stats(&self) -> StateCacheStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let idx = self.inner.lock();
        StateCacheStats {
            files_written: l(&c.files_written),
            bytes_written: l(&c.bytes_written),
            restores: l(&c.restores),
            bytes_restored: l(&c.bytes_restored),
            tokens_restored: l(&c.tokens_restored),
            refused: l(&c.refused),
            evicted: l(&c.evicted),
            write_errors: l(&c.write_errors),
            write_ns: l(&c.write_ns),
            restore_ns: l(&c.restore_ns),
            files: idx.files.len() as u64,
            bytes_held: idx.bytes,
        }
    }
}

impl Drop for StateCache {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(w) = self.writer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = w.join();
        }
    }
}

fn finish_one(pending: &(Mutex<u64>, std::sync::Condvar)) {
    let mut n = pending.0.lock().unwrap_or_else(PoisonError::into_inner);
    *n = n.saturating_sub(1);
    pending.1.notify_all();
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.cfg.dir.join(format!("{}.{EXT}", key.hex()))
    }

    /// Marks a file used now, in the index and (for the next process) in its mtime.
    fn touch(&self, key: &Key, path: &Path) {
        let mut idx = self.lock();
        idx.clock += 1;
        let clock = idx.clock;
        if let Some(e) = idx.files.get_mut(key) {
            e.last_used = clock;
        }
        drop(idx);
        if let Ok(f) = std::fs::File::options().write(true).open(path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }

    /// Deletes least recently used files until the total fits.
    fn evict(&self) {
        loop {
            let mut idx = self.lock();
            if idx.bytes <= self.cfg.max_bytes {
                return;
            }
            let Some((&key, _)) = idx.files.iter().min_by_key(|(_, e)| e.last_used) else {
                return;
            };
            idx.remove(&key);
            drop(idx);
            let _ = std::fs::remove_file(self.path(&key));
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes one job: temp, fsync, rename, directory fsync, index, eviction.
    fn write(&self, job: &Job, paused: &mut bool) -> std::io::Result<u64> {
        let path = self.path(&job.key);
        let tmp = self.cfg.dir.join(format!("{}.{EXT}.tmp-{}", job.key.hex(), std::process::id()));
        let res = state_file::write_file(
            &tmp,
            &self.fingerprint,
            &job.tokens,
            job.logits.as_deref(),
            &job.snap,
        );
        let bytes = match res {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if std::mem::take(paused) {
            // The test hook (module docs): announce the temp file, then never rename it.
            eprintln!("sluice: state cache paused before renaming {}", tmp.display());
            loop {
                std::thread::park();
            }
        }
        std::fs::rename(&tmp, &path)?;
        sync_dir(&self.cfg.dir);
        let mut idx = self.lock();
        idx.clock += 1;
        let e = FileEntry {
            tokens: job.tokens.len(),
            logits: job.logits.is_some(),
            bytes,
            last_used: idx.clock,
        };
        idx.insert(job.key, e);
        drop(idx);
        self.evict();
        Ok(bytes)
    }
}

/// The writer thread: one job at a time until the cache is dropped.
fn writer(inner: &Inner, rx: &Receiver<Job>, pending: &(Mutex<u64>, std::sync::Condvar)) {
    let mut paused = std::env::var_os("SLUICE_STATE_CACHE_PAUSE").is_some();
    // The writer hashes on a pool of its own: a write runs while the engine's passes use the
    // process-wide pool, and a call into a busy pool would run on one thread (the writer's,
    // or worse the engine's, had the writer taken the pool first).
    let pool = sluice_kernels::pool::Pool::new(sluice_kernels::pool::global().threads()).ok();
    for job in rx {
        let t0 = std::time::Instant::now();
        let res = match &pool {
            Some(p) => p.install(|| inner.write(&job, &mut paused)),
            None => inner.write(&job, &mut paused),
        };
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        inner.counters.write_ns.fetch_add(ns, Ordering::Relaxed);
        match res {
            Ok(b) => {
                inner.counters.files_written.fetch_add(1, Ordering::Relaxed);
                inner.counters.bytes_written.fetch_add(b, Ordering::Relaxed);
            }
            Err(e) => {
                inner.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "sluice: warning: writing a prompt state to {} failed ({e}); continuing \
                     without it",
                    inner.cfg.dir.display()
                );
            }
        }
        finish_one(pending);
    }
}

/// Fsyncs a directory so a rename in it survives a crash (best effort: not every platform can).
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Indexes the files in `dir`: deletes abandoned temporaries and files whose header cannot be
/// read or does not match the name (counted as refused), and orders the rest by modification
/// time (oldest = least recently used).
fn scan(dir: &Path) -> std::io::Result<(Index, u64)> {
    let mut found = Vec::new();
    let mut refused = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((_, pid)) = name.split_once(&format!(".{EXT}.tmp-")) {
            if pid.parse::<u32>().is_ok_and(sluice_checkpoint::writer_is_gone) {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        if !name.ends_with(&format!(".{EXT}")) {
            continue;
        }
        let md = e.metadata()?;
        match state_file::read_header(&e.path()) {
            Ok(h) if format!("{}.{EXT}", h.key.hex()) == name => {
                let t = md.modified().unwrap_or(std::time::UNIX_EPOCH);
                found.push((t, h, md.len()));
            }
            res => {
                let why =
                    res.err().map_or_else(|| "its name is not its key".into(), |e| e.to_string());
                eprintln!(
                    "sluice: warning: state cache file {} refused ({why}); deleting it",
                    e.path().display()
                );
                refused += 1;
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    found.sort_by_key(|(t, _, _)| *t);
    let mut idx = Index::default();
    for (_, h, bytes) in found {
        idx.clock += 1;
        let tokens = usize::try_from(h.tokens).unwrap_or(usize::MAX);
        idx.insert(h.key, FileEntry { tokens, logits: h.logits, bytes, last_used: idx.clock });
    }
    Ok((idx, refused))
}
