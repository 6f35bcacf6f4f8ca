//! [`StreamingExperts`]: routed experts read from the shards into the slot cache on demand.
//!
//! `for_each(layer, ids, f)` pins every requested expert that is cached or already being read,
//! takes slots for the rest (evicting per the policy) and submits all those reads to the reader
//! pool at once, then hands cache hits to `f` while the reads run, and every miss as soon as its
//! read completes. With fewer free slots than misses it works in waves: each expert handed back
//! frees a slot, and the next miss's read is submitted into it before the next expert is handed
//! over (one expert per round), so the disk does not idle while a backlog of finished reads is
//! computed. Experts reach `f` in ascending id order, whatever order their reads finish in
//! (misses are submitted in that order; an expert whose read finishes early keeps its pinned
//! slot until its turn), so a model can add each expert's output into one running sum per row
//! and still get a result that depends only on each row's own routing. When the next id finds
//! every slot pinned, some by this call's later experts, the furthest of those gives its slot
//! back (and is read again in its turn if it was evicted meanwhile). `prefetch(layer, ids)` starts low-priority reads for a guess;
//! when `layer` is demanded, the guess is settled: right guesses count towards recall, wrong
//! ones are cancelled if not yet started and their bytes counted as wasted if they were read.

mod gate;
mod guess;
mod run;
mod shared;
mod warm;

pub use gate::{LayerPrefetchStats, DEFAULT_MIN_PRECISION, GATE_WEIGHT};

use crate::backend::{IoBackend, Readers};
use crate::cache::{CacheSize, CacheState, ExpertCache, SlotState};
use crate::index::ExpertIndex;
use crate::io::{IoMode, ReadAt, ShardFiles};
use crate::policy::{key, PolicyKind};
use crate::reader::{JobState, Priority, DEFAULT_READERS};
use crate::remote::{DiskPin, ExpertDiskCache};
use crate::{ExpertLayout, ExpertStore, ExpertView, StoreError, StoreStats};
use gate::Gate;
use shared::{add, Counters, Locked, ReadJob, Request, Shared};
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a [`StreamingExperts`] store is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamingConfig {
    /// Cache size (default: what the memory budget has room for).
    pub cache: CacheSize,
    /// Fewest slots worth running with when sizing from bytes or the budget (default 2).
    pub min_slots: usize,
    /// Reads in flight at once: ring depth or reader threads (default 16).
    pub readers: usize,
    /// Read backend (default: io_uring where the kernel allows it, else the pread pool).
    pub backend: IoBackend,
    /// Page-cache handling (default O_DIRECT with a buffered fallback).
    pub io: IoMode,
    /// Replacement policy (default S3-FIFO).
    pub policy: PolicyKind,
    /// Most slots that unused prefetches may hold at once (default half the slots; 0 turns
    /// prefetch off).
    pub max_prefetch_slots: Option<usize>,
    /// Guesses for a layer are read only while their measured precision (an exponential
    /// average over passes, see [`GATE_WEIGHT`]) is at least this (default
    /// [`DEFAULT_MIN_PRECISION`]; 0 always reads them).
    pub prefetch_min_precision: f64,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        Self {
            cache: CacheSize::Available,
            min_slots: 2,
            readers: DEFAULT_READERS,
            backend: IoBackend::Auto,
            io: IoMode::Direct,
            policy: PolicyKind::default(),
            max_prefetch_slots: None,
            prefetch_min_precision: DEFAULT_MIN_PRECISION,
        }
    }
}

/// Routed experts streamed from the shard files through a slot cache (see the module docs).
#[derive(Debug)]
pub struct StreamingExperts {
    shared: Arc<Shared>,
    pool: Readers,
}

impl StreamingExperts {
    /// Locates every routed expert of `moe_layers` (of `num_layers`, each with `experts`
    /// experts laid out as `layout` says), opens the shards per `config.io`, and sizes the cache from
    /// `config` and `budget`.
    pub fn open(
        ckpt: &Checkpoint,
        num_layers: usize,
        moe_layers: &[usize],
        experts: usize,
        layout: &dyn ExpertLayout,
        config: &StreamingConfig,
        budget: &MemoryBudget,
    ) -> Result<Self, StoreError> {
        let index = ExpertIndex::build(ckpt, num_layers, moe_layers, experts, layout)?;
        let files = ShardFiles::open(index.paths(), config.io)?;
        Self::new(index, Arc::new(files), config, budget)
    }

    /// A store over an existing index, reading through `reader` (e.g. a
    /// [`crate::FaultyReader`] in tests). `config.io` is not used: `reader` decides.
    pub fn new(
        index: ExpertIndex,
        reader: Arc<dyn ReadAt>,
        config: &StreamingConfig,
        budget: &MemoryBudget,
    ) -> Result<Self, StoreError> {
        Self::build(index, reader, config, budget, None)
    }

