//! Conversation-state reuse: keep the sequence state of recent requests and resume a new request
//! from the longest token prefix it shares with one of them.
//!
//! A chat client re-sends the whole conversation every turn, so turn n+1's prompt starts with
//! turn n's prompt (and, when the reply re-tokenizes to the ids the model produced, with its
//! reply). Re-running that prefix is the dominant cost of a follow-up turn; resuming from a stored
//! state skips it. Sequence state cannot be truncated (the KDA recurrence is a running
//! matrix), so a stored state is usable only for prompts that extend *its* tokens. To serve
//! prompts that diverge mid-history (an edited message, a regenerated reply), each entry keeps
//! **snapshots** of the state at several positions (every `checkpoint_every` prompt tokens, at the
//! end of the prompt, and at the end of generation). A new request resumes from the latest
//! snapshot at or before its common prefix with the entry.
//!
//! Snapshots are [`StateSnapshot`]s, not clones of the live state: they hold only the committed
//! KDA states and the committed cache rows, and the snapshots of one conversation share their
//! cache rows, so a chain costs one copy of the rows plus one KDA state per snapshot.
//!
//! A snapshot taken after a prefill pass also keeps that pass's last-row logits (the prediction
//! for the next position), so a prompt that matches a snapshot exactly needs no pass at all before
//! its first token; a snapshot without logits (the state after generation, whose last token was
//! never fed, or a checkpoint captured inside a prefill pass, which computes only its last row's
//! logits: [`crate::prefill_pass`]) must leave at least one prompt token to feed.
//!
//! Resuming is exact: the model's passes are batch-invariant, so the state after
//! `prefix + rest` fed in any split equals the state after one pass over both, bit for bit
//! (tested in `tests/session.rs`), and a restored snapshot continues bit-identically. Snapshots
//! are shared (`Arc`) between the entries that contain them; memory is bounded by a byte budget
//! over distinct allocations (snapshot parts, logits) and the token lists, and entries are evicted
//! least recently used first.

use crate::state_cache::StateCache;
use sluice_models::StateSnapshot;
use std::collections::HashSet;
use std::sync::Arc;

/// What the cache needs of a stored state ([`StateSnapshot`] in the engine; a stand-in in tests).
pub trait SessionState {
    /// Committed positions.
    fn positions(&self) -> usize;
    /// Calls `f(id, bytes)` for every allocation held; shared allocations have equal ids.
    fn for_each_part(&self, f: &mut dyn FnMut(usize, usize));
}

impl SessionState for StateSnapshot {
    fn positions(&self) -> usize {
        self.len()
    }
    fn for_each_part(&self, f: &mut dyn FnMut(usize, usize)) {
        StateSnapshot::for_each_part(self, f);
    }
}

/// Limits of a [`SessionCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Snapshot the state every this many prompt positions (0: only at the end of the prompt and
    /// of generation). Smaller values serve mid-history divergence better but cost a state clone
    /// per snapshot and split the prefill into more passes.
    pub checkpoint_every: usize,
    /// Most bytes held (distinct snapshot parts and logits, plus 4 bytes per stored token).
    pub max_bytes: usize,
    /// Most conversations kept.
    pub max_entries: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self { checkpoint_every: 512, max_bytes: 1 << 30, max_entries: 32 }
    }
}

/// The state after the first `pos` tokens of an entry, with the logits predicting position `pos`
/// when they were computed.
#[derive(Debug)]
pub struct Snapshot<S = StateSnapshot> {
    pos: usize,
    state: Arc<S>,
    logits: Option<Arc<[f32]>>,
}

impl<S> Clone for Snapshot<S> {
    fn clone(&self) -> Self {
        Self { pos: self.pos, state: Arc::clone(&self.state), logits: self.logits.clone() }
    }
}

impl<S: SessionState> Snapshot<S> {
    /// A snapshot of `state` (which holds `state.len()` positions), with the logits of its last
    /// position when known.
    pub fn new(state: S, logits: Option<Vec<f32>>) -> Self {
        Self::shared(Arc::new(state), logits)
    }

    /// A snapshot of a state the caller keeps a handle to (the base of its next snapshot).
    pub fn shared(state: Arc<S>, logits: Option<Vec<f32>>) -> Self {
        Self::shared_logits(state, logits.map(Arc::from))
    }

