//! A call's activation rows packed for the outer-product prefill nest ([`crate::outer`], one
//! layout for its AVX-512 and AVX2 tiers): transposed so that each of the
//! 16 lanes' values lie together, tokens side by side, once per call, before its row chunks
//! are handed to the pool.
//!
//! The pack is made once and shared: every row chunk of the call (every thread) reads the same
//! one. Made per chunk, a call of a few dozen chunks would transpose its activations a few
//! dozen times. It is made on the pool too (one part per 8 token groups × [`CHUNK`] columns), in
//! buffers the **pool** keeps for its life and lends to one call at a time ([`PackBuf`],
//! [`PACK_BYTES`] each, made by the pool's first packed call or by [`crate::reserve_scratch`]):
//! a call that finds them lent (another thread's, or one made from inside a packed call) runs
//! unpacked, in the other nests, with the same bits. A call is packed and run in blocks of at
//! most [`BLOCK`] tokens ([`in_blocks`]), each block's results those of the whole call (no
//! result depends on how the tokens are cut); the nest decodes its weights once per block.
//!
//! **A pool of many threads rotates its packs through several buffers** ([`pack_buffers`]):
//! every thread reads a whole pack, and writing lines that many cores have read waits on them
//! long after the lines have left those cores' caches (a 16-thread pack took 0.85–1.03 ms
//! where one written after one or two readers took 0.12–0.14; session 29). Each pack (a block
//! of [`in_blocks`], a turn of [`in_turns`]) takes the next buffer, so a buffer is written
//! again only after the others were: on the device's 16-thread Xeon, 8 buffers made a T = 256
//! call 1.04–1.10× faster (docs/PERFORMANCE.md, issue 20, session 41). The engine keeps one
//! for a model whose experts stream ([`crate::Pool::set_pack_buffers`]).
//!
//! Two kinds of call pack: one matmul ([`in_blocks`]: `matmul`, `matmul_pair`, `matmul_then`)
//! and a layer's batched experts ([`in_turns`]: `matmul_many` and its kin, `crate::many`),
//! whose jobs of at least [`MIN_TOKENS`] rows are cut in blocks as one matmul's would be and
//! packed side by side, as many blocks as the buffer holds a turn, each turn packed in one
//! pool call and run in one more.
//!
//! Each lane's values are kept in **token groups of 6**, the tokens a tile folds, so that a
//! tile's activations are one run of 24 cache lines: packed with the tokens side by side
//! (a lane's steps a stride of all the block's tokens apart), a pack of 256 tokens made the
//! fold a third slower than one of 64, the reason blocks were once 128 tokens; in groups, a
//! block of 264 tokens decodes the weights of a 256-token prefill once instead of twice
//! (docs/PERFORMANCE.md, issue 20, sessions 23 and 24).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use crate::isa::Isa;

/// Columns per chunk of the outer nest: 64 steps of 16 (a multiple of every format's block).
pub(crate) const CHUNK: usize = 1024;
/// Steps of 16 columns per chunk (a lane's values per chunk).
pub(crate) const STEPS: usize = CHUNK / 16;
/// The bytes of one buffer of packed activations a pool keeps ([`PackBuf`]), made by its first
/// packed call (or [`crate::reserve_scratch`]) and kept for its life: a block of [`BLOCK`]
/// tokens of up to 7,168 columns (Kimi K3's hidden size) fits; wider rows are packed in
/// smaller blocks. Charged per pool ([`pool_scratch_bytes`], times [`pack_buffers`]): held per
/// thread, 8 MiB a thread took a 96 MiB budget's expert cache slots
/// (`tests/streaming_budget.rs` in sluice-cli, session 23).
pub const PACK_BYTES: usize = 8 << 20;
/// Floats of one pack buffer.
const PACK_FLOATS: usize = PACK_BYTES / 4;
/// Most buffers a pool rotates its packs through ([`pack_buffers`]).
const MOST_BUFFERS: usize = 8;
/// Most tokens per block of the outer nest: its weights are decoded once per block (44
/// token groups of 6, so that a 256-token prefill decodes them once).
pub(crate) const BLOCK: usize = 44 * GROUP_TOKENS;
/// Fewest activation rows of a call that the outer nest takes (fewer take the other nests).
pub(crate) const MIN_TOKENS: usize = 33;

