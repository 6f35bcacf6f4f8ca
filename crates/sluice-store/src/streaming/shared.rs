//! The state a [`super::StreamingExperts`] shares with its read jobs, the read job itself, and
//! the pin guard of one `for_each` call.
//!
//! All slot bookkeeping lives under one mutex ([`Locked`]); a condition variable wakes waiting
//! requests whenever a read ends or a slot is unpinned. Counters are atomics outside the lock.

use crate::backend::{ReadTask, SpanError, SpanTarget};
use crate::cache::{CacheState, ExpertCache, ReadFailure, SlotState};
use crate::index::ExpertIndex;
use crate::io::clone_io_error;
use crate::remote::{DiskPin, ExpertDiskCache};
use crate::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::gate::Gate;
use super::LayerPrefetchStats;

/// An outstanding prefetch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Guess {
    pub(super) id: u32,
    pub(super) slot: usize,
    pub(super) ticket: u64,
}

/// Everything under the store's one lock.
#[derive(Debug)]
pub(super) struct Locked {
    pub(super) cache: CacheState,
    pub(super) guesses: Vec<Vec<Guess>>,
    /// Per layer, the reads a read-ahead started (the router's exact choice), taken by the
    /// layer's next demand, which counts them as misses even when they have already finished.
    pub(super) ahead: Vec<Vec<Guess>>,
    pub(super) layers: Vec<LayerPrefetchStats>,
    pub(super) gates: Vec<Gate>,
}

/// Store-wide counters behind [`crate::StoreStats`] (relaxed atomics: they are statistics).
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requests: AtomicU64,
    pub(super) bytes_served: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) expert_reads: AtomicU64,
    pub(super) span_reads: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) prefetch_issued: AtomicU64,
    pub(super) prefetch_cancelled: AtomicU64,
    pub(super) prefetch_used: AtomicU64,
    pub(super) prefetch_wasted_bytes: AtomicU64,
    pub(super) stall_ns: AtomicU64,
    pub(super) read_ns: AtomicU64,
    pub(super) read_errors: AtomicU64,
    pub(super) busy: BusyClock,
}

/// Wall time during which at least one expert read was in flight: the time the disk was
/// working for the store. Bytes read over it is the bandwidth the disk delivered to the
/// store's own access pattern, which `sluice bench` compares with its probe.
#[derive(Debug, Default)]
pub(super) struct BusyClock {
    /// Reads in flight, and since when the count has been above zero.
    state: Mutex<(usize, Option<Instant>)>,
    /// Finished busy periods.
    ns: AtomicU64,
}

impl BusyClock {
    /// A read starts.
    pub(super) fn enter(&self) {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.0 == 0 {
            st.1 = Some(Instant::now());
        }
        st.0 += 1;
    }

    /// A read that [`BusyClock::enter`]ed ends.
    pub(super) fn exit(&self) {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        st.0 = st.0.saturating_sub(1);
        if st.0 == 0 {
            if let Some(t0) = st.1.take() {
                add(&self.ns, nanos(t0));
            }
        }
    }

    /// Busy nanoseconds so far, the current busy period included.
    pub(super) fn total_ns(&self) -> u64 {
        let st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.ns.load(Ordering::Relaxed) + st.1.map_or(0, nanos)
    }
}