    /// [`Snapshot::shared`] with logits the caller shares too (with the state cache's writer).
    pub fn shared_logits(state: Arc<S>, logits: Option<Arc<[f32]>>) -> Self {
        Self { pos: state.positions(), state, logits }
    }

    /// Positions in the state.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes this snapshot references (shared parts included).
    pub fn byte_len(&self) -> usize {
        let mut total = self.logits.as_ref().map_or(0, |l| l.len() * 4);
        self.state.for_each_part(&mut |_, b| total += b);
        total
    }
}

/// Where a request starts: the snapshot holding the first `reused` prompt tokens.
#[derive(Debug)]
pub struct Resume<S = StateSnapshot> {
    /// The snapshot to restore (`None`: start from a fresh state).
    pub from: Option<Arc<S>>,
    /// Prompt tokens already in `state`.
    pub reused: usize,
    /// The logits predicting position `reused` when the snapshot kept them.
    pub logits: Option<Arc<[f32]>>,
    /// Snapshots of the source entry up to `reused`: still valid for the new entry.
    pub chain: Chain<S>,
}

/// Snapshots a [`Resume`] carries from its source entry into [`SessionCache::store`].
#[derive(Debug)]
pub struct Chain<S = StateSnapshot>(Vec<Snapshot<S>>);

impl<S> Resume<S> {
    /// A fresh start: nothing reused.
    pub fn fresh() -> Self {
        Self { from: None, reused: 0, logits: None, chain: Chain::empty() }
    }
}

impl<S> Chain<S> {
    /// No snapshots (a fresh start).
    pub fn empty() -> Self {
        Self(Vec::new())
    }

    /// Positions of the snapshots.
    pub fn positions(&self) -> Vec<usize> {
        self.0.iter().map(|s| s.pos).collect()
    }

    /// Adds a snapshot of a later prefix of the same prompt (one restored from disk).
    pub fn push(&mut self, s: Snapshot<S>) {
        self.0.push(s);
    }
}

#[derive(Debug)]
struct Entry<S> {
    tokens: Vec<u32>,
    snaps: Vec<Snapshot<S>>,
    last_used: u64,
}

