//! The disk cache's table of experts on local disk or being fetched, with the evictable ones
//! (present and unpinned) also kept in a set ordered by last use, so eviction finds its victim
//! in O(log n) instead of scanning every entry. Every change to an entry goes through
//! [`Entries::update`], which keeps the set and the pinned count in step with the map.

use std::collections::{BTreeSet, HashMap};

/// (layer, expert).
pub(super) type Key = (usize, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EntryState {
    /// Reserved in the budget, being fetched by one `localize` call.
    Fetching,
    /// Recorded present in the log.
    Present,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) state: EntryState,
    pub(super) bytes: u64,
    pub(super) pins: u32,
    /// Clock value of the last use (the eviction order).
    pub(super) stamp: u64,
    pub(super) sha256: String,
}

/// Every entry, plus the eviction order of the evictable ones.
#[derive(Debug, Default)]
pub(super) struct Entries {
    map: HashMap<Key, Entry>,
    /// `(stamp, key)` of every present entry without pins, oldest first.
    evictable: BTreeSet<(u64, Key)>,
    /// Entries with at least one pin.
    pinned: usize,
}

/// Takes entry `e` of `k` out of the order and the pinned count (before a change).
fn unindex(evictable: &mut BTreeSet<(u64, Key)>, pinned: &mut usize, k: Key, e: &Entry) {
    if e.pins > 0 {
        *pinned -= 1;
    } else if e.state == EntryState::Present {
        evictable.remove(&(e.stamp, k));
    }
}

/// Puts entry `e` of `k` back into the order and the pinned count (after a change).
fn index(evictable: &mut BTreeSet<(u64, Key)>, pinned: &mut usize, k: Key, e: &Entry) {
    if e.pins > 0 {
        *pinned += 1;
    } else if e.state == EntryState::Present {
        evictable.insert((e.stamp, k));
    }
}

impl Entries {
    /// The entry of `k`.
    pub(super) fn get(&self, k: &Key) -> Option<&Entry> {
        self.map.get(k)
    }

    /// Every entry.
    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.map.values()
    }

    /// Inserts (or replaces) the entry of `k`.
    pub(super) fn insert(&mut self, k: Key, e: Entry) {
        self.remove(&k);
        index(&mut self.evictable, &mut self.pinned, k, &e);
        self.map.insert(k, e);
    }

    /// Removes the entry of `k`.
    pub(super) fn remove(&mut self, k: &Key) -> Option<Entry> {
        let e = self.map.remove(k)?;
        unindex(&mut self.evictable, &mut self.pinned, *k, &e);
        Some(e)
    }

    /// Applies `f` to the entry of `k`, keeping the eviction order and pinned count right.
    pub(super) fn update<R>(&mut self, k: Key, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let e = self.map.get_mut(&k)?;
        unindex(&mut self.evictable, &mut self.pinned, k, e);
        let r = f(e);
        index(&mut self.evictable, &mut self.pinned, k, e);
        Some(r)
    }

    /// Removes and returns the least recently used present, unpinned entry.
    pub(super) fn pop_lru(&mut self) -> Option<(Key, Entry)> {
        let (_, k) = self.evictable.pop_first()?;
        let e = self.map.remove(&k)?;
        Some((k, e))
    }

    /// True when some entry is pinned.
    pub(super) fn any_pinned(&self) -> bool {
        self.pinned > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(stamp: u64, pins: u32) -> Entry {
        Entry { state: EntryState::Present, bytes: 10, pins, stamp, sha256: String::new() }
    }

    #[test]
    fn eviction_order_follows_stamps_and_skips_pinned_and_fetching_entries() {
        let mut t = Entries::default();
        t.insert((0, 1), present(5, 0));
        t.insert((0, 2), present(3, 1));
        t.insert((0, 3), present(7, 0));
        t.insert(
            (0, 4),
            Entry {
                state: EntryState::Fetching,
                bytes: 1,
                pins: 1,
                stamp: 0,
                sha256: String::new(),
            },
        );
        assert!(t.any_pinned());
        // Re-using (0, 1) makes it the newest.
        t.update((0, 1), |e| e.stamp = 9).expect("present");
        assert_eq!(t.pop_lru().map(|(k, _)| k), Some((0, 3)));
        // Unpinning (0, 2) makes it evictable at its old stamp.
        t.update((0, 2), |e| e.pins -= 1).expect("present");
        assert_eq!(t.pop_lru().map(|(k, _)| k), Some((0, 2)));
        assert_eq!(t.pop_lru().map(|(k, _)| k), Some((0, 1)));
        assert!(t.pop_lru().is_none(), "the fetching entry is never a victim");
        t.update((0, 4), |e| {
            e.state = EntryState::Present;
            e.pins = 0;
        });
        assert!(!t.any_pinned());
        assert!(t.remove(&(0, 4)).is_some());
        assert!(t.pop_lru().is_none());
    }
}