/// Adds `n` to counter `c`.
pub(super) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Nanoseconds since `t`.
pub(super) fn nanos(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// State shared with the read jobs.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) index: ExpertIndex,
    pub(super) cache: ExpertCache,
    pub(super) state: Mutex<Locked>,
    pub(super) cv: Condvar,
    pub(super) counters: Counters,
    pub(super) max_prefetch: usize,
    pub(super) min_precision: f64,
    /// The persistent expert cache of a stream install (experts not on local disk are
    /// fetched into it before they are read).
    pub(super) disk: Option<Arc<ExpertDiskCache>>,
    /// Per layer and expert, how many passes demanded it (the hot set a warm start reads back,
    /// [`crate::hotset`]).
    pub(super) uses: Vec<Vec<AtomicU64>>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Locked> {
        // Nothing panics while holding this lock in a way that breaks the slot invariants
        // (updates are single assignments), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the end of a read of `spans` spans and wakes every waiter.
    pub(super) fn finish(
        &self,
        (layer, slot, ticket): (usize, usize, u64),
        spans: u64,
        result: Result<u64, ReadFailure>,
    ) {
        let mut st = self.lock();
        let bytes = result.as_ref().ok().copied().unwrap_or(0);
        let failed = result.is_err();
        if st.cache.complete(slot, ticket, result.map(|_| ())) {
            // Counted under the lock: once a reader sees the error counted, the slot is
            // already failed (kept for its waiters) or free.
            add(&self.counters.read_errors, u64::from(failed));
            add(&self.counters.bytes_read, bytes);
            if !failed {
                add(&self.counters.expert_reads, 1);
                add(&self.counters.span_reads, spans);
            }
            crate::telemetry::count_expert_read(bytes);
            if let Some(l) = st.layers.get_mut(layer) {
                l.bytes_read += bytes;
            }
        }
        drop(st);
        self.cv.notify_all();
    }

    /// The request-level error for failed slot `slot`, naming the shard file and span.
    pub(super) fn read_error(&self, st: &Locked, slot: usize) -> StoreError {
        match &st.cache.slot(slot).failure {
            Some(f) => StoreError::Read {
                path: self.index.path(f.file).to_path_buf(),
                offset: f.offset,
                len: f.len,
                source: clone_io_error(&f.error),
            },
            None => StoreError::Config("invariant: a failed slot records its failure".into()),
        }
    }
}

/// One read into one slot, run by either backend ([`ReadTask`]). Dropping it unrun (cancelled
/// at shutdown) or unwinding out of it reports a failure for its ticket, so no slot stays
/// *reading* for ever.
pub(super) struct ReadJob {
    pub(super) shared: Arc<Shared>,
    pub(super) slot: usize,
    pub(super) ticket: u64,
    pub(super) layer: usize,
    pub(super) id: u32,
    pub(super) done: bool,
    /// With a disk cache: the pin that keeps this expert's bytes on disk while it is read.
    pub(super) disk_pin: Option<DiskPin>,
    /// A failure found before any read (the expert is not in the index or overruns its slot).
    pub(super) early: Option<ReadFailure>,
    pub(super) started: Option<Instant>,
    /// Spans this job reads (set when it starts).
    pub(super) spans: u64,
}

// SAFETY: `start` hands out regions of slot `slot` only while that slot is *reading* under this
// job's ticket. Only this job can end that state once it has started (cancel fails for a
// running job; completion with its ticket happens in `finish` or `Drop`), nobody reads a
// reading slot, and the arena lives in `shared`, which this job keeps alive.
unsafe impl ReadTask for ReadJob {
    fn start(&mut self) -> Vec<SpanTarget> {
        let sh = &*self.shared;
        {
            let st = sh.lock();
            let s = st.cache.slot(self.slot);
            if s.ticket != self.ticket || s.state != SlotState::Reading {
                // Stale (the slot was abandoned or reused): nothing to read or report.
                self.done = true;
                return Vec::new();
            }
        }
        self.started = Some(Instant::now());
        sh.counters.busy.enter();
        let Some(loc) = sh.index.get(self.layer, self.id) else {
            let e = std::io::Error::other("expert missing from the index");
            self.early = Some(failure(0, 0, 0, e));
            return Vec::new();
        };
        // SAFETY: see the `unsafe impl`: this job is the slot's only user until it finishes.
        let buf = unsafe { sh.cache.arena().slot_mut(self.slot) };
        let mut targets = Vec::with_capacity(loc.spans().len());
        for span in loc.spans() {
            let region = usize::try_from(span.region).ok().and_then(|a| {
                let b = a.checked_add(usize::try_from(span.region_len()).ok()?)?;
                buf.get_mut(a..b)
            });
            let Some(region) = region else {
                let e = std::io::Error::other("expert larger than its cache slot");
                self.early = Some(failure(span.file, span.offset, span.len, e));
                return Vec::new();
            };
            targets.push(SpanTarget { span: *span, buf: region.as_mut_ptr(), len: region.len() });
        }
        self.spans = targets.len() as u64;
        targets
    }

    fn finish(mut self: Box<Self>, result: Result<u64, SpanError>) {
        if self.done {
            return;
        }
        self.done = true;
        let result = match (self.early.take(), result) {
            (Some(f), _) => Err(f),
            (None, Ok(n)) => Ok(n),
            (None, Err(e)) => Err(failure(e.span.file, e.span.offset, e.span.len, e.error)),
        };
        if let Some(t0) = self.started.take() {
            add(&self.shared.counters.read_ns, nanos(t0));
            self.shared.counters.busy.exit();
        }
        // Unpinned before waiters wake, so a waiter that needs disk room finds it.
        drop(self.disk_pin.take());
        self.shared.finish((self.layer, self.slot, self.ticket), self.spans, result);
    }
}

/// A [`ReadFailure`] for the span at `offset..offset + len` of shard `file`.
pub(super) fn failure(file: usize, offset: u64, len: u64, error: std::io::Error) -> ReadFailure {
    ReadFailure { file, offset, len, error }
}

impl Drop for ReadJob {
    fn drop(&mut self) {
        if self.started.take().is_some() {
            self.shared.counters.busy.exit();
        }
        if !self.done {
            drop(self.disk_pin.take());
            let e = std::io::Error::other("read job ended without completing");
            let at = (self.layer, self.slot, self.ticket);
            self.shared.finish(at, 0, Err(failure(0, 0, 0, e)));
        }
    }
}

/// The slots a `for_each` call has pinned; dropping it unpins whatever is left (error paths).
pub(super) struct Pins<'a> {
    pub(super) shared: &'a Shared,
    pub(super) held: Vec<usize>,
}

