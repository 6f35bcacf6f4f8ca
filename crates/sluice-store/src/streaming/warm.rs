//! Warm starts on the streaming store: the hot set it has seen (how often each expert was
//! demanded) and reading a saved hot set back in the background.
//!
//! The warm reads go to the readers' prefetch queue, which a reader takes from only when no
//! demand read is queued (in the pread pool and in io_uring alike), so the first token's reads
//! overtake every warm read that has not started; a warm read still queued when its expert is
//! demanded is moved to the demand queue (as a queued guess is). At most half the slots are
//! filled this way (the share guesses may hold), so a pass always finds room. A warm entry
//! enters the replacement policy as used once (it was hot before the restart), so a prefill's
//! one-time reads do not push it out before it is asked for; otherwise it is an ordinary cached
//! expert that the policy evicts like any other.

use std::sync::atomic::Ordering;

use super::StreamingExperts;
use crate::hotset::HotSet;
use crate::policy::key;
use crate::reader::Priority;

impl StreamingExperts {
    /// The experts demanded so far, per layer, most used first.
    pub fn hot_set(&self) -> HotSet {
        let layers = self
            .shared
            .uses
            .iter()
            .map(|u| {
                let mut v: Vec<(u32, u64)> = u
                    .iter()
                    .enumerate()
                    .filter_map(|(id, n)| {
                        let n = n.load(Ordering::Relaxed);
                        (n > 0).then(|| (u32::try_from(id).unwrap_or(u32::MAX), n))
                    })
                    .collect();
                v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                v
            })
            .collect();
        HotSet { layers }
    }

    /// Most warm reads [`StreamingExperts::warm`] starts: half the slots.
    pub fn warm_limit(&self) -> usize {
        self.shared.cache.slots() / 2
    }

    /// Starts background reads of `order`'s experts (most wanted first) into free or
    /// evictable slots, up to [`StreamingExperts::warm_limit`]; returns how many started.
    /// Experts already cached or being read, and ids the index does not have, are skipped. A
    /// stream install reads nothing (its experts may not be on local disk).
    pub fn warm(&self, order: &[(usize, u32)]) -> usize {
        let sh = &*self.shared;
        if sh.disk.is_some() {
            return 0;
        }
        let limit = self.warm_limit();
        let mut started = 0;
        let mut st = sh.lock();
        for &(layer, id) in order {
            if started >= limit {
                break;
            }
            if sh.index.get(layer, id).is_none() || st.cache.lookup(key(layer, id)).is_some() {
                continue;
            }
            let Some((i, ticket)) = st.cache.acquire(key(layer, id), false) else { break };
            self.submit(&mut st, i, ticket, (layer, id), Priority::Prefetch, None);
            // Known hot: counted as used once, so S3-FIFO moves it to the main queue instead of
            // evicting it with the one-time reads of the first prefill.
            st.cache.touch(i);
            started += 1;
        }
        drop(st);
        self.pool.kick();
        started
    }
}