/// Tokens a tile of the outer nest folds at once: the pack keeps each group of 6 together.
pub(crate) const GROUP_TOKENS: usize = 6;
/// Floats of one lane's column chunk for one token group: [`STEPS`] steps of 6 tokens (1,536
/// bytes, 24 cache lines), the values a tile reads, in the order it reads them.
pub(crate) const MICRO: usize = STEPS * GROUP_TOKENS;
/// Steps of a micro run that a tier's pack writes at once (`outer_avx512::pack`): 8 steps of
/// 6 tokens are 48 floats, three whole cache lines, so every line is written whole.
pub(crate) const PACK_WINDOW: usize = 8;
/// Floats of a micro run's [`PACK_WINDOW`] steps.
pub(crate) const WINDOW_FLOATS: usize = PACK_WINDOW * GROUP_TOKENS;
const _: () = assert!(STEPS.is_multiple_of(PACK_WINDOW) && WINDOW_FLOATS.is_multiple_of(16));

/// A call's activation rows `first .. first + tokens`, packed in token groups of 6:
/// `A[ch][l][g][k][j]` = `x[first + 6g + j][ch · CHUNK + 16k + l]` at
/// `((ch · 16 + l) · groups + g) · MICRO + 6k + j` (columns past the row's end −0.0, tokens
/// past `tokens` +0.0), so that a tile's activations are one run of 24 cache lines.
pub(crate) struct Packed<'p> {
    /// The pack, on a cache line.
    pub(crate) data: &'p [f32],
    /// Token groups of 6 held (the last one padded with +0.0 tokens).
    pub(crate) groups: usize,
    /// The activation rows' columns.
    pub(crate) cols: usize,
    /// The call's first activation row the pack holds.
    pub(crate) first: usize,
    /// Activation rows held.
    pub(crate) tokens: usize,
}

impl Packed<'_> {
    /// The column chunks of a pack of `cols` columns.
    pub(crate) fn chunks(cols: usize) -> usize {
        cols.div_ceil(CHUNK)
    }
}

/// Floats a pack of `tokens` rows of `cols` columns takes, and its token groups of 6.
pub(crate) fn pack_size(tokens: usize, cols: usize) -> (usize, usize) {
    let groups = tokens.div_ceil(GROUP_TOKENS);
    (cols.next_multiple_of(CHUNK) * groups * GROUP_TOKENS, groups)
}

/// Tokens a pack of `cols` columns holds: [`BLOCK`], or as many whole groups of 6 as fit in
/// [`PACK_BYTES`] if fewer; `None` if not even 6.
fn block_tokens(cols: usize) -> Option<usize> {
    let per_token = cols.max(1).next_multiple_of(CHUNK);
    let fit = PACK_BYTES / 4 / per_token / GROUP_TOKENS * GROUP_TOKENS;
    (fit >= GROUP_TOKENS).then_some(fit.min(BLOCK))
}

/// A pool's pack buffers ([`pack_buffers`] of [`PACK_BYTES`]): made by the first packed call
/// on the pool (or [`crate::reserve_scratch`]), kept for the pool's life, lent to one call at
/// a time, each pack of the call taking the next buffer in turn.
pub(crate) struct PackBuf {
    /// How many buffers the pool rotates through.
    buffers: AtomicUsize,
    ring: Mutex<Ring>,
}

/// The buffers of a [`PackBuf`], one allocation of `buffers` × [`PACK_BYTES`] (and a cache
/// line's slack) once made, and the buffer the next pack takes.
#[derive(Default)]
struct Ring {
    floats: Vec<f32>,
    next: usize,
}