    /// A store for a stream install: experts are read through `reader` from the sparse
    /// shards, and those not on local disk are first fetched into them by `disk` (see
    /// [`crate::remote`]). Prefetch reads only experts already on local disk.
    pub fn with_disk_cache(
        index: ExpertIndex,
        reader: Arc<dyn ReadAt>,
        config: &StreamingConfig,
        budget: &MemoryBudget,
        disk: Arc<ExpertDiskCache>,
    ) -> Result<Self, StoreError> {
        Self::build(index, reader, config, budget, Some(disk))
    }

    fn build(
        index: ExpertIndex,
        reader: Arc<dyn ReadAt>,
        config: &StreamingConfig,
        budget: &MemoryBudget,
        disk: Option<Arc<ExpertDiskCache>>,
    ) -> Result<Self, StoreError> {
        if index.total_experts() == 0 {
            return Err(StoreError::Config("no routed experts to stream".into()));
        }
        let cache = ExpertCache::new(
            index.slot_bytes(),
            config.cache,
            config.min_slots,
            index.total_experts(),
            budget,
        )?;
        let slots = cache.slots();
        let pool = Readers::start(config.backend, config.readers, reader)?;
        let layers = index.num_layers();
        let uses = (0..layers)
            .map(|l| (0..index.experts(l)).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let state = Locked {
            cache: CacheState::new(slots, config.policy),
            guesses: vec![Vec::new(); layers],
            ahead: vec![Vec::new(); layers],
            layers: vec![LayerPrefetchStats::default(); layers],
            gates: vec![Gate::default(); layers],
        };
        let shared = Arc::new(Shared {
            index,
            cache,
            state: Mutex::new(state),
            cv: Condvar::new(),
            counters: Counters::default(),
            max_prefetch: config.max_prefetch_slots.unwrap_or(slots / 2).min(slots),
            min_precision: config.prefetch_min_precision,
            disk,
            uses,
        });
        Ok(Self { shared, pool })
    }

    /// Number of cache slots.
    pub fn slots(&self) -> usize {
        self.shared.cache.slots()
    }

    /// Bytes per cache slot.
    pub fn slot_bytes(&self) -> usize {
        self.shared.cache.arena().slot_bytes()
    }

    /// The expert index.
    pub fn index(&self) -> &ExpertIndex {
        &self.shared.index
    }

    /// Reads in flight at most (ring depth or reader threads).
    pub fn readers(&self) -> usize {
        self.pool.depth()
    }

    /// The read backend in use: `"io_uring"` or `"pread"`.
    pub fn io_backend(&self) -> &'static str {
        self.pool.name()
    }

    /// Why io_uring is not in use although `auto` asked for it (the kernel's error), or why
    /// its ring was given up mid-run (`io_uring_enter failed: …`), if so.
    pub fn io_fallback_reason(&self) -> Option<&str> {
        self.pool.fallback_reason()
    }

    /// The persistent expert cache of a stream install, if this store has one.
    pub fn disk_cache(&self) -> Option<&Arc<ExpertDiskCache>> {
        self.shared.disk.as_ref()
    }

    /// Prefetch accounting per layer (indexed by layer).
    pub fn layer_prefetch_stats(&self) -> Vec<LayerPrefetchStats> {
        self.shared.lock().layers.clone()
    }