/// Stored conversation states, looked up by longest common token prefix.
#[derive(Debug)]
pub struct SessionCache<S = StateSnapshot> {
    cfg: SessionConfig,
    entries: Vec<Entry<S>>,
    clock: u64,
    /// The on-disk prompt-state cache behind this one, when configured.
    disk: Option<Arc<StateCache>>,
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<S: SessionState> SessionCache<S> {
    /// An empty cache.
    pub fn new(cfg: SessionConfig) -> Self {
        Self { cfg, entries: Vec::new(), clock: 0, disk: None }
    }

    /// This cache backed by the on-disk prompt-state cache `disk`: requests restore from it what
    /// memory does not hold, and their snapshots are written to it ([`crate::turn`]).
    #[must_use]
    pub fn with_disk(mut self, disk: Option<Arc<StateCache>>) -> Self {
        self.disk = disk;
        self
    }

    /// The on-disk cache, when configured.
    pub fn disk(&self) -> Option<&Arc<StateCache>> {
        self.disk.as_ref()
    }

    /// The limits.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// Number of conversations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Bytes held: distinct snapshot parts and logits, plus token lists.
    pub fn bytes(&self) -> usize {
        self.bytes_with(&[])
    }

    /// [`Self::bytes`] counting the snapshots of `extra` too (each distinct part once).
    fn bytes_with(&self, extra: &[&[Snapshot<S>]]) -> usize {
        let mut seen = HashSet::new();
        let mut total = 0;
        let mut add = |s: &Snapshot<S>, total: &mut usize| {
            if let Some(l) = &s.logits {
                if seen.insert(l.as_ptr() as usize) {
                    *total += l.len() * 4;
                }
            }
            s.state.for_each_part(&mut |id, b| {
                if seen.insert(id) {
                    *total += b;
                }
            });
        };
        for e in &self.entries {
            total += e.tokens.len() * 4;
            for s in &e.snaps {
                add(s, &mut total);
            }
        }
        for s in extra.iter().flat_map(|g| g.iter()) {
            add(s, &mut total);
        }
        total
    }

    /// Snapshots held (distinct).
    pub fn snapshots(&self) -> usize {
        let mut seen = HashSet::new();
        self.entries
            .iter()
            .flat_map(|e| &e.snaps)
            .filter(|s| seen.insert(Arc::as_ptr(&s.state)))
            .count()
    }

    /// The best starting point for `prompt`: the latest usable snapshot over all entries, or
    /// none with nothing reused. A snapshot with logits may cover the whole prompt; one without
    /// must leave at least one token to feed.
    pub fn resume(&mut self, prompt: &[u32]) -> Resume<S> {
        let mut best: Option<(usize, usize)> = None;
        for (ei, e) in self.entries.iter().enumerate() {
            let common = common_prefix(&e.tokens, prompt);
            for (si, s) in e.snaps.iter().enumerate() {
                let limit = if s.logits.is_some() {
                    common
                } else {
                    common.min(prompt.len().saturating_sub(1))
                };
                let better = best.is_none_or(|(bi, bs)| s.pos > self.entries[bi].snaps[bs].pos);
                if s.pos > 0 && s.pos <= limit && better {
                    best = Some((ei, si));
                }
            }
        }
        let Some((ei, si)) = best else {
            return Resume::fresh();
        };
        self.clock += 1;
        let e = &mut self.entries[ei];
        e.last_used = self.clock;
        let snap = &e.snaps[si];
        let chain = Chain(e.snaps.iter().filter(|s| s.pos <= snap.pos).cloned().collect());
        Resume {
            from: Some(Arc::clone(&snap.state)),
            reused: snap.pos,
            logits: snap.logits.clone(),
            chain,
        }
    }

    /// Whether a state of `bytes` could be kept at all (callers skip cloning states that could
    /// not).
    pub fn fits(&self, bytes: usize) -> bool {
        bytes <= self.cfg.max_bytes && self.cfg.max_entries > 0
    }

    /// Whether one more snapshot of `bytes` can be kept by a request that resumed `chain` and
    /// has taken the snapshots `pending` so far (not yet stored): the least recently used
    /// entries are evicted until the entries, the chain, the pending snapshots and `bytes`
    /// together fit `max_bytes`. A request's snapshots used to be admitted one at a time by
    /// [`Self::fits`] and trimmed only when [`Self::store`] took them at its end, so a long
    /// prompt with many checkpoints held them all beyond the limit while it ran (on Kimi K3,
    /// each carries its layers' fixed state).
    pub fn make_room(&mut self, chain: &Chain<S>, pending: &[Snapshot<S>], bytes: usize) -> bool {
        if !self.fits(bytes) {
            return false;
        }
        while self.bytes_with(&[&chain.0, pending]) + bytes > self.cfg.max_bytes {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                return false;
            };
            self.entries.swap_remove(oldest);
        }
        true
    }

    /// Stores the conversation `tokens` (prompt and generated ids) with the snapshots `resume`
    /// started from plus `new` ones taken during the request. Entries whose every snapshot is a
    /// prefix of `tokens` are merged into the new entry; then the least recently used entries are
    /// evicted until the cache fits its limits.
    pub fn store(&mut self, chain: Chain<S>, new: Vec<Snapshot<S>>, tokens: Vec<u32>) {
        let mut snaps = chain.0;
        snaps.extend(new.into_iter().filter(|s| s.pos <= tokens.len()));
        let mut i = 0;
        while i < self.entries.len() {
            let common = common_prefix(&self.entries[i].tokens, &tokens);
            if self.entries[i].snaps.iter().all(|s| s.pos <= common) {
                snaps.extend(self.entries.swap_remove(i).snaps);
            } else {
                i += 1;
            }
        }
        snaps.sort_by_key(|s| s.pos);
        snaps.dedup_by_key(|s| s.pos);
        if snaps.is_empty() {
            return;
        }
        self.clock += 1;
        self.entries.push(Entry { tokens, snaps, last_used: self.clock });
        self.evict();
    }

