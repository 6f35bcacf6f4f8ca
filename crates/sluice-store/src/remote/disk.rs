//! [`ExpertDiskCache`]: the persistent local expert cache of a stream install (see the
//! module docs of [`crate::remote`] for the protocol and [`super::log`] for the log).
//!
//! This file opens the cache and answers pins and `localize` calls; [`fetch`] fills holes from
//! the remote source, [`evict`] gives space back, and [`entries`] keeps the table of experts
//! with their eviction order.

mod entries;
mod evict;
mod fetch;

use super::log::{self, LogSpan, LogWriter, Present};
use super::RemoteSource;
use crate::index::ExpertIndex;
use crate::StoreError;
use entries::{Entries, Entry, EntryState, Key};
use evict::make_room;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// How an [`ExpertDiskCache`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// Most bytes of routed experts kept on local disk.
    pub budget: u64,
    /// Remote requests in flight at once (default 4).
    pub fetchers: usize,
    /// Most bytes one coalesced request asks for (default 32 MiB; a single larger expert is
    /// still one request).
    pub max_request: u64,
}

impl DiskCacheConfig {
    /// A configuration with `budget` bytes and default concurrency.
    pub fn new(budget: u64) -> Self {
        Self { budget, fetchers: 4, max_request: 32 << 20 }
    }

    /// Bytes of transient receive buffers at most in use at once for experts of at most
    /// `expert_bytes` (charge this to the memory budget).
    pub fn buffer_bytes(&self, expert_bytes: u64) -> u64 {
        self.fetchers.max(1) as u64 * self.max_request.max(expert_bytes)
    }
}

/// Counters of the remote side of a stream install.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemoteStats {
    /// Range requests sent (each may cover several adjacent experts).
    pub requests: u64,
    /// Bytes received from the remote.
    pub bytes_fetched: u64,
    /// Experts fetched and recorded present.
    pub experts_fetched: u64,
    /// Demanded experts that were already on local disk.
    pub local_hits: u64,
    /// Nanoseconds spent localizing (fetch, write, sync, record), wall time.
    pub fetch_ns: u64,
    /// Experts evicted from the disk cache to stay in its budget.
    pub evictions: u64,
    /// Bytes of those experts.
    pub evicted_bytes: u64,
    /// Prefetch guesses skipped because their expert was not local (never fetched remotely).
    pub prefetch_skipped: u64,
    /// Holes that could not be punched back (the file system refused; space not returned).
    pub punch_failures: u64,
}

#[derive(Debug)]
struct Inner {
    entries: Entries,
    /// Bytes present or reserved.
    used: u64,
    clock: u64,
    log: LogWriter,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    bytes_fetched: AtomicU64,
    experts_fetched: AtomicU64,
    local_hits: AtomicU64,
    fetch_ns: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    prefetch_skipped: AtomicU64,
    punch_failures: AtomicU64,
}

/// The on-disk expert cache of a stream install: sparse shards whose holes are filled on
/// demand from a [`RemoteSource`], with presence recorded in a log.
pub struct ExpertDiskCache {
    index: ExpertIndex,
    names: Vec<String>,
    files: Vec<Option<File>>,
    remote: Arc<dyn RemoteSource>,
    config: DiskCacheConfig,
    commit: String,
    log_path: PathBuf,
    inner: Mutex<Inner>,
    counters: Counters,
}

impl std::fmt::Debug for ExpertDiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertDiskCache")
            .field("log", &self.log_path)
            .field("budget", &self.config.budget)
            .finish_non_exhaustive()
    }
}

/// A pin on one locally present expert: while it lives, the expert is not evicted (its hole
/// is not punched). Dropping it unpins.
#[derive(Debug)]
pub struct DiskPin {
    cache: Arc<ExpertDiskCache>,
    key: Key,
}

impl Drop for DiskPin {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        inner.entries.update(self.key, |e| e.pins = e.pins.saturating_sub(1));
    }
}

