//! Replacement policies for the expert cache, over slot indices.
//!
//! Routed-expert traffic is a cyclic sweep over layers in which each layer picks 16 of 896
//! experts per position, with a popularity skew that differs per layer. Plain LRU treats a
//! one-off expert like a popular one: every miss pushes the least recently used entry out,
//! however often it was used before. [`S3Fifo`] (Yang et al., "FIFO queues are all you need
//! for cache eviction", SOSP 2023) sends new entries through a small probationary FIFO, keeps
//! entries that were re-used there in a main FIFO with a small use counter (second chance), and
//! remembers recently evicted keys in a ghost queue so that an expert that returns soon goes
//! straight to the main queue. On uniform routing no policy can beat the capacity ratio, and
//! S3-FIFO then matches LRU; on skewed routing it keeps the popular experts. [`simulate`] runs a
//! trace through a policy so the choice is measured (`tests/policy_sim.rs` prints the numbers).
//!
//! The cache calls [`Policy::victim`] with a predicate saying which slots may be evicted (not
//! pinned, not being read); the policy skips the others without losing them.

use std::collections::{HashMap, VecDeque};

/// A cache key: layer in the high 32 bits, expert id in the low 32.
pub type Key = u64;

/// The key of expert `expert` of `layer`.
pub fn key(layer: usize, expert: u32) -> Key {
    ((layer as u64) << 32) | u64::from(expert)
}

/// Which replacement policy the cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// S3-FIFO: small probationary FIFO, main FIFO with second chances, ghost queue.
    #[default]
    S3Fifo,
}

/// A replacement policy over `0..slots`.
pub trait Policy: Send + std::fmt::Debug {
    /// `slot` now holds `key` (a miss filled it, or a prefetch started filling it).
    fn insert(&mut self, slot: usize, key: Key);
    /// `slot` was used again (a hit).
    fn access(&mut self, slot: usize);
    /// `slot` left the cache other than by eviction (its read failed or was cancelled).
    fn remove(&mut self, slot: usize);
    /// Chooses a slot to evict among those for which `evictable` is true, forgets it and
    /// returns it; `None` when no slot may be evicted.
    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize>;
}

/// A new policy of `kind` for `slots` slots.
pub fn new_policy(kind: PolicyKind, slots: usize) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Lru => Box::new(Lru::new(slots)),
        PolicyKind::S3Fifo => Box::new(S3Fifo::new(slots)),
    }
}

const NIL: usize = usize::MAX;

/// Least recently used, as an intrusive doubly linked list over slots (O(1) per operation).
#[derive(Debug)]
pub struct Lru {
    prev: Vec<usize>,
    next: Vec<usize>,
    linked: Vec<bool>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
}

impl Lru {
    /// An empty LRU over `slots` slots.
    pub fn new(slots: usize) -> Self {
        Self {
            prev: vec![NIL; slots],
            next: vec![NIL; slots],
            linked: vec![false; slots],
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, s: usize) {
        if !self.linked[s] {
            return;
        }
        let (p, n) = (self.prev[s], self.next[s]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n] = p
        }
        self.linked[s] = false;
    }

    fn push_front(&mut self, s: usize) {
        self.prev[s] = NIL;
        self.next[s] = self.head;
        if self.head == NIL {
            self.tail = s
        } else {
            self.prev[self.head] = s
        }
        self.head = s;
        self.linked[s] = true;
    }
}

impl Policy for Lru {
    fn insert(&mut self, slot: usize, _key: Key) {
        self.unlink(slot);
        self.push_front(slot);
    }

    fn access(&mut self, slot: usize) {
        self.insert(slot, 0);
    }

    fn remove(&mut self, slot: usize) {
        self.unlink(slot);
    }

    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize> {
        let mut s = self.tail;
        while s != NIL {
            if evictable(s) {
                self.unlink(s);
                return Some(s);
            }
            s = self.prev[s];
        }
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    None,
    Small,
    Main,
}

/// Adaptive S3-FIFO over slots (see the module docs).
#[derive(Debug)]
pub struct S3Fifo {
    small: VecDeque<usize>,
    main: VecDeque<usize>,
    queue: Vec<Queue>,
    freq: Vec<u8>,
    keys: Vec<Key>,
    /// Size the small queue is kept at; moves between `small_min` and `small_max`.
    small_target: usize,
    small_min: usize,
    small_max: usize,
    /// Recently evicted keys (oldest first) with a stamp, so stale duplicates are skipped.
    ghost: VecDeque<(Key, u64)>,
    /// Live ghost entries: stamp and the queue the key was evicted from.
    ghost_of: HashMap<Key, (u64, Queue)>,
    /// Live ghost entries evicted from the small and from the main queue.
    ghost_counts: [usize; 2],
    ghost_cap: usize,
    stamp: u64,
}

/// Uses an entry needs while in the small queue to be promoted to the main queue.
const PROMOTE_AT: u8 = 1;
/// Cap of the per-entry use counter.
const MAX_FREQ: u8 = 3;
/// Small-queue target at start, and its bounds, in percent of the slots.
const SMALL_PERCENT: (usize, usize, usize) = (10, 1, 30);
/// Ghost keys remembered, as a multiple of the slots (keys are 8 bytes; experts are not).
const GHOST_FACTOR: usize = 2;

impl S3Fifo {
    /// An empty S3-FIFO over `slots` slots.
    pub fn new(slots: usize) -> Self {
        let pct = |p: usize| (slots * p / 100).max(1);
        Self {
            small: VecDeque::new(),
            main: VecDeque::new(),
            queue: vec![Queue::None; slots],
            freq: vec![0; slots],
            keys: vec![0; slots],
            small_target: pct(SMALL_PERCENT.0),
            small_min: pct(SMALL_PERCENT.1),
            small_max: pct(SMALL_PERCENT.2),
            ghost: VecDeque::new(),
            ghost_of: HashMap::new(),
            ghost_counts: [0; 2],
            ghost_cap: (slots * GHOST_FACTOR).max(1),
            stamp: 0,
        }
    }