impl PackBuf {
    /// The pack buffers of a pool of `threads` threads, not yet made.
    pub(crate) fn new(threads: usize) -> Self {
        Self { buffers: AtomicUsize::new(pack_buffers(threads)), ring: Mutex::default() }
    }

    /// How many buffers the pool rotates through.
    pub(crate) fn buffers(&self) -> usize {
        self.buffers.load(Ordering::Relaxed)
    }

    /// Keeps `buffers` buffers (at least 1, at most [`MOST_BUFFERS`]) from now on; buffers made
    /// already are freed now, and the new count made by the next packed call. Waits for a call
    /// that holds them.
    pub(crate) fn set_buffers(&self, buffers: usize) {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        self.buffers.store(buffers.clamp(1, MOST_BUFFERS), Ordering::Relaxed);
        *ring = Ring::default();
    }

    /// Makes the buffers if the process's tier packs and they are not made yet (what
    /// [`crate::reserve_scratch`] asks of a pool); buffers lent to a call are left as they are.
    pub(crate) fn reserve(&self, isa: Isa) {
        if packs(isa) {
            if let Some(mut lent) = lend(self) {
                lent.make();
            }
        }
    }
}

/// Buffers a pool of `threads` threads rotates its packs through unless told otherwise
/// ([`crate::Pool::set_pack_buffers`]): one for every two threads, at most [`MOST_BUFFERS`].
/// Pools of one to three threads keep one: after one or two readers a pack is written as fast
/// as into lines no core has read (session 29).
pub fn pack_buffers(threads: usize) -> usize {
    (threads / 2).clamp(1, MOST_BUFFERS)
}

/// The bytes a pool that keeps `buffers` pack buffers ([`crate::Pool::pack_buffers`]) holds
/// for the calls made on it beyond its threads' own scratch ([`crate::WIDE_SCRATCH_BYTES`]
/// each): `buffers` × [`PACK_BYTES`] and a cache line's slack where the process's tier packs
/// a prefill's activations (AVX-512 and AVX2), else nothing. A memory plan charges it once per
/// pool.
pub fn pool_scratch_bytes(buffers: usize) -> usize {
    if packs(crate::isa()) {
        buffers.clamp(1, MOST_BUFFERS) * PACK_BYTES + 64
    } else {
        0
    }
}

/// Whether calls on `isa` take the outer nest.
fn packs(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx512 | Isa::Avx2)
}

/// A pool's pack buffers lent to one call ([`lend`]).
struct Lent<'b> {
    ring: MutexGuard<'b, Ring>,
    buffers: usize,
}

impl Lent<'_> {
    /// Makes every buffer at its full size if they are not yet: zeroed floats, which the
    /// allocator takes as fresh pages from the system, each entering memory when a pack first
    /// writes it (on the pool's threads), not in a fill on the calling thread. Filled on the
    /// calling thread, 64 MiB of buffers took about a tenth of a 256-token prompt's first
    /// pass at 16 threads on the device (session 41).
    fn make(&mut self) {
        // A cache line's slack ([`pool_scratch_bytes`] charges it): the buffers start on one.
        let floats = self.buffers * PACK_FLOATS + 15;
        if self.ring.floats.len() != floats {
            // The old buffers go before the new ones are made, so the two never coexist.
            self.ring.floats = Vec::new();
            self.ring.floats = vec![0.0; floats];
        }
    }

    /// The buffer the next pack takes ([`PACK_FLOATS`] floats on a cache line): the one after
    /// the last pack's, in turn.
    fn next(&mut self) -> &mut [f32] {
        self.make();
        let at = self.ring.next % self.buffers;
        self.ring.next = (at + 1) % self.buffers;
        on_line(&mut self.ring.floats, at * PACK_FLOATS, PACK_FLOATS)
    }
}

/// `len` floats of `v` from its `start`-th float counted from its first cache line (`v` holds
/// a line's slack, 15 floats, past them).
fn on_line(v: &mut [f32], start: usize, len: usize) -> &mut [f32] {
    // Floats to the first cache line (a `Vec<f32>` starts on 4 bytes at least).
    let skip = (64 - v.as_ptr().addr() % 64) % 64 / 4;
    &mut v[skip + start..skip + start + len]
}