fn cfg_err(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("{}: {what}", path.display()))
}

impl ExpertDiskCache {
    /// Opens the cache of the experts in `index`, whose shard `i` is named `names[i]` in the
    /// log (the sparse file's name relative to the model directory), with its log at
    /// `log_path` for `commit`. A missing log, or one of another commit, starts empty. Records
    /// that do not match the index are dropped, removed experts' holes are punched again
    /// (a crash may have come between the record and the punch), the budget is enforced, and
    /// the log is compacted when it has grown.
    pub fn open(
        index: ExpertIndex,
        names: Vec<String>,
        log_path: &Path,
        commit: &str,
        remote: Arc<dyn RemoteSource>,
        config: DiskCacheConfig,
    ) -> Result<Arc<Self>, StoreError> {
        if names.len() != index.paths().len() {
            return Err(StoreError::Config("one log name per shard file is needed".into()));
        }
        if let Some(bad) = names.iter().find(|n| n.is_empty() || n.contains([' ', ',', '\n'])) {
            return Err(cfg_err(log_path, format!("shard name {bad:?} cannot be logged")));
        }
        let largest = (0..index.num_layers())
            .flat_map(|l| (0..index.experts(l)).map(move |e| (l, e)))
            .filter_map(|(l, e)| index.get(l, u32::try_from(e).ok()?).map(|loc| loc.bytes()))
            .max()
            .unwrap_or(0);
        if config.budget < largest {
            return Err(StoreError::DiskBudget { budget: config.budget, needed: largest });
        }
        let mut used_files = vec![false; names.len()];
        for l in 0..index.num_layers() {
            for e in 0..index.experts(l) {
                let Some(loc) = u32::try_from(e).ok().and_then(|e| index.get(l, e)) else {
                    continue;
                };
                for s in loc.stored_spans() {
                    if let Some(u) = used_files.get_mut(s.file) {
                        *u = true;
                    }
                }
            }
        }
        let mut files = Vec::with_capacity(names.len());
        for (i, used) in used_files.iter().enumerate() {
            files.push(if *used {
                let p = index.path(i);
                Some(
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(p)
                        .map_err(|source| StoreError::Io { path: p.to_path_buf(), source })?,
                )
            } else {
                None
            });
        }
        let io_err = |source| StoreError::Io { path: log_path.to_path_buf(), source };
        let state = log::read(log_path).map_err(io_err)?.unwrap_or_default();
        let same_commit = state.commit.as_deref() == Some(commit);
        let mut cache = Self {
            index,
            names,
            files,
            remote,
            config,
            commit: commit.to_owned(),
            log_path: log_path.to_path_buf(),
            inner: Mutex::new(Inner {
                entries: Entries::default(),
                used: 0,
                clock: 0,
                log: LogWriter::open(log_path)
                    .or_else(|_| {
                        log::rewrite(log_path, commit, &[])?;
                        LogWriter::open(log_path)
                    })
                    .map_err(io_err)?,
            }),
            counters: Counters::default(),
        };
        let mut kept = Vec::new();
        if same_commit {
            for (l, e) in &state.removed {
                cache.punch_expert(*l, *e);
            }
            for p in &state.present {
                if cache.spans_of(p.layer, p.expert).as_deref() == Some(p.spans.as_slice()) {
                    kept.push(p.clone());
                }
            }
        }
        // Enforce the budget, oldest first.
        let mut total: u64 = kept.iter().map(Present::bytes).sum();
        while total > cache.config.budget && !kept.is_empty() {
            let p = kept.remove(0);
            total -= p.bytes();
            cache.punch_expert(p.layer, p.expert);
        }
        let dirty = !same_commit
            || kept.len() != state.present.len()
            || state.bad_lines > 0
            || state.records > 2 * kept.len() + 64;
        if dirty {
            log::rewrite(log_path, commit, &kept).map_err(io_err)?;
            cache.inner.get_mut().unwrap_or_else(PoisonError::into_inner).log =
                LogWriter::open(log_path).map_err(io_err)?;
        }
        {
            let inner = cache.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
            for p in kept {
                inner.clock += 1;
                inner.used += p.bytes();
                inner.entries.insert(
                    (p.layer, p.expert),
                    Entry {
                        state: EntryState::Present,
                        bytes: p.bytes(),
                        pins: 0,
                        stamp: inner.clock,
                        sha256: p.sha256,
                    },
                );
            }
        }
        Ok(Arc::new(cache))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Updates under this lock are single assignments; a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The log's spans of expert `e` of layer `l` per the index.
    fn spans_of(&self, l: usize, e: u32) -> Option<Vec<LogSpan>> {
        let loc = self.index.get(l, e)?;
        Some(
            loc.stored_spans()
                .iter()
                .map(|s| LogSpan {
                    shard: self.names.get(s.file).cloned().unwrap_or_default(),
                    offset: s.offset,
                    len: s.len,
                })
                .collect(),
        )
    }

    /// The disk budget in bytes.
    pub fn budget(&self) -> u64 {
        self.config.budget
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The commit the cached bytes belong to.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Where missing experts come from.
    pub fn remote(&self) -> &dyn RemoteSource {
        &*self.remote
    }

    /// Routed experts in the index, over all layers.
    pub fn total_experts(&self) -> usize {
        self.index.total_experts()
    }

    /// Experts present on local disk, and their bytes.
    pub fn present(&self) -> (usize, u64) {
        let inner = self.lock();
        let it = inner.entries.values().filter(|e| e.state == EntryState::Present);
        it.fold((0, 0), |(n, b), e| (n + 1, b + e.bytes))
    }

    /// True when expert `id` of `layer` is recorded present.
    pub fn is_present(&self, layer: usize, id: u32) -> bool {
        self.lock().entries.get(&(layer, id)).is_some_and(|e| e.state == EntryState::Present)
    }

    /// Counters so far.
    pub fn stats(&self) -> RemoteStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteStats {
            requests: g(&c.requests),
            bytes_fetched: g(&c.bytes_fetched),
            experts_fetched: g(&c.experts_fetched),
            local_hits: g(&c.local_hits),
            fetch_ns: g(&c.fetch_ns),
            evictions: g(&c.evictions),
            evicted_bytes: g(&c.evicted_bytes),
            prefetch_skipped: g(&c.prefetch_skipped),
            punch_failures: g(&c.punch_failures),
        }
    }

    /// Pins expert `id` of `layer` if it is present locally (for a prefetch read, which must
    /// never fetch remotely). Counts a skipped prefetch otherwise.
    pub fn try_pin(self: &Arc<Self>, layer: usize, id: u32) -> Option<DiskPin> {
        let mut inner = self.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let present = inner.entries.get(&(layer, id)).map(|e| e.state) == Some(EntryState::Present);
        if !present {
            self.counters.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        inner.entries.update((layer, id), |e| {
            e.pins += 1;
            e.stamp = clock;
        });
        Some(DiskPin { cache: Arc::clone(self), key: (layer, id) })
    }

    /// Makes the experts `ids` of `layer` local and pins them: present ones are pinned at
    /// once; missing ones are fetched (adjacent ones coalesced into one request, up to
    /// `fetchers` requests in flight), written into their holes, synced, then recorded
    /// present. Returns the pins of the experts now local. When the budget cannot take every
    /// missing expert (other experts are pinned), the rest are left out and the caller asks
    /// again after releasing pins; with nothing pinned anywhere and nothing fitting, this is
    /// [`StoreError::DiskBudget`]. A failed request is [`StoreError::Remote`] (or `Io`); the
    /// experts of a failed request are never recorded present.
    pub fn localize(
        self: &Arc<Self>,
        layer: usize,
        ids: &[u32],
    ) -> Result<Vec<(u32, DiskPin)>, StoreError> {
        let t0 = Instant::now();
        let mut out = Vec::with_capacity(ids.len());
        let mut reserved: Vec<u32> = Vec::new();
        {
            let mut inner = self.lock();
            let mut missing = Vec::new();
            for &id in ids {
                inner.clock += 1;
                let clock = inner.clock;
                match inner.entries.get(&(layer, id)).map(|e| e.state) {
                    Some(EntryState::Present) => {
                        inner.entries.update((layer, id), |e| {
                            e.pins += 1;
                            e.stamp = clock;
                        });
                        self.counters.local_hits.fetch_add(1, Ordering::Relaxed);
                        out.push((id, DiskPin { cache: Arc::clone(self), key: (layer, id) }));
                    }
                    // Another call is fetching it: the caller asks again later.
                    Some(_) => {}
                    None => missing.push(id),
                }
            }
            let mut evicted = Vec::new();
            for id in missing {
                let bytes = self.index.get(layer, id).map_or(0, |l| l.bytes());
                if !make_room(&mut inner, bytes, self.config.budget, &mut evicted) {
                    break;
                }
                inner.used += bytes;
                inner.entries.insert(
                    (layer, id),
                    Entry {
                        state: EntryState::Fetching,
                        bytes,
                        pins: 1,
                        stamp: 0,
                        sha256: String::new(),
                    },
                );
                reserved.push(id);
            }
            if let Err(source) = self.record_evictions(&mut inner, &evicted) {
                self.unreserve(&mut inner, layer, &reserved);
                return Err(StoreError::Io { path: self.log_path.clone(), source });
            }
            let nothing_pinned = !inner.entries.any_pinned();
            if out.is_empty() && reserved.is_empty() && !ids.is_empty() && nothing_pinned {
                let needed =
                    ids.first().and_then(|&id| self.index.get(layer, id)).map_or(0, |l| l.bytes());
                return Err(StoreError::DiskBudget { budget: self.config.budget, needed });
            }
        }
        if !reserved.is_empty() {
            let result = self.fetch_all(layer, &reserved);
            let mut inner = self.lock();
            let (ok, err) = match result {
                Ok(shas) => (shas, None),
                Err((shas, e)) => (shas, Some(e)),
            };
            let mut text = String::new();
            for (id, sha) in &ok {
                let spans = self.spans_of(layer, *id).unwrap_or_default();
                let p = Present { layer, expert: *id, sha256: sha.clone(), spans };
                text.push_str(&p.line());
            }
            let logged = if text.is_empty() { Ok(()) } else { inner.log.append(&text) };
            if let Err(source) = logged {
                self.unreserve(&mut inner, layer, &reserved);
                return Err(StoreError::Io { path: self.log_path.clone(), source });
            }
            inner.clock += 1;
            let clock = inner.clock;
            for (id, sha) in ok {
                let updated = inner.entries.update((layer, id), |e| {
                    e.state = EntryState::Present;
                    e.stamp = clock;
                    e.sha256 = sha;
                });
                if updated.is_some() {
                    self.counters.experts_fetched.fetch_add(1, Ordering::Relaxed);
                    // The reservation's pin becomes the caller's.
                    out.push((id, DiskPin { cache: Arc::clone(self), key: (layer, id) }));
                }
            }
            let failed: Vec<u32> = reserved
                .iter()
                .copied()
                .filter(|id| {
                    inner
                        .entries
                        .get(&(layer, *id))
                        .is_some_and(|e| e.state == EntryState::Fetching)
                })
                .collect();
            self.unreserve(&mut inner, layer, &failed);
            drop(inner);
            if let Some(e) = err {
                let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.counters.fetch_ns.fetch_add(ns, Ordering::Relaxed);
                return Err(e);
            }
        }
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters.fetch_ns.fetch_add(ns, Ordering::Relaxed);
        Ok(out)
    }
}
