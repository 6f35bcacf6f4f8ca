//! [`ExpertDiskCache`]: the persistent local expert cache of a stream install (see the
//! module docs of [`crate::remote`] for the protocol and [`super::log`] for the log).

use super::log::{self, LogSpan, LogWriter, Present};
use super::RemoteSource;
use crate::index::ExpertIndex;
use crate::StoreError;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

type Key = (usize, u32);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// Reserved in the budget, being fetched by one `localize` call.
    Fetching,
    /// Recorded present in the log.
    Present,
}

#[derive(Debug)]
struct Entry {
    state: EntryState,
    bytes: u64,
    pins: u32,
    stamp: u64,
    sha256: String,
}

#[derive(Debug)]
struct Inner {
    entries: HashMap<Key, Entry>,
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
        if let Some(e) = inner.entries.get_mut(&self.key) {
            e.pins = e.pins.saturating_sub(1);
        }
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
                for s in loc.spans() {
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
                entries: HashMap::new(),
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
            loc.spans()
                .iter()
                .map(|s| LogSpan {
                    shard: self.names.get(s.file).cloned().unwrap_or_default(),
                    offset: s.offset,
                    len: s.len,
                })
                .collect(),
        )
    }

    /// Punches the holes of expert `e` of layer `l` back (best effort; failures are counted).
    fn punch_expert(&self, l: usize, e: u32) {
        let Some(loc) = self.index.get(l, e) else { return };
        for s in loc.spans() {
            let ok = self
                .files
                .get(s.file)
                .and_then(Option::as_ref)
                .is_some_and(|f| punch_hole(f, s.offset, s.len).is_ok());
            if !ok {
                self.counters.punch_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
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
        match inner.entries.get_mut(&(layer, id)) {
            Some(e) if e.state == EntryState::Present => {
                e.pins += 1;
                e.stamp = clock;
                Some(DiskPin { cache: Arc::clone(self), key: (layer, id) })
            }
            _ => {
                self.counters.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
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
                match inner.entries.get_mut(&(layer, id)) {
                    Some(e) if e.state == EntryState::Present => {
                        e.pins += 1;
                        e.stamp = clock;
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
                while inner.used + bytes > self.config.budget {
                    let victim = inner
                        .entries
                        .iter()
                        .filter(|(_, e)| e.state == EntryState::Present && e.pins == 0)
                        .min_by_key(|(_, e)| e.stamp)
                        .map(|(k, _)| *k);
                    let Some(v) = victim else { break };
                    if let Some(e) = inner.entries.remove(&v) {
                        inner.used -= e.bytes;
                        evicted.push((v, e.bytes));
                    }
                }
                if inner.used + bytes > self.config.budget {
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
            if !evicted.is_empty() {
                // Absent first (synced), holes second: a crash in between leaves unrecorded
                // bytes, never a record of bytes that are gone.
                let text: String =
                    evicted.iter().map(|((l, e), _)| log::remove_line(*l, *e)).collect();
                let logged = inner.log.append(&text);
                for ((l, e), bytes) in &evicted {
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                    self.counters.evicted_bytes.fetch_add(*bytes, Ordering::Relaxed);
                    if logged.is_ok() {
                        self.punch_expert(*l, *e);
                    }
                }
                if let Err(source) = logged {
                    self.unreserve(&mut inner, layer, &reserved);
                    return Err(StoreError::Io { path: self.log_path.clone(), source });
                }
            }
            let nothing_pinned = inner.entries.values().all(|e| e.pins == 0);
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
                if let Some(e) = inner.entries.get_mut(&(layer, id)) {
                    e.state = EntryState::Present;
                    e.stamp = clock;
                    e.sha256 = sha;
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

    /// Drops the reservations of `ids` (still fetching) and punches what they may have
    /// written.
    fn unreserve(&self, inner: &mut Inner, layer: usize, ids: &[u32]) {
        for &id in ids {
            if inner.entries.get(&(layer, id)).is_some_and(|e| e.state == EntryState::Fetching) {
                if let Some(e) = inner.entries.remove(&(layer, id)) {
                    inner.used -= e.bytes;
                }
                self.punch_expert(layer, id);
            }
        }
    }

    /// Fetches every span of `ids` (coalesced), writes and syncs it; returns each fully
    /// written expert's SHA-256, or those plus the first error.
    #[allow(clippy::type_complexity)]
    fn fetch_all(
        &self,
        layer: usize,
        ids: &[u32],
    ) -> Result<Vec<(u32, String)>, (Vec<(u32, String)>, StoreError)> {
        // (file, offset, len, expert) for every span, disk order, then runs of adjacent spans.
        let mut spans: Vec<(usize, u64, u64, u32)> = Vec::new();
        for &id in ids {
            if let Some(loc) = self.index.get(layer, id) {
                spans.extend(loc.spans().iter().map(|s| (s.file, s.offset, s.len, id)));
            }
        }
        spans.sort_unstable();
        let mut groups: VecDeque<Vec<(usize, u64, u64, u32)>> = VecDeque::new();
        for s in spans {
            let extend = groups.back().is_some_and(|g| {
                let (_, first, _, _) = g[0];
                let last = g[g.len() - 1];
                last.0 == s.0
                    && last.1 + last.2 == s.1
                    && s.1 + s.2 - first <= self.config.max_request
            });
            match groups.back_mut() {
                Some(g) if extend => g.push(s),
                _ => groups.push_back(vec![s]),
            }
        }
        let queue = Mutex::new(groups);
        let results: Mutex<Vec<(u32, Option<String>)>> = Mutex::new(Vec::new());
        let first_err: Mutex<Option<StoreError>> = Mutex::new(None);
        let workers = self.config.fetchers.max(1);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let g = queue.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
                    let Some(g) = g else { break };
                    match self.fetch_group(layer, &g) {
                        Ok(shas) => {
                            results.lock().unwrap_or_else(PoisonError::into_inner).extend(shas);
                        }
                        Err(e) => {
                            let mut fe = first_err.lock().unwrap_or_else(PoisonError::into_inner);
                            fe.get_or_insert(e);
                            // Stop taking new requests once one has failed.
                            queue.lock().unwrap_or_else(PoisonError::into_inner).clear();
                        }
                    }
                });
            }
        });
        let results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut shas: HashMap<u32, String> = HashMap::new();
        let mut multi = Vec::new();
        for (id, sha) in results {
            match sha {
                Some(s) => {
                    shas.insert(id, s);
                }
                None => multi.push(id),
            }
        }
        multi.sort_unstable();
        multi.dedup();
        let err = first_err.into_inner().unwrap_or_else(PoisonError::into_inner);
        // Experts in several spans: hashed from disk once all their spans are written.
        if err.is_none() {
            for id in multi {
                match self.hash_from_disk(layer, id) {
                    Ok(s) => {
                        shas.insert(id, s);
                    }
                    Err(e) => return Err((shas.into_iter().collect(), e)),
                }
            }
        }
        let ok: Vec<(u32, String)> = shas.into_iter().collect();
        match err {
            Some(e) => Err((ok, e)),
            None => Ok(ok),
        }
    }

    /// One coalesced request: fetch, write at the original offset, sync, drop the pages from
    /// the page cache. Returns each single-span expert's SHA-256 (`None` for experts with
    /// more spans, hashed later).
    fn fetch_group(
        &self,
        layer: usize,
        g: &[(usize, u64, u64, u32)],
    ) -> Result<Vec<(u32, Option<String>)>, StoreError> {
        let (file, start, _, _) = g[0];
        let last = g[g.len() - 1];
        let end = last.1 + last.2;
        let path = self.index.path(file).to_path_buf();
        let len = end - start;
        let n = usize::try_from(len).map_err(|_| cfg_err(&path, "request too large"))?;
        let mut buf = vec![0u8; n];
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.remote.fetch(file, start, &mut buf).map_err(|source| StoreError::Remote {
            path: path.clone(),
            offset: start,
            len,
            source,
        })?;
        self.counters.bytes_fetched.fetch_add(len, Ordering::Relaxed);
        let f = self.files.get(file).and_then(Option::as_ref).ok_or_else(|| {
            cfg_err(&path, "shard holds no routed experts but a request was made for it")
        })?;
        let io = |source| StoreError::Io { path: path.clone(), source };
        f.write_all_at(&buf, start).map_err(io)?;
        f.sync_data().map_err(io)?;
        drop_cached(f, start, len);
        let mut out = Vec::with_capacity(g.len());
        for &(_, off, l, id) in g {
            if self.index.get(layer, id).is_some_and(|loc| loc.spans().len() == 1) {
                let a = usize::try_from(off - start).unwrap_or(usize::MAX);
                let b = a.saturating_add(usize::try_from(l).unwrap_or(usize::MAX));
                let sha = buf.get(a..b).map(|s| hex(&Sha256::digest(s)));
                if sha.is_none() {
                    return Err(cfg_err(&path, "invariant: a span lies inside its request"));
                }
                out.push((id, sha));
            } else {
                out.push((id, None));
            }
        }
        Ok(out)
    }

    /// SHA-256 of expert `id` of `layer` read back from its sparse file(s), in span order.
    fn hash_from_disk(&self, layer: usize, id: u32) -> Result<String, StoreError> {
        let mut h = Sha256::new();
        let Some(loc) = self.index.get(layer, id) else {
            return Err(StoreError::Config(format!("expert {id} of layer {layer} not indexed")));
        };
        for s in loc.spans() {
            let path = self.index.path(s.file).to_path_buf();
            let f = self
                .files
                .get(s.file)
                .and_then(Option::as_ref)
                .ok_or_else(|| cfg_err(&path, "shard holds no routed experts"))?;
            let n = usize::try_from(s.len).map_err(|_| cfg_err(&path, "span too large"))?;
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, s.offset)
                .map_err(|source| StoreError::Io { path: path.clone(), source })?;
            h.update(&buf);
        }
        Ok(hex(&h.finalize()))
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Returns the blocks of `offset .. offset + len` of `file` to the file system; the file keeps
/// its length and the range reads as zeros.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: `fallocate` only reads its integer arguments; the descriptor is open for the
    // lifetime of `file`. Punching a hole changes file contents, never memory we hold.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Drops the page-cache pages of a range just written and synced (best effort), so filling
/// the disk cache does not grow memory outside the budget.
fn drop_cached(file: &File, offset: u64, len: u64) {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: `posix_fadvise` only reads its integer arguments; advice is harmless to memory.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
}