    /// The small queue's current target size.
    pub fn small_target(&self) -> usize {
        self.small_target
    }

    fn ghost_index(q: Queue) -> usize {
        usize::from(q == Queue::Main)
    }

    fn remember(&mut self, key: Key, from: Queue) {
        self.stamp += 1;
        self.ghost.push_back((key, self.stamp));
        if let Some((_, old)) = self.ghost_of.insert(key, (self.stamp, from)) {
            self.ghost_counts[Self::ghost_index(old)] -= 1;
        }
        self.ghost_counts[Self::ghost_index(from)] += 1;
        while self.ghost_of.len() > self.ghost_cap || self.ghost.len() > 2 * self.ghost_cap {
            let Some((k, stamp)) = self.ghost.pop_front() else { break };
            if let Some(&(live, q)) = self.ghost_of.get(&k) {
                if live == stamp {
                    self.ghost_of.remove(&k);
                    self.ghost_counts[Self::ghost_index(q)] -= 1;
                }
            }
        }
    }

    /// A returning key says which queue was too small (as in ARC): one evicted from the small
    /// queue before its re-use asks for a bigger small queue, one evicted from the main queue
    /// for a bigger main queue. Steps are weighted by the other ghost's size.
    fn adapt(&mut self, from: Queue) {
        let [gs, gm] = self.ghost_counts;
        if from == Queue::Small {
            let step = (gm / gs.max(1)).max(1);
            self.small_target = (self.small_target + step).min(self.small_max);
        } else {
            let step = (gs / gm.max(1)).max(1);
            self.small_target = self.small_target.saturating_sub(step).max(self.small_min);
        }
    }
}

impl Policy for S3Fifo {
    fn insert(&mut self, slot: usize, key: Key) {
        self.remove(slot);
        self.freq[slot] = 0;
        self.keys[slot] = key;
        if let Some((_, from)) = self.ghost_of.remove(&key) {
            self.ghost_counts[Self::ghost_index(from)] -= 1;
            self.adapt(from);
            self.queue[slot] = Queue::Main;
            self.main.push_back(slot);
        } else {
            self.queue[slot] = Queue::Small;
            self.small.push_back(slot);
        }
    }

    fn access(&mut self, slot: usize) {
        self.freq[slot] = (self.freq[slot] + 1).min(MAX_FREQ);
    }

    fn remove(&mut self, slot: usize) {
        match self.queue[slot] {
            Queue::None => {}
            Queue::Small => self.small.retain(|&s| s != slot),
            Queue::Main => self.main.retain(|&s| s != slot),
        }
        self.queue[slot] = Queue::None;
    }

    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize> {
        // Entries that may not be evicted now are rotated to the back of their queue; after a
        // full round of such skips in both queues, nothing is evictable.
        let (mut skip_small, mut skip_main) = (0usize, 0usize);
        // Each main entry can be decremented at most MAX_FREQ times before it is evictable or
        // skipped, which bounds the loop.
        let mut fuel = (self.small.len() + self.main.len() + 1) * (usize::from(MAX_FREQ) + 2);
        while fuel > 0 {
            fuel -= 1;
            // The small queue is used at or above its target size, or when every main entry
            // has been skipped.
            let small_turn = (self.small.len() >= self.small_target
                || self.main.len() == skip_main)
                && skip_small < self.small.len();
            if small_turn {
                let Some(t) = self.small.pop_front() else { continue };
                if self.freq[t] >= PROMOTE_AT {
                    self.freq[t] = 0;
                    self.queue[t] = Queue::Main;
                    self.main.push_back(t);
                    skip_main = 0;
                } else if evictable(t) {
                    self.queue[t] = Queue::None;
                    self.remember(self.keys[t], Queue::Small);
                    return Some(t);
                } else {
                    self.small.push_back(t);
                    skip_small += 1;
                }
            } else if skip_main < self.main.len() {
                let Some(t) = self.main.pop_front() else { continue };
                if self.freq[t] > 0 {
                    self.freq[t] -= 1;
                    self.main.push_back(t);
                } else if evictable(t) {
                    self.queue[t] = Queue::None;
                    self.remember(self.keys[t], Queue::Main);
                    return Some(t);
                } else {
                    self.main.push_back(t);
                    skip_main += 1;
                }
            } else {
                return None;
            }
        }
        None
    }
}

/// Hits and misses of one simulated trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimResult {
    /// Accesses that found their key cached.
    pub hits: u64,
    /// Accesses that did not.
    pub misses: u64,
}