/// Tokens per block of a call of `t` activation rows of `cols` on `isa`: where the outer nest
/// takes the call, blocks of about equal size, each of whole token groups but the last, at
/// most [`BLOCK`] (or what [`PACK_BYTES`] holds); `None` where the call runs unpacked.
fn block_size(isa: Isa, t: usize, cols: usize) -> Option<usize> {
    let most = block_tokens(cols)?;
    (packs(isa) && t >= MIN_TOKENS)
        .then(|| t.div_ceil(t.div_ceil(most)).next_multiple_of(GROUP_TOKENS).min(most))
}

/// The pool's pack buffers, or `None` if they are lent (to a call on another thread, or to the
/// packed call this one is made from inside): such a call runs unpacked. A buffer poisoned by
/// a panicking call is filled anew before it is read.
fn lend(buf: &PackBuf) -> Option<Lent<'_>> {
    let ring = match buf.ring.try_lock() {
        Ok(b) => b,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    Some(Lent { ring, buffers: buf.buffers() })
}

/// Runs `f(tokens, pack)` over the activation rows `0..t` of a call on `isa` (`x`, `t` rows
/// of `cols`): where the outer nest takes the call, in blocks of at most [`BLOCK`] tokens of
/// equal size, each packed first (on the current pool) and handed with its pack; otherwise
/// once, `f(0..t, None)`. The blocks
/// cover `0..t` in order, so every cell is computed once, as the call would compute it whole.
pub(crate) fn in_blocks(
    isa: Isa,
    x: &[f32],
    t: usize,
    cols: usize,
    f: &mut dyn FnMut(Range<usize>, Option<&Packed<'_>>),
) {
    let Some(size) = block_size(isa, t, cols) else {
        return f(0..t, None);
    };
    crate::pool::with_current(|pool| {
        let Some(mut lent) = lend(pool.pack_buf()) else {
            return f(0..t, None);
        };
        for s0 in (0..t).step_by(size) {
            let n = size.min(t - s0);
            let buf = lent.next();
            fill(isa, &[Fill { x: &x[s0 * cols..(s0 + n) * cols], tokens: n, cols, at: 0 }], buf);
            let (len, groups) = pack_size(n, cols);
            let p = Packed { data: &buf[..len], groups, cols, first: s0, tokens: n };
            f(s0..s0 + n, Some(&p));
        }
    });
}

/// A job of a batched call as [`in_turns`] sees it: `t` activation rows of `cols`, `x`.
#[derive(Clone, Copy)]
pub(crate) struct Acts<'x> {
    /// The job's activation rows, `t × cols`.
    pub(crate) x: &'x [f32],
    /// Activation rows.
    pub(crate) t: usize,
    /// Columns of a row.
    pub(crate) cols: usize,
}

/// A part of a turn of [`in_turns`]: activation rows `tokens` of job `job`, with their pack
/// where they are packed.
pub(crate) struct Part<'p> {
    /// The job's index.
    pub(crate) job: usize,
    /// The job's activation rows the part holds.
    pub(crate) tokens: Range<usize>,
    /// Their pack (`first` is `tokens.start`), or `None`: the part runs unpacked.
    pub(crate) pack: Option<Packed<'p>>,
}

/// A part of a turn as [`in_turns`] plans it: job, activation rows, and where their pack starts
/// in the buffer if they are packed.
type Slot = (usize, Range<usize>, Option<usize>);

