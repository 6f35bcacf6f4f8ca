//! The expert cache: a slab [`Arena`] of fixed-size slots, charged once to the memory budget,
//! and the state machine that says who may touch which slot.
//!
//! Every slot is in one of four states:
//!
//! - **free**: holds nothing; on the free list.
//! - **reading**: a read job owns its bytes and is filling them; never evicted, never read.
//! - **ready**: holds an expert; readable while pinned, evictable when its pin count is 0.
//! - **failed**: its read failed while someone was waiting (pinned); it becomes free when the
//!   last waiter unpins it. Its key is already unmapped, so the next request reads afresh: a
//!   failed slot is never left half-filled and marked ready.
//!
//! A **pin** is a reference count held while the model computes on a slot (or while a request
//! waits for a reading slot). Eviction asks the replacement [`Policy`] for a victim among ready,
//! unpinned slots; reading and pinned slots are never evicted. Every slot assignment gets a
//! fresh **ticket**, so a late completion or cleanup of a job that lost its slot is ignored.

use crate::arena::Arena;
use crate::policy::{new_policy, Key, Policy, PolicyKind};
use crate::reader::{JobHandle, Priority};
use crate::StoreError;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use std::collections::HashMap;
use std::io;

/// How many slots the cache gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSize {
    /// Exactly this many slots (at least 1).
    Slots(usize),
    /// As many slots as fit in this many bytes (at least the configured minimum).
    Bytes(u64),
    /// As many slots as the memory budget has room for now (at least the minimum).
    Available,
}

/// The slot arena and its budget charge.
#[derive(Debug)]
pub struct ExpertCache {
    arena: Arena,
    _charge: Charge,
}

impl ExpertCache {
    /// Sizes and allocates the arena for slots of `slot_bytes` bytes, never more slots than
    /// `max_useful` (the number of experts), charging it to `budget`. Refuses with the
    /// numbers when even `min_slots` (or an explicit slot count) do not fit.
    pub fn new(
        slot_bytes: u64,
        size: CacheSize,
        min_slots: usize,
        max_useful: usize,
        budget: &MemoryBudget,
    ) -> Result<Self, StoreError> {
        if min_slots == 0 {
            return Err(StoreError::Config("min_slots must be at least 1".into()));
        }
        let available = budget.limit().saturating_sub(budget.used());
        let fit = |bytes: u64| usize::try_from(bytes / slot_bytes.max(1)).unwrap_or(usize::MAX);
        let slots = match size {
            CacheSize::Slots(0) => {
                return Err(StoreError::Config("a cache needs at least one slot".into()))
            }
            CacheSize::Slots(n) => n,
            CacheSize::Bytes(b) => fit(b).min(max_useful.max(min_slots)),
            CacheSize::Available => fit(available).min(max_useful.max(min_slots)),
        };
        let explicit = matches!(size, CacheSize::Slots(_));
        let asked = if explicit { slots } else { slots.max(min_slots) };
        let needed = u64::try_from(asked).unwrap_or(u64::MAX).saturating_mul(slot_bytes);
        let refuse = |available: u64| StoreError::Budget {
            slots: asked,
            slot_bytes,
            needed,
            available,
            limit: budget.limit(),
        };
        if !explicit && slots < min_slots {
            return Err(refuse(available));
        }
        let charge =
            budget.charge("expert cache arena", needed).map_err(|e| refuse(e.available))?;
        let arena = Arena::new(asked, slot_bytes)?;
        Ok(Self { arena, _charge: charge })
    }

    /// The arena.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.arena.slots()
    }
}

/// A slot's state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Holds nothing.
    Free,
    /// A read job is filling it.
    Reading,
    /// Holds an expert.
    Ready,
    /// Its read failed; free once unpinned.
    Failed,
}

/// A failed read: which span, and why.
#[derive(Debug)]
pub struct ReadFailure {
    /// Shard index.
    pub file: usize,
    /// Absolute offset of the span.
    pub offset: u64,
    /// Length of the span.
    pub len: u64,
    /// The error.
    pub error: io::Error,
}

/// Bookkeeping of one slot.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) key: Key,
    pub(crate) state: SlotState,
    pub(crate) pins: u32,
    pub(crate) ticket: u64,
    /// The read job while reading, with the queue it went to.
    pub(crate) job: Option<(JobHandle, Priority)>,
    /// Filled by a prefetch and not yet demanded (or written off).
    pub(crate) prefetched: bool,
    pub(crate) failure: Option<ReadFailure>,
}

