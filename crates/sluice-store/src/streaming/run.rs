//! The body of [`StreamingExperts`]' `for_each`: pin the hits, take slots and submit the misses'
//! reads at once (in waves when the free slots are fewer), hand the experts over in ascending id
//! order as their reads finish, and issue the next layer's guess once this call's experts hold
//! their slots (the protocol whole: `streaming`'s header).

use super::shared::{add, nanos, Pins, Request};
use super::StreamingExperts;
use crate::cache::SlotState;
use crate::policy::key;
use crate::reader::Priority;
use crate::remote::DiskPin;
use crate::{ExpertView, StoreError};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

impl StreamingExperts {
    /// `for_each`, with the guess `next` for a later layer issued once every expert of this
    /// call holds a pinned slot (so no guess evicts one of them), and dropped when they do not
    /// all fit at once (a cache that small has no room to spare for guesses). The part of the
    /// guess that finds no room at first (the cache's slots pinned by this call's experts) is
    /// issued as those experts are consumed and their slots released, likeliest first.
    pub(super) fn run(
        &self,
        layer: usize,
        ids: &[u32],
        mut next: Option<(usize, &[u32])>,
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let sh = &*self.shared;
        let experts = sh.index.experts(layer);
        if let Some(&bad) =
            ids.iter().find(|&&id| usize::try_from(id).map_or(true, |i| i >= experts))
        {
            return Err(StoreError::NoSuchExpert { layer, expert: bad, experts });
        }
        if let Some(u) = sh.uses.get(layer) {
            for &id in ids {
                if let Some(n) = usize::try_from(id).ok().and_then(|i| u.get(i)) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let c = &sh.counters;
        // Experts reach `f` in ascending id order, and their reads are issued in that order.
        let mut order = ids.to_vec();
        order.sort_unstable();
        let mut served = 0;
        let mut todo: VecDeque<u32> = order.iter().copied().collect();
        let mut rq = Request {
            layer,
            fresh: Vec::new(),
            ahead: Vec::new(),
            pins: Pins { shared: sh, held: Vec::with_capacity(ids.len()) },
            pending: Vec::new(),
            ready: Vec::new(),
            released: Vec::new(),
        };
        // Disk pins of misses made local but not yet handed to a read job.
        let mut localized: Vec<(u32, DiskPin)> = Vec::new();
        // The part of the guess `next` that found no room yet, retried as experts are consumed.
        let mut later: Option<(usize, Vec<u32>)> = None;
        // `st` is declared after `rq`, so on every return it is unlocked before `rq`'s pins
        // are released.
        let mut st = sh.lock();
        rq.fresh = self.settle(&mut st, layer, ids);
        rq.ahead = self.take_ahead(&mut st, layer);
        loop {
            // Pin everything cached or in flight first (so no miss evicts a hit of this call),
            // then take slots for the misses and submit all their reads at once. An expert
            // this call gave back for a lower id is taken again only in its turn below.
            todo.retain(|&id| rq.released.contains(&id) || !self.take_cached(&mut st, &mut rq, id));
            if let Some(disk) = &sh.disk {
                // Stream install: the misses must be on local disk (and stay there) before
                // they are read. Missing ones are fetched now, coalesced, in one call.
                localized.retain(|(id, _)| todo.contains(id));
                let need: Vec<u32> = todo
                    .iter()
                    .copied()
                    .filter(|id| !localized.iter().any(|(l, _)| l == id))
                    .collect();
                if !need.is_empty() {
                    // Reads queued above must not wait behind the fetch.
                    self.pool.kick();
                    drop(st);
                    localized.extend(disk.localize(layer, &need)?);
                    st = sh.lock();
                    todo.retain(|&id| !self.take_cached(&mut st, &mut rq, id));
                }
            }
            let mut waiting = VecDeque::new();
            // Whether a miss found every slot pinned or being read.
            let mut blocked = false;
            while let Some(id) = todo.pop_front() {
                if self.take_cached(&mut st, &mut rq, id) {
                    continue;
                }
                let pin = if sh.disk.is_some() {
                    match localized.iter().position(|(l, _)| *l == id) {
                        Some(p) => Some(localized.swap_remove(p).1),
                        // Not local yet (the disk budget is pinned full): later.
                        None => {
                            waiting.push_back(id);
                            continue;
                        }
                    }
                } else {
                    None
                };
                let Some((i, ticket)) = st.cache.acquire(key(layer, id), false) else {
                    if let Some(p) = pin {
                        localized.push((id, p));
                    }
                    waiting.push_back(id);
                    blocked = true;
                    break;
                };
                st.cache.pin(i);
                rq.pins.held.push(i);
                if !rq.released.contains(&id) {
                    add(&c.misses, 1);
                }
                self.submit(&mut st, i, ticket, (layer, id), Priority::Demand, pin);
                rq.pending.push((id, i));
            }
            waiting.append(&mut todo);
            todo = waiting;
            if let Some((nl, guess)) = next.take() {
                if todo.is_empty() {
                    let done = self.guess(&mut st, nl, guess);
                    later = (done < guess.len()).then(|| (nl, guess[done..].to_vec()));
                } else if let Some(l) = st.layers.get_mut(nl) {
                    l.skipped += guess.len() as u64;
                }
            } else if let Some((nl, rest)) = later.take() {
                // Slots this call's consumed experts released: room for more of the guess.
                let done = self.issue(&mut st, nl, &rest);
                later = (done < rest.len()).then(|| (nl, rest[done..].to_vec()));
            }
            // Everything this round queued (demand misses, then guesses) goes out as one batch.
            self.pool.kick();
            let mut failed = None;
            let Request { pending, ready, pins, released, .. } = &mut rq;
            pending.retain(|&(id, i)| match st.cache.slot(i).state {
                SlotState::Reading => true,
                SlotState::Ready => {
                    ready.push((id, i));
                    false
                }
                SlotState::Failed | SlotState::Free => {
                    failed = Some(i);
                    true
                }
            });
            if let Some(i) = failed {
                return Err(sh.read_error(&st, i));
            }
            let Some(&want) = order.get(served) else { return Ok(()) };
            let Some(at) = ready.iter().position(|&(id, _)| id == want) else {
                if blocked && todo.front() == Some(&want) {
                    // The next id waits for a slot, and every slot is pinned or being read:
                    // if this call holds ready experts of later ids, the one whose turn is
                    // furthest gives its slot back (it is read again in its turn if evicted
                    // by then). Without this, a cache whose slots all hold this call's later
                    // hits would wait forever for the next id.
                    if let Some(p) = (0..ready.len()).max_by_key(|&p| ready[p].0) {
                        let (id, i) = ready.swap_remove(p);
                        if pins.release_locked(&mut st, i) {
                            sh.cv.notify_all();
                        }
                        released.push(id);
                        let at = todo.partition_point(|&t| t < id);
                        todo.insert(at, id);
                        continue;
                    }
                }
                // The next id is being read (or waits for a slot that a read in flight, or
                // another request, will free).
                let t0 = Instant::now();
                st = if pending.is_empty() && sh.disk.is_some() {
                    // Waiting for disk-cache room held by reads of other requests, whose
                    // release may have come before this wait: poll.
                    sh.cv
                        .wait_timeout(st, Duration::from_millis(20))
                        .map_or_else(|e| e.into_inner().0, |(g, _)| g)
                } else {
                    sh.cv.wait(st).unwrap_or_else(PoisonError::into_inner)
                };
                add(&c.stall_ns, nanos(t0));
                continue;
            };
            drop(st);
            // One expert per round: the slot it frees goes to the next miss (at the top of the
            // loop) before the next ready expert computes, so the disk never idles while a
            // backlog of ready experts is folded (with fewer slots than misses, reads that
            // complete together would otherwise leave the disk without work until all of them
            // had been computed). Experts reach `f` in ascending id order whatever order their
            // reads finish in: one that finishes early keeps its slot until its turn.
            let (id, i) = ready.swap_remove(at);
            served += 1;
            let loc = sh.index.get(layer, id).ok_or(StoreError::NoSuchExpert {
                layer,
                expert: id,
                experts,
            })?;
            // SAFETY: slot `i` is ready and pinned by this call, so the cache neither
            // evicts nor rewrites it until `pins.release(i)` below; the arena lives in
            // `shared`, which outlives this borrow.
            let buf = unsafe { sh.cache.arena().slot(i) };
            let view = loc.view(buf).ok_or_else(|| {
                StoreError::Config(format!("expert {id} of layer {layer} overruns its slot"))
            })?;
            add(&c.requests, 1);
            add(&c.bytes_served, loc.bytes());
            f(id, view)?;
            pins.release(i);
            st = sh.lock();
        }
    }
}