/// Runs `f(parts)` over the activation rows of a batched call's jobs (a layer's experts, each
/// on its own rows) on `isa`, in as few turns as the pool's pack buffer allows: each job the
/// outer nest takes is cut in blocks as [`in_blocks`] cuts it, and its blocks are packed side
/// by side into the buffer, all of a turn's in one pool call, a turn ending where the next
/// block would not fit ([`PACK_BYTES`], no more memory than one call's pack); the other jobs
/// (fewer than [`MIN_TOKENS`] rows) join the turn of the jobs around them, whole and unpacked.
/// Where nothing packs, or the buffer is lent, `f` runs once over every job, whole and
/// unpacked. Every job's rows are handed once, in job order, each part's pack its rows' own,
/// so every cell is computed once, as one call per job would compute it.
pub(crate) fn in_turns(isa: Isa, jobs: &[Acts<'_>], f: &mut dyn FnMut(&[Part<'_>])) {
    let sizes: Vec<Option<usize>> = jobs.iter().map(|a| block_size(isa, a.t, a.cols)).collect();
    let whole = || -> Vec<Part<'_>> {
        let part = |(job, a): (usize, &Acts<'_>)| Part { job, tokens: 0..a.t, pack: None };
        jobs.iter().enumerate().map(part).collect()
    };
    if sizes.iter().all(Option::is_none) {
        return f(&whole());
    }
    crate::pool::with_current(|pool| {
        let Some(mut lent) = lend(pool.pack_buf()) else {
            return f(&whole());
        };
        let mut turns: Vec<Vec<Slot>> = vec![Vec::new()];
        let mut used = 0;
        for (j, (a, size)) in jobs.iter().zip(&sizes).enumerate() {
            let Some(size) = *size else {
                turns.last_mut().expect("invariant: a turn").push((j, 0..a.t, None));
                continue;
            };
            for s0 in (0..a.t).step_by(size) {
                let n = size.min(a.t - s0);
                // A block fits an empty buffer (`block_tokens`); a full turn starts the next.
                let len = pack_size(n, a.cols).0;
                if used + len > PACK_FLOATS {
                    turns.push(Vec::new());
                    used = 0;
                }
                turns.last_mut().expect("invariant: a turn").push((j, s0..s0 + n, Some(used)));
                used += len;
            }
        }
        for turn in &turns {
            let fills: Vec<Fill<'_>> = turn
                .iter()
                .filter_map(|(j, tk, at)| {
                    let (x, cols) = (jobs[*j].x, jobs[*j].cols);
                    at.map(|at| Fill {
                        x: &x[tk.start * cols..tk.end * cols],
                        tokens: tk.len(),
                        cols,
                        at,
                    })
                })
                .collect();
            let buf = lent.next();
            fill(isa, &fills, buf);
            let view: &[f32] = buf;
            let parts: Vec<Part<'_>> = turn
                .iter()
                .map(|(j, tk, at)| {
                    let cols = jobs[*j].cols;
                    let pack = at.map(|at| {
                        let (len, groups) = pack_size(tk.len(), cols);
                        let data = &view[at..at + len];
                        Packed { data, groups, cols, first: tk.start, tokens: tk.len() }
                    });
                    Part { job: *j, tokens: tk.clone(), pack }
                })
                .collect();
            f(&parts);
        }
    });
}

/// A pointer the pack's parts write through, each its own part.
struct Parts(*mut f32);

// SAFETY: only dereferenced by `crate::outer_avx512::pack` and `crate::outer_avx2::pack`,
// each part of the pool call writing a disjoint part of the buffer, which the calling thread
// holds exclusively until the call ends.
unsafe impl Sync for Parts {}

impl Parts {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// One pack of [`fill`]: `tokens` rows of `cols` (`x`), packed from float `at` of the buffer.
struct Fill<'x> {
    x: &'x [f32],
    tokens: usize,
    cols: usize,
    at: usize,
}

/// Token groups of a pack that each part of [`fill`] writes.
const PART_GROUPS: usize = 8;

