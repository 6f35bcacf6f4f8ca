//! Guesses: prefetch reads of the experts a later layer is expected to demand, and their
//! settlement when that layer comes (recall, waste, cancellation, the gate's score; see
//! `gate`). A guess is read likeliest first while the cache has room for guesses, the rest as
//! the current layer's experts release their slots; it never evicts a pinned slot.

use super::shared::{add, Guess, Locked};
use super::StreamingExperts;
use crate::cache::SlotState;
use crate::policy::{key, Key};
use crate::reader::Priority;

impl StreamingExperts {
    /// Whether `id` is an expert of `layer` that holds no slot yet (neither cached nor being
    /// read): the experts a read-ahead or a guess may start reading.
    fn uncached(&self, st: &Locked, layer: usize, id: u32) -> bool {
        self.shared.index.get(layer, id).is_some() && st.cache.lookup(key(layer, id)).is_none()
    }

    /// [`crate::ExpertStore::read_ahead`]: demand reads of `layer`'s uncached `ids` into free or
    /// evictable slots (never a pinned or reading one, nor one holding an expert of `ids`),
    /// submitted at once. Not for a stream install, whose misses must first be fetched to local
    /// disk inside the demanding call.
    pub(super) fn read_now(&self, layer: usize, ids: &[u32]) {
        let sh = &*self.shared;
        if sh.disk.is_some() {
            return;
        }
        // The demand that follows pins `ids`' slots only when it runs: until then a slot
        // holding one of them (a hit, or a read this call started that already finished) is
        // evictable, and taking it would read an expert this very layer needs twice.
        let wanted: Vec<Key> = ids.iter().map(|&id| key(layer, id)).collect();
        let spare = |k: Key| wanted.contains(&k);
        let mut st = sh.lock();
        for &id in ids {
            if !self.uncached(&st, layer, id) {
                continue;
            }
            let Some((i, ticket)) = st.cache.acquire_sparing(key(layer, id), false, &spare) else {
                break;
            };
            self.submit(&mut st, i, ticket, (layer, id), Priority::Demand, None);
            if let Some(a) = st.ahead.get_mut(layer) {
                a.push(Guess { id, slot: i, ticket });
            }
        }
        drop(st);
        self.pool.kick();
    }

    /// The ids of `layer` whose reads a read-ahead started and whose slots still hold them
    /// (sorted), for the demand that takes them.
    pub(super) fn take_ahead(&self, st: &mut Locked, layer: usize) -> Vec<u32> {
        let Some(started) = st.ahead.get_mut(layer).map(std::mem::take) else {
            return Vec::new();
        };
        let mut ids: Vec<u32> = started
            .into_iter()
            .filter(|g| st.cache.slot(g.slot).ticket == g.ticket)
            .map(|g| g.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Settles the outstanding guesses for `layer` against the demanded `ids`: recall, waste,
    /// cancellation of unstarted wrong guesses. Returns the demanded ids a prefetch covered,
    /// sorted.
    pub(super) fn settle(&self, st: &mut Locked, layer: usize, ids: &[u32]) -> Vec<u32> {
        let Some(guesses) = st.guesses.get_mut(layer).map(std::mem::take) else {
            return Vec::new();
        };
        let c = &self.shared.counters;
        let mut covered = Vec::new();
        let mut wasted = 0u64;
        let issued = guesses.len() as u64;
        for g in guesses {
            let s = st.cache.slot(g.slot);
            let live =
                s.ticket == g.ticket && matches!(s.state, SlotState::Reading | SlotState::Ready);
            let bytes = self.shared.index.get(layer, g.id).map_or(0, |l| l.read_bytes());
            if ids.contains(&g.id) && live {
                st.cache.clear_prefetched(g.slot);
                covered.push(g.id);
            } else if live
                && s.state == SlotState::Reading
                && s.pins == 0
                && s.job.as_ref().is_some_and(|(h, _)| h.cancel())
            {
                st.cache.abandon(g.slot, g.ticket);
                add(&c.prefetch_cancelled, 1);
            } else {
                // Read (or being read) for nothing, or evicted before its layer came.
                wasted += bytes;
                if live {
                    st.cache.clear_prefetched(g.slot);
                }
            }
        }
        let n = covered.len() as u64;
        let (guessed, hits) = st.gates[layer].settle(ids, issued, n);
        let index = &self.shared.index;
        let demanded_bytes: u64 =
            ids.iter().filter_map(|&id| index.get(layer, id)).map(|l| l.bytes()).sum();
        if let Some(l) = st.layers.get_mut(layer) {
            l.demanded += ids.len() as u64;
            l.covered += n;
            l.wasted_bytes += wasted;
            l.passes += 1;
            l.demanded_bytes += demanded_bytes;
            l.guessed += guessed;
            l.guess_hits += hits;
        }
        add(&c.prefetch_used, n);
        add(&c.prefetch_wasted_bytes, wasted);
        covered.sort_unstable();
        covered
    }

    /// Queues prefetch reads for the guess `ids` of `layer`, as far as the gate, the prefetch
    /// cap and the evictable slots allow (a guess never evicts a pinned or unused-prefetch
    /// slot). With the gate shut the guess is only kept as a shadow to be scored.
    pub(super) fn guess(&self, st: &mut Locked, layer: usize, ids: &[u32]) -> usize {
        let sh = &*self.shared;
        if sh.index.experts(layer) == 0 || sh.max_prefetch == 0 || layer >= st.gates.len() {
            return ids.len();
        }
        if !st.gates[layer].open(sh.min_precision) {
            // Only guesses that would be read are scored: an already cached guess costs
            // nothing, and counting it would credit the predictor with the cache's hits.
            let scored: Vec<u32> =
                ids.iter().copied().filter(|&id| self.uncached(st, layer, id)).collect();
            st.layers[layer].gated += scored.len() as u64;
            st.gates[layer].shadow(&scored);
            // All of `ids` is dealt with: none of it may be read later.
            return ids.len();
        }
        self.issue(st, layer, ids)
    }

    /// Queues reads of the guess `ids` for `layer` (the gate is open), in order, while the
    /// cache has room for guesses; returns how many of `ids` it dealt with (read, cached or
    /// invalid): the rest waits for room.
    pub(super) fn issue(&self, st: &mut Locked, layer: usize, ids: &[u32]) -> usize {
        let sh = &*self.shared;
        for (n, &id) in ids.iter().enumerate() {
            if !self.uncached(st, layer, id) {
                continue;
            }
            if st.cache.prefetched() >= sh.max_prefetch {
                return n;
            }
            // A guess is never fetched remotely: only experts already on local disk.
            let pin = match &sh.disk {
                Some(d) => match d.try_pin(layer, id) {
                    Some(p) => Some(p),
                    None => continue,
                },
                None => None,
            };
            let Some((i, ticket)) = st.cache.acquire(key(layer, id), true) else { return n };
            self.submit(st, i, ticket, (layer, id), Priority::Prefetch, pin);
            st.guesses[layer].push(Guess { id, slot: i, ticket });
            st.layers[layer].issued += 1;
            add(&sh.counters.prefetch_issued, 1);
        }
        ids.len()
    }
}