impl Pins<'_> {
    /// Unpins `slot` under the lock the caller holds; returns whether waiters should be woken.
    pub(super) fn release_locked(&mut self, st: &mut Locked, slot: usize) -> bool {
        match self.held.iter().position(|&s| s == slot) {
            Some(p) => {
                self.held.swap_remove(p);
                st.cache.unpin(slot)
            }
            None => false,
        }
    }

    pub(super) fn release(&mut self, slot: usize) {
        if let Some(p) = self.held.iter().position(|&s| s == slot) {
            self.held.swap_remove(p);
            let wake = self.shared.lock().cache.unpin(slot);
            if wake {
                self.shared.cv.notify_all();
            }
        }
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut st = self.shared.lock();
        for &s in &self.held {
            st.cache.unpin(s);
        }
        drop(st);
        self.shared.cv.notify_all();
    }
}

/// The working sets of one `for_each` call.
pub(super) struct Request<'a> {
    pub(super) layer: usize,
    /// Demanded ids a prefetch brought in (their first use is not a re-use).
    pub(super) fresh: Vec<u32>,
    /// Demanded ids whose read a read-ahead started: misses, whether or not it has finished.
    pub(super) ahead: Vec<u32>,
    pub(super) pins: Pins<'a>,
    /// Pinned, still being read.
    pub(super) pending: Vec<(u32, usize)>,
    /// Pinned and ready, to hand to the consumer when its id's turn comes.
    pub(super) ready: Vec<(u32, usize)>,
    /// Ids whose ready slot this call gave back so that an expert of lower id could be read
    /// (counted once already: taking them again counts no second hit or miss).
    pub(super) released: Vec<u32>,
}