/// The mutable cache state, kept under the store's lock.
#[derive(Debug)]
pub(crate) struct CacheState {
    slots: Vec<Slot>,
    map: HashMap<Key, usize>,
    free: Vec<usize>,
    policy: Box<dyn Policy>,
    next_ticket: u64,
    prefetched: usize,
}

impl CacheState {
    pub(crate) fn new(slots: usize, kind: PolicyKind) -> Self {
        let slot = || Slot {
            key: 0,
            state: SlotState::Free,
            pins: 0,
            ticket: 0,
            job: None,
            prefetched: false,
            failure: None,
        };
        Self {
            slots: (0..slots).map(|_| slot()).collect(),
            map: HashMap::with_capacity(slots),
            free: (0..slots).rev().collect(),
            policy: new_policy(kind, slots),
            next_ticket: 1,
            prefetched: 0,
        }
    }

    /// The slot holding (or reading) `key`.
    pub(crate) fn lookup(&self, key: Key) -> Option<usize> {
        self.map.get(&key).copied()
    }

    pub(crate) fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.slots[i]
    }

    /// Slots currently holding an unused prefetch (reading or ready).
    pub(crate) fn prefetched(&self) -> usize {
        self.prefetched
    }

    pub(crate) fn pin(&mut self, i: usize) {
        self.slots[i].pins += 1;
    }

    /// Drops one pin; returns true when the slot became evictable or free (worth a wake-up).
    pub(crate) fn unpin(&mut self, i: usize) -> bool {
        let s = &mut self.slots[i];
        debug_assert!(s.pins > 0, "unpin of an unpinned slot");
        s.pins = s.pins.saturating_sub(1);
        if s.pins > 0 {
            return false;
        }
        if s.state == SlotState::Failed {
            s.state = SlotState::Free;
            s.failure = None;
            self.free.push(i);
        }
        true
    }

    /// Records a use of `i` by a request.
    pub(crate) fn touch(&mut self, i: usize) {
        self.policy.access(i);
    }

    /// Clears the unused-prefetch mark of `i`; returns whether it was set.
    pub(crate) fn clear_prefetched(&mut self, i: usize) -> bool {
        let was = std::mem::take(&mut self.slots[i].prefetched);
        if was {
            self.prefetched -= 1;
        }
        was
    }

    /// Takes a slot for `key` (free, or evicted per the policy) and marks it reading under a
    /// fresh ticket. A prefetch never evicts another unused prefetch. `None`: every slot is
    /// pinned, reading, or (for a prefetch) an unused prefetch.
    pub(crate) fn acquire(&mut self, key: Key, prefetch: bool) -> Option<(usize, u64)> {
        self.acquire_sparing(key, prefetch, &|_| false)
    }

    /// [`Self::acquire`], never evicting a slot whose key `spare` holds (`None` when only such
    /// slots could be evicted).
    pub(crate) fn acquire_sparing(
        &mut self,
        key: Key,
        prefetch: bool,
        spare: &dyn Fn(Key) -> bool,
    ) -> Option<(usize, u64)> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                let slots = &self.slots;
                let i = self.policy.victim(&mut |i| {
                    let s = &slots[i];
                    s.state == SlotState::Ready
                        && s.pins == 0
                        && !(prefetch && s.prefetched)
                        && !spare(s.key)
                })?;
                let old = self.slots[i].key;
                self.map.remove(&old);
                self.clear_prefetched(i);
                i
            }
        };
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let s = &mut self.slots[i];
        *s = Slot {
            key,
            state: SlotState::Reading,
            pins: 0,
            ticket,
            job: None,
            prefetched: prefetch,
            failure: None,
        };
        if prefetch {
            self.prefetched += 1;
        }
        self.map.insert(key, i);
        self.policy.insert(i, key);
        Some((i, ticket))
    }

    /// Gives reading slot `i` a fresh ticket (its job was cancelled and will be resubmitted).
    pub(crate) fn retarget(&mut self, i: usize) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.slots[i].ticket = ticket;
        ticket
    }

    /// The read of `i` under `ticket` ended. Success makes the slot ready; failure unmaps it
    /// and frees it (or marks it failed while waiters hold pins). Returns false for a stale
    /// ticket (the slot was reassigned meanwhile), which changes nothing.
    pub(crate) fn complete(
        &mut self,
        i: usize,
        ticket: u64,
        result: Result<(), ReadFailure>,
    ) -> bool {
        let s = &mut self.slots[i];
        if s.ticket != ticket || s.state != SlotState::Reading {
            return false;
        }
        s.job = None;
        match result {
            Ok(()) => s.state = SlotState::Ready,
            Err(f) => {
                let key = s.key;
                if s.pins > 0 {
                    s.state = SlotState::Failed;
                    s.failure = Some(f);
                } else {
                    s.state = SlotState::Free;
                    self.free.push(i);
                }
                self.map.remove(&key);
                self.clear_prefetched(i);
                self.policy.remove(i);
            }
        }
        true
    }

    /// Frees reading slot `i` whose job was cancelled before it started (no pins held).
    pub(crate) fn abandon(&mut self, i: usize, ticket: u64) {
        let s = &self.slots[i];
        if s.ticket != ticket || s.state != SlotState::Reading || s.pins > 0 {
            return;
        }
        let key = s.key;
        self.slots[i].state = SlotState::Free;
        self.slots[i].job = None;
        self.map.remove(&key);
        self.clear_prefetched(i);
        self.policy.remove(i);
        self.free.push(i);
    }

    /// Checks the invariants (tests and debug builds): the map and the slots agree, the free
    /// list holds exactly the free slots, and the prefetch count matches the marks.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (&k, &i) in &self.map {
            let s = &self.slots[i];
            if s.key != k || !matches!(s.state, SlotState::Reading | SlotState::Ready) {
                return Err(format!("map entry {k:#x} → slot {i} in state {:?}", s.state));
            }
        }
        let mapped =
            self.slots.iter().filter(|s| matches!(s.state, SlotState::Reading | SlotState::Ready));
        if mapped.count() != self.map.len() {
            return Err("a reading/ready slot is not mapped".into());
        }
        let mut free = self.free.clone();
        free.sort_unstable();
        let want: Vec<usize> =
            (0..self.slots.len()).filter(|&i| self.slots[i].state == SlotState::Free).collect();
        if free != want {
            return Err(format!("free list {free:?} but free slots {want:?}"));
        }
        if self.slots.iter().filter(|s| s.prefetched).count() != self.prefetched {
            return Err("prefetch count out of step".into());
        }
        Ok(())
    }

    /// Pins held over all slots.
    pub(crate) fn total_pins(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.pins)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eio() -> ReadFailure {
        ReadFailure { file: 0, offset: 0, len: 1, error: io::Error::from_raw_os_error(5) }
    }

    #[test]
    fn slots_move_through_reading_ready_failed_and_free() {
        let mut c = CacheState::new(2, PolicyKind::Lru);
        let (a, ta) = c.acquire(1, false).expect("free slot");
        let (b, tb) = c.acquire(2, true).expect("free slot");
        assert_eq!(c.prefetched(), 1);
        assert!(c.acquire(3, false).is_none(), "reading slots are never evicted");
        assert!(c.complete(a, ta, Ok(())));
        assert!(!c.complete(a, ta, Ok(())), "a second completion is stale");
        c.pin(a);
        assert!(c.acquire(3, false).is_none(), "pinned slots are never evicted");
        c.pin(b);
        assert!(c.complete(b, tb, Err(eio())));
        assert_eq!(c.slot(b).state, SlotState::Failed, "kept for its waiter");
        assert_eq!(c.lookup(2), None, "but unmapped at once");
        assert_eq!(c.prefetched(), 0);
        assert!(c.unpin(b));
        assert_eq!(c.slot(b).state, SlotState::Free);
        c.unpin(a);
        c.check().expect("consistent");
        let (d, _) = c.acquire(3, false).expect("the freed slot");
        assert_eq!(d, b);
        let (e, te) = c.acquire(4, true).expect("evicts the ready slot");
        assert_eq!((e, c.lookup(1)), (a, None));
        c.abandon(e, te);
        assert_eq!(c.slot(e).state, SlotState::Free);
        c.check().expect("consistent");
    }

    #[test]
    fn a_prefetch_never_evicts_an_unused_prefetch() {
        let mut c = CacheState::new(1, PolicyKind::S3Fifo);
        let (a, t) = c.acquire(1, true).expect("free");
        c.complete(a, t, Ok(()));
        assert!(c.acquire(2, true).is_none());
        assert!(c.acquire(2, false).is_some(), "a demand may");
    }

    #[test]
    fn sizing_refuses_with_the_numbers() {
        let b = MemoryBudget::new(10_000);
        let err = ExpertCache::new(4096, CacheSize::Available, 3, 100, &b).expect_err("3 × 4096");
        assert!(matches!(
            err,
            StoreError::Budget { slots: 3, needed: 12_288, available: 10_000, .. }
        ));
        let ok = ExpertCache::new(4096, CacheSize::Available, 2, 100, &b).expect("2 fit");
        assert_eq!((ok.slots(), b.used()), (2, 8192));
        assert!(ExpertCache::new(4096, CacheSize::Slots(0), 1, 100, &b).is_err());
    }
}