/// Packs each of `fills` into `buf` on the current pool, in one pool call, with `isa`'s pack:
/// one part per [`PART_GROUPS`] token groups × [`CHUNK`] columns of a pack, or all on this
/// thread for a small call or a pool of one. A part writes its groups' micro runs whole, in
/// aligned vectors (`outer_avx512::pack`); written 6 floats at a time, one 16-token block
/// per part, a 256-token, 7,168-column pack took 3.9 ms on one of the device Xeon's threads
/// and 2.0 ms on the Zen 5 dev VM's, against 0.89 and 0.76 ms now (docs/PERFORMANCE.md,
/// issue 20, session 29).
///
/// # Panics
/// If a pack runs past `buf`, starts off a cache line, or overlaps the one before it.
fn fill(isa: Isa, fills: &[Fill<'_>], buf: &mut [f32]) {
    assert!(buf.as_ptr().addr().is_multiple_of(64), "pack: buffer");
    // The parts before each pack's end, its parts per column chunk, and all the packs' work.
    let (mut ends, mut per, mut work, mut end, mut parts) = (vec![], vec![], 0, 0, 0);
    for f in fills {
        let (len, groups) = pack_size(f.tokens, f.cols);
        assert!(f.at >= end && f.at.is_multiple_of(16), "pack: packs overlap");
        end = f.at + len;
        assert!(end <= buf.len(), "pack: buffer");
        assert_eq!(f.x.len(), f.tokens * f.cols, "pack: x length");
        per.push(groups.div_ceil(PART_GROUPS));
        parts += Packed::chunks(f.cols) * per[per.len() - 1];
        ends.push(parts);
        work += f.tokens * f.cols;
    }
    let out = Parts(buf.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    crate::pool::with_current(|pool| {
        let part = |i: usize| {
            let k = ends.partition_point(|&e| e <= i);
            let (f, i) = (&fills[k], i - k.checked_sub(1).map_or(0, |k| ends[k]));
            let (_, groups) = pack_size(f.tokens, f.cols);
            let (ch, g0) = (i / per[k], PART_GROUPS * (i % per[k]));
            let (chunk, gs) = (ch..ch + 1, g0..groups.min(g0 + PART_GROUPS));
            // SAFETY: only called where `packs(isa)` holds for a tier the CPU supports, so
            // AVX-512F, or AVX2 and FMA. Pack `k` lies at `at .. at + pack_size` inside `buf`
            // (asserted), on a cache line (`buf` is, and `at` is a multiple of 16 floats),
            // overlapping no other pack (asserted), and each part writes its own groups of
            // its own chunk; `buf` is borrowed exclusively until the call ends.
            unsafe {
                let out = out.get().add(f.at);
                if isa == Isa::Avx512 {
                    crate::outer_avx512::pack(f.x, f.tokens, f.cols, chunk, gs, out);
                } else {
                    crate::outer_avx2::pack(f.x, f.tokens, f.cols, chunk, gs, out);
                }
            }
        };
        if pool.threads() <= 1 || work < crate::matmul::PAR_MIN_WORK {
            (0..parts).for_each(part);
        } else {
            pool.run(parts, &part);
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, out, ends, per, work);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;

    /// The pack's layout, [`Packed`]: `x[6g + j][ch · CHUNK + 16k + l]`, −0.0 past a row's
    /// end, +0.0 past the last token.
    fn want(x: &[f32], tokens: usize, cols: usize, ch: usize, l: usize, g: usize, k: usize) -> u32 {
        let (tok, col) =
            (GROUP_TOKENS * g + k % GROUP_TOKENS, ch * CHUNK + 16 * (k / GROUP_TOKENS) + l);
        if tok >= tokens {
            0.0f32.to_bits()
        } else if col >= cols {
            (-0.0f32).to_bits()
        } else {
            x[tok * cols + col].to_bits()
        }
    }

    #[test]
    fn a_pack_written_six_floats_at_a_time_took_four_times_longer_now_whole_lines_same_layout() {
        let shapes = [(1, 16), (5, 300), (6, 1024), (7, 1040), (47, 2100), (48, 64), (100, 7)];
        for isa in Isa::available().into_iter().filter(|&i| packs(i)) {
            for threads in [1, 3] {
                let pool = Pool::new(threads).expect("pool");
                // Seven packs side by side (a layer batch's turn), then two.
                for pair in [&shapes[..], &shapes[4..6]] {
                    let xs: Vec<Vec<f32>> = pair
                        .iter()
                        .enumerate()
                        .map(|(n, &(t, c))| {
                            (0..t * c).map(|i| (i * 7 + n * 13) as f32 * 0.25 - 3.0).collect()
                        })
                        .collect();
                    let mut at = 0;
                    let fills: Vec<Fill<'_>> = pair
                        .iter()
                        .zip(&xs)
                        .map(|(&(tokens, cols), x)| {
                            let f = Fill { x, tokens, cols, at };
                            at += pack_size(tokens, cols).0;
                            f
                        })
                        .collect();
                    let mut floats = vec![f32::NAN; at + 15];
                    let buf = on_line(&mut floats, 0, at);
                    pool.install(|| fill(isa, &fills, buf));
                    for f in &fills {
                        let (_, groups) = pack_size(f.tokens, f.cols);
                        let steps = f.cols.div_ceil(16);
                        for ch in 0..Packed::chunks(f.cols) {
                            for l in 0..16 {
                                for g in 0..groups {
                                    for k in 0..MICRO {
                                        if ch * STEPS + k / GROUP_TOKENS >= steps {
                                            // Past the row's last step: never read.
                                            continue;
                                        }
                                        let i = f.at + ((ch * 16 + l) * groups + g) * MICRO + k;
                                        assert_eq!(
                                            buf[i].to_bits(),
                                            want(f.x, f.tokens, f.cols, ch, l, g, k),
                                            "{isa} {threads} threads, {} x {}: chunk {ch} lane {l} group {g} slot {k}",
                                            f.tokens,
                                            f.cols
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A 16-thread pool wrote each pack into the one buffer its last call had every thread
    /// read, and waited on those cores for it; now a pool of many threads rotates its packs
    /// through one buffer for every two threads (at most 8), so a buffer is written again
    /// only after the others were. Each is a whole, distinct, line-aligned buffer, taken in
    /// turn, and a pool of up to three threads keeps one.
    #[test]
    fn a_16_thread_pool_rewrote_the_pack_every_thread_had_just_read_now_it_rotates_8_buffers() {
        let want = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (8, 4), (16, 8), (17, 8), (128, 8)];
        for (threads, buffers) in want {
            assert_eq!(pack_buffers(threads), buffers, "{threads} threads");
            let buf = PackBuf::new(threads);
            let mut lent = lend(&buf).expect("nothing else holds the buffers");
            let starts: Vec<usize> = (0..2 * buffers + 1)
                .map(|_| {
                    let b = lent.next();
                    assert_eq!(b.len(), PACK_FLOATS);
                    assert!(b.as_ptr().addr().is_multiple_of(64));
                    b.as_ptr().addr()
                })
                .collect();
            for (i, &a) in starts.iter().enumerate() {
                assert_eq!(a, starts[i % buffers], "pack {i} of a {threads}-thread pool");
                for &b in &starts[i + 1..(i + buffers).min(starts.len())] {
                    assert!(a.abs_diff(b) >= PACK_BYTES, "packs {buffers} apart overlap");
                }
            }
            assert!(lend(&buf).is_none(), "lent to one call at a time");
            drop(lent);
            assert!(lend(&buf).is_some());
        }
        let packing = packs(crate::isa());
        assert_eq!(pool_scratch_bytes(8), if packing { 8 * PACK_BYTES + 64 } else { 0 });
        assert_eq!(pool_scratch_bytes(0), if packing { PACK_BYTES + 64 } else { 0 });
        // Told to keep one, a 16-thread pool frees what it made and takes one from then on.
        let buf = PackBuf::new(16);
        lend(&buf).expect("free").make();
        buf.set_buffers(1);
        assert!(lend(&buf).expect("free").ring.floats.is_empty(), "freed when told");
        let mut lent = lend(&buf).expect("free");
        let first = lent.next().as_ptr();
        assert_eq!(lent.next().as_ptr(), first);
        assert_eq!(lent.ring.floats.len(), PACK_FLOATS + 15);
    }
}
