//! What a pool's calls cost: the running [`Tally`] the calling thread adds to once per call,
//! and the [`PoolCounters`] snapshots `--stats` reads (where a pass's time goes besides the
//! kernels: work the calling thread did alone, and its wait for the helpers' last chunks).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Running totals of a pool's calls, updated by the calling thread once per call (a few
/// relaxed atomic additions and two clock reads: nothing per chunk).
#[derive(Default)]
pub(super) struct Tally {
    calls: AtomicU64,
    split: AtomicU64,
    chunks: AtomicU64,
    caller_chunks: AtomicU64,
    wakes: AtomicU64,
    busy_ns: AtomicU64,
    tail_ns: AtomicU64,
}

/// What a pool's calls have cost since it started ([`Pool::counters`]); the difference of
/// two snapshots ([`PoolCounters::since`]) covers the calls between them. Where a pass's time
/// goes: its wall time less `busy_ns` is work the calling thread did alone (norms, glue,
/// small matrices, allocation); `tail_ns` is how long the caller, out of chunks to claim,
/// waited for the helpers' last ones (uneven progress, a helper descheduled or slow to wake).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolCounters {
    /// Calls of [`Pool::run`] and [`Pool::on_every_thread`].
    pub calls: u64,
    /// Calls that were handed to the helpers (the rest ran on the calling thread alone: one
    /// chunk, no helpers, or the pool was busy).
    pub split: u64,
    /// Chunks of the split calls.
    pub chunks: u64,
    /// Of those, chunks the calling thread ran itself.
    pub caller_chunks: u64,
    /// Split calls that found helpers parked and had to wake them.
    pub wakes: u64,
    /// Nanoseconds the calling thread spent inside calls (split or not).
    pub busy_ns: u64,
    /// Nanoseconds of the split calls between the caller's last chunk and the helpers' last.
    pub tail_ns: u64,
}

impl PoolCounters {
    /// The calls between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            calls: self.calls.saturating_sub(earlier.calls),
            split: self.split.saturating_sub(earlier.split),
            chunks: self.chunks.saturating_sub(earlier.chunks),
            caller_chunks: self.caller_chunks.saturating_sub(earlier.caller_chunks),
            wakes: self.wakes.saturating_sub(earlier.wakes),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
            tail_ns: self.tail_ns.saturating_sub(earlier.tail_ns),
        }
    }
}

impl Tally {
    pub(super) fn snapshot(&self) -> PoolCounters {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PoolCounters {
            calls: r(&self.calls),
            split: r(&self.split),
            chunks: r(&self.chunks),
            caller_chunks: r(&self.caller_chunks),
            wakes: r(&self.wakes),
            busy_ns: r(&self.busy_ns),
            tail_ns: r(&self.tail_ns),
        }
    }

    /// Records a call that began at `t0` and ran on the calling thread alone.
    pub(super) fn alone(&self, t0: Instant) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.busy_ns.fetch_add(nanos_since(t0), Ordering::Relaxed);
    }

    /// Records a split call of `chunks` chunks, `mine` of them run by the caller, that began
    /// at `t0` and whose caller ran out of chunks at `t1`.
    pub(super) fn split(&self, t0: Instant, t1: Instant, chunks: usize, mine: u64, woke: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.split.fetch_add(1, Ordering::Relaxed);
        self.chunks.fetch_add(chunks as u64, Ordering::Relaxed);
        self.caller_chunks.fetch_add(mine, Ordering::Relaxed);
        self.wakes.fetch_add(u64::from(woke), Ordering::Relaxed);
        self.busy_ns.fetch_add(nanos_since(t0), Ordering::Relaxed);
        self.tail_ns.fetch_add(nanos_since(t1), Ordering::Relaxed);
    }
}

fn nanos_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
