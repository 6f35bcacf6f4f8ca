//! Giving disk space back: choosing eviction victims (least recently used among present,
//! unpinned experts, in O(log n) through [`super::entries::Entries`]), recording them absent in
//! the log, then punching their holes back ([`crate::platform::holes`]), and undoing reservations
//! whose fetch failed.

use super::entries::{EntryState, Key};
use super::{ExpertDiskCache, Inner};
use crate::platform::holes;
use crate::remote::log;
use std::io;
use std::sync::atomic::Ordering;

/// Evicts least recently used unpinned experts until `bytes` more fit in `budget`, adding each
/// victim (and its bytes) to `evicted`. Returns whether they fit.
pub(super) fn make_room(
    inner: &mut Inner,
    bytes: u64,
    budget: u64,
    evicted: &mut Vec<(Key, u64)>,
) -> bool {
    while inner.used + bytes > budget {
        let Some((k, e)) = inner.entries.pop_lru() else { return false };
        inner.used -= e.bytes;
        evicted.push((k, e.bytes));
    }
    true
}

impl ExpertDiskCache {
    /// Records the `evicted` experts absent in the log, then punches their holes. Absent
    /// first (synced), holes second: a crash in between leaves unrecorded bytes, never a
    /// record of bytes that are gone. When the log cannot be written, no hole is punched.
    pub(super) fn record_evictions(
        &self,
        inner: &mut Inner,
        evicted: &[(Key, u64)],
    ) -> io::Result<()> {
        if evicted.is_empty() {
            return Ok(());
        }
        let text: String = evicted.iter().map(|((l, e), _)| log::remove_line(*l, *e)).collect();
        let logged = inner.log.append(&text);
        for ((l, e), bytes) in evicted {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.counters.evicted_bytes.fetch_add(*bytes, Ordering::Relaxed);
            if logged.is_ok() {
                self.punch_expert(*l, *e);
            }
        }
        logged
    }

    /// Punches the holes of expert `e` of layer `l` back (best effort; failures are counted).
    pub(super) fn punch_expert(&self, l: usize, e: u32) {
        let Some(loc) = self.index.get(l, e) else { return };
        for s in loc.stored_spans() {
            let ok = self
                .files
                .get(s.file)
                .and_then(Option::as_ref)
                .is_some_and(|f| holes::punch(f, s.offset, s.len).is_ok());
            if !ok {
                self.counters.punch_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops the reservations of `ids` (still fetching) and punches what they may have
    /// written.
    pub(super) fn unreserve(&self, inner: &mut Inner, layer: usize, ids: &[u32]) {
        for &id in ids {
            if inner.entries.get(&(layer, id)).is_some_and(|e| e.state == EntryState::Fetching) {
                if let Some(e) = inner.entries.remove(&(layer, id)) {
                    inner.used -= e.bytes;
                }
                self.punch_expert(layer, id);
            }
        }
    }
}