    /// Waits until `done(stats)` holds or `timeout` passes; returns whether it held. Every
    /// read ends by recording its counters under the store's lock and waking its waiters, so
    /// this waits on that event rather than polling (for tests and diagnostics: "a read has
    /// failed", "n bytes were read").
    pub fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&StoreStats) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if done(&ExpertStore::stats(self)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.shared.cv.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Waits until no slot is being read (every read submitted so far, prefetches included,
    /// has landed in the cache or failed) or `timeout` passes; returns whether the store went
    /// quiet. For tests and diagnostics: reads end under the store's lock and wake its waiters.
    pub fn wait_reads_done(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if !(0..self.slots()).any(|i| st.cache.slot(i).state == SlotState::Reading) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.shared.cv.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Checks the cache invariants (map, free list, prefetch marks) and, when `idle` (no
    /// request in progress), that no slot is pinned. For tests and diagnostics.
    pub fn check_consistency(&self, idle: bool) -> Result<(), String> {
        let st = self.shared.lock();
        st.cache.check()?;
        let pins = st.cache.total_pins();
        if idle && pins != 0 {
            return Err(format!("{pins} pins held while idle"));
        }
        Ok(())
    }

    fn submit(
        &self,
        st: &mut Locked,
        slot: usize,
        ticket: u64,
        (layer, id): (usize, u32),
        p: Priority,
        disk_pin: Option<DiskPin>,
    ) {
        let job = ReadJob {
            shared: self.shared.clone(),
            slot,
            ticket,
            layer,
            id,
            done: false,
            disk_pin,
            early: None,
            started: None,
            spans: 0,
        };
        let handle = self.pool.submit(p, Box::new(job));
        st.cache.slot_mut(slot).job = Some((handle, p));
    }

    /// Pins `id`'s slot if it is cached or being read; a queued prefetch read of it is moved
    /// to the demand queue. Returns false if `id` has no slot.
    fn take_cached(&self, st: &mut Locked, rq: &mut Request<'_>, id: u32) -> bool {
        let Some(i) = st.cache.lookup(key(rq.layer, id)) else { return false };
        st.cache.pin(i);
        rq.pins.held.push(i);
        // A prefetched or read-ahead expert's first use is its insertion, not a re-use; an
        // expert this call gave back and takes again was counted when first taken.
        let ahead = rq.ahead.binary_search(&id).is_ok();
        let again = rq.released.contains(&id);
        if !ahead && !again && rq.fresh.binary_search(&id).is_err() {
            st.cache.touch(i);
        }
        let c = &self.shared.counters;
        if st.cache.slot(i).state == SlotState::Ready {
            if !again {
                add(if ahead { &c.misses } else { &c.hits }, 1);
            }
            rq.ready.push((id, i));
            return true;
        }
        if !again {
            add(&c.misses, 1);
        }
        rq.pending.push((id, i));
        let queued_prefetch = matches!(&st.cache.slot(i).job,
            Some((h, Priority::Prefetch)) if h.state() == JobState::Queued);
        if queued_prefetch {
            // The new job needs its own disk pin, taken before the old job (and its pin) is
            // dropped, so the bytes cannot be evicted in between.
            let pin = match &self.shared.disk {
                Some(d) => match d.try_pin(rq.layer, id) {
                    Some(p) => Some(p),
                    None => return true,
                },
                None => None,
            };
            if st.cache.slot(i).job.as_ref().is_some_and(|(h, _)| h.cancel()) {
                let ticket = st.cache.retarget(i);
                self.submit(st, i, ticket, (rq.layer, id), Priority::Demand, pin);
            }
        }
        true
    }
}

impl ExpertStore for StreamingExperts {
    fn for_each(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.run(layer, ids, None, f)
    }

    fn for_each_then_prefetch(
        &self,
        layer: usize,
        ids: &[u32],
        next: Option<(usize, &[u32])>,
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.run(layer, ids, next, f)
    }

    fn layer_stats(&self) -> Vec<LayerPrefetchStats> {
        self.layer_prefetch_stats()
    }

    fn stats(&self) -> StoreStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            requests: g(&c.requests),
            bytes_served: g(&c.bytes_served),
            bytes_read: g(&c.bytes_read),
            expert_reads: g(&c.expert_reads),
            span_reads: g(&c.span_reads),
            hits: g(&c.hits),
            misses: g(&c.misses),
            prefetch_issued: g(&c.prefetch_issued),
            prefetch_cancelled: g(&c.prefetch_cancelled),
            prefetch_used: g(&c.prefetch_used),
            prefetch_wasted_bytes: g(&c.prefetch_wasted_bytes),
            stall_ns: g(&c.stall_ns),
            read_ns: g(&c.read_ns),
            busy_ns: c.busy.total_ns(),
            read_errors: g(&c.read_errors),
        }
    }

    fn prefetch(&self, layer: usize, ids: &[u32]) {
        let mut st = self.shared.lock();
        self.guess(&mut st, layer, ids);
        drop(st);
        self.pool.kick();
    }

    fn read_ahead(&self, layer: usize, ids: &[u32]) {
        self.read_now(layer, ids);
    }

    fn cancel_prefetch(&self, layer: usize) {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let Some(guesses) = st.guesses.get_mut(layer).map(std::mem::take) else { return };
        let mut keep = Vec::with_capacity(guesses.len());
        for g in guesses {
            let s = st.cache.slot(g.slot);
            let unstarted = s.ticket == g.ticket
                && s.state == SlotState::Reading
                && s.pins == 0
                && s.job.as_ref().is_some_and(|(h, _)| h.cancel());
            if unstarted {
                st.cache.abandon(g.slot, g.ticket);
                add(&sh.counters.prefetch_cancelled, 1);
            } else {
                keep.push(g);
            }
        }
        st.guesses[layer] = keep;
    }
}