impl SimResult {
    /// `hits / (hits + misses)`, 0 for an empty trace.
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

/// Runs `trace` through a cache of `slots` slots under `kind` (every slot evictable, as in a
/// cache whose reads are instantaneous).
pub fn simulate(kind: PolicyKind, slots: usize, trace: impl IntoIterator<Item = Key>) -> SimResult {
    simulate_each(kind, slots, trace, |_, _| {})
}

/// [`simulate`], calling `seen(key, hit)` for every access (per-layer or per-phase hit rates of
/// a replayed route trace).
pub fn simulate_each(
    kind: PolicyKind,
    slots: usize,
    trace: impl IntoIterator<Item = Key>,
    mut seen: impl FnMut(Key, bool),
) -> SimResult {
    let mut policy = new_policy(kind, slots);
    let mut where_: HashMap<Key, usize> = HashMap::new();
    let mut holder: Vec<Option<Key>> = vec![None; slots];
    let mut free: Vec<usize> = (0..slots).rev().collect();
    let mut r = SimResult::default();
    for k in trace {
        if let Some(&s) = where_.get(&k) {
            r.hits += 1;
            policy.access(s);
            seen(k, true);
            continue;
        }
        r.misses += 1;
        seen(k, false);
        let slot = match free.pop() {
            Some(s) => s,
            None => match policy.victim(&mut |_| true) {
                Some(v) => {
                    if let Some(old) = holder[v].take() {
                        where_.remove(&old);
                    }
                    v
                }
                None => continue,
            },
        };
        holder[slot] = Some(k);
        where_.insert(k, slot);
        policy.insert(slot, k);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(p: &mut dyn Policy, n: usize) {
        for s in 0..n {
            p.insert(s, s as Key);
        }
    }

    #[test]
    fn lru_evicts_the_least_recently_used_evictable_slot() {
        let mut p = Lru::new(4);
        fill(&mut p, 4);
        p.access(0);
        assert_eq!(p.victim(&mut |s| s != 1), Some(2), "1 is pinned, 2 is next oldest");
        assert_eq!(p.victim(&mut |_| true), Some(1));
        p.remove(3);
        assert_eq!(p.victim(&mut |_| true), Some(0));
        assert_eq!(p.victim(&mut |_| true), None);
    }

    #[test]
    fn s3fifo_skips_pinned_slots_and_gives_up_when_none_is_evictable() {
        for kind in [PolicyKind::Lru, PolicyKind::S3Fifo] {
            let mut p = new_policy(kind, 3);
            fill(p.as_mut(), 3);
            p.access(1);
            assert_eq!(p.victim(&mut |_| false), None, "{kind:?}");
            let v = p.victim(&mut |s| s == 2).expect("2 is evictable");
            assert_eq!(v, 2, "{kind:?}");
            // The skipped slots are still known to the policy.
            let mut left = vec![p.victim(&mut |_| true), p.victim(&mut |_| true)];
            left.sort();
            assert_eq!(left, vec![Some(0), Some(1)], "{kind:?}");
        }
    }

    #[test]
    fn s3fifo_keeps_a_reused_key_over_one_off_keys() {
        let mut p = S3Fifo::new(10);
        fill(&mut p, 10);
        p.access(3);
        // Evict nine one-off keys through a stream of new ones; slot 3 must survive.
        for k in 0..9u64 {
            let v = p.victim(&mut |_| true).expect("victim");
            assert_ne!(v, 3, "reused entry evicted after {k} evictions");
            p.insert(v, 100 + k);
        }
    }

    #[test]
    fn a_returning_ghost_goes_to_the_main_queue_and_adapts_the_small_queue() {
        let mut p = S3Fifo::new(100);
        fill(&mut p, 100);
        let start = p.small_target();
        let v = p.victim(&mut |_| true).expect("victim");
        // The evicted key returns soon: the small queue was too small.
        p.insert(v, v as Key);
        assert_eq!(p.queue[v], Queue::Main);
        assert!(p.small_target() > start);
    }

    #[test]
    fn simulation_counts_hits() {
        let r = simulate(PolicyKind::Lru, 2, [1, 2, 1, 3, 1, 2]);
        assert_eq!((r.hits, r.misses), (2, 4));
        assert!((r.hit_rate() - 1.0 / 3.0).abs() < 1e-12);
    }
}