    /// Evicts least recently used entries, then thins the newest entry's earliest snapshots,
    /// until the limits hold.
    fn evict(&mut self) {
        while self.entries.len() > self.cfg.max_entries
            || (self.entries.len() > 1 && self.bytes() > self.cfg.max_bytes)
        {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                return;
            };
            self.entries.swap_remove(oldest);
        }
        while self.bytes() > self.cfg.max_bytes {
            let Some(e) = self.entries.first_mut() else { return };
            if e.snaps.len() <= 1 {
                self.entries.clear();
                return;
            }
            e.snaps.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in state: `n` positions of 100 bytes each, in one allocation.
    #[derive(Debug)]
    struct Fake(usize, Box<u8>);

    impl SessionState for Fake {
        fn positions(&self) -> usize {
            self.0
        }
        fn for_each_part(&self, f: &mut dyn FnMut(usize, usize)) {
            f(std::ptr::from_ref::<u8>(&self.1) as usize, 100 * self.0);
        }
    }

    fn state(n: usize) -> Fake {
        Fake(n, Box::new(0))
    }

    fn cache(max_bytes: usize) -> SessionCache<Fake> {
        SessionCache::new(SessionConfig { checkpoint_every: 4, max_bytes, max_entries: 8 })
    }

    #[test]
    fn resumes_from_the_latest_snapshot_within_the_common_prefix() {
        let mut c = cache(1 << 20);
        let r = c.resume(&[1, 2, 3]);
        assert_eq!(r.reused, 0);
        let snaps =
            vec![Snapshot::new(state(4), Some(vec![0.0; 3])), Snapshot::new(state(9), None)];
        c.store(r.chain, snaps, (1..=10).collect());
        // Extends the whole conversation: the end-of-generation state (no logits) is usable.
        let p: Vec<u32> = (1..=12).collect();
        assert_eq!(c.resume(&p).reused, 9);
        // Diverges at position 6: the snapshot at 4.
        assert_eq!(c.resume(&[1, 2, 3, 4, 5, 6, 99]).reused, 4);
        // Exactly the first 4 tokens: the snapshot has logits, nothing to feed.
        let r = c.resume(&[1, 2, 3, 4]);
        assert_eq!((r.reused, r.logits.is_some()), (4, true));
        // Exactly the 9 tokens of the final state: it has no logits, so back to 4.
        let p9: Vec<u32> = (1..=9).collect();
        assert_eq!(c.resume(&p9).reused, 4);
        assert_eq!(c.resume(&[7, 7]).reused, 0);
    }

    #[test]
    fn extending_entries_absorb_their_prefixes_and_budget_evicts_lru() {
        let mut c = cache(1 << 20);
        let r = c.resume(&[1, 2]);
        c.store(r.chain, vec![Snapshot::new(state(2), None)], vec![1, 2, 3]);
        let r = c.resume(&[1, 2, 3, 4]);
        assert_eq!(r.chain.positions(), vec![2]);
        c.store(r.chain, vec![Snapshot::new(state(4), None)], vec![1, 2, 3, 4, 5]);
        assert_eq!(c.len(), 1, "the first entry is a prefix of the second");
        let r = c.resume(&[9, 9]);
        c.store(r.chain, vec![Snapshot::new(state(1), None)], vec![9, 9]);
        assert_eq!(c.len(), 2);
        let one = Snapshot::new(state(4), None).byte_len();
        let mut small = cache(one * 2 + 64);
        for k in 0..4u32 {
            let r = small.resume(&[k, k]);
            small.store(r.chain, vec![Snapshot::new(state(4), None)], vec![k; 5]);
        }
        assert!(small.bytes() <= one * 2 + 64);
        assert_eq!(small.resume(&[3, 3, 3, 3, 3, 3]).reused, 4, "newest kept");
        assert_eq!(small.resume(&[0, 0, 0, 0, 0, 0]).reused, 0, "oldest evicted");
    }

    #[test]
    fn a_long_prompt_held_every_checkpoint_beyond_the_session_limit_until_the_end() {
        // Room for 10 positions of state (100 bytes each) plus token lists.
        let mut c = cache(1000 + 64);
        let r = c.resume(&[7, 7]);
        c.store(r.chain, vec![Snapshot::new(state(4), None)], vec![7; 4]);
        // A new request takes checkpoints of 3 positions each: the older conversation is
        // evicted to make room for the second, and the fourth no longer fits next to three.
        let r = c.resume(&[1, 2, 3]);
        let mut pending = Vec::new();
        for k in 1..=4 {
            let bytes = Snapshot::new(state(3), None).byte_len();
            if c.make_room(&r.chain, &pending, bytes) {
                pending.push(Snapshot::new(state(3), None));
            }
            assert!(c.bytes_with(&[&pending]) <= 1000 + 64, "after checkpoint {k}");
        }
        assert_eq!(pending.len(), 3, "three of 300 bytes fit the limit, four do not");
        assert!(c.is_empty(), "the older conversation made room");
        // A state larger than the limit is refused outright, as by `fits`.
        assert!(!c.make_room(&r.chain, &[], 2000));
    }
}
