//! Register tiles over one span of widened weights: the dispatch that both matmul nests
//! ([`crate::tiled`] for a few activation rows, [`crate::wide`] for prefill-sized calls) share.
//!
//! [`fold_tiles`] takes the activation rows in **token groups** (as many as a tile has
//! accumulator columns: 6 on AVX-512, 4 in AVX2's halves, 3 or 2 otherwise), outermost, so a
//! group's activations stay in L1 while its tile **sweeps** the weight rows R at a time; a
//! tile is R + N loads per R · N FMAs per 16-column step.
//!
//! The prefill nest adds two things the few-row nest does without (measured in
//! docs/PERFORMANCE.md, issue 20, session 14):
//!
//! - **The next group's activations named ahead**: the sweep's i-th tile names row i of the
//!   next token group to the prefetcher (L2), one line per step inside its fold loop
//!   ([`Kernel::fold_wide`], [`Kernel::fold_half_wide`] in AVX2's halves), so the group's
//!   first tile does not wait on L3 for all of them at once, and the prefetches are spread
//!   between the FMAs rather than issued in a burst (a burst of prefetches between tiles
//!   lost 2–3 points: the load queue filled behind it).
//! - **The next span's weight rows named ahead**: the tiles that name no activations (all
//!   but the first few of a sweep) name a row of the bytes the nest decodes next, one each
//!   (see [`Prefill::next`]), so that those lines, a whole row apart, arrive under the FMAs
//!   rather than during the decode.
//! - **An aligned stage**: activations are the caller's, and a large `Vec<f32>` starts 16
//!   bytes past a cache line, so every 64-byte AVX-512 load of them straddles two lines (and
//!   every high-half 32-byte load of AVX2). On the tiers of 32 registers and of halves, a
//!   group whose activations do not start on a line is copied by its first tile, as that tile
//!   loads them anyway, into a stage of cache-line-aligned rows; the group's other tiles read
//!   the copy.
//!
//! Neither changes a result: lanes see the same values in the same order of FMAs (a copy is
//! bit-exact), and a prefetch has no architectural effect.

use crate::tiled::{Kernel, Lanes};
use crate::wide::{PANEL_STRIDE, STAGE_ROWS};

/// Folds one span of widened weights into the accumulators of `rb` weight rows × `tb`
/// activation rows in register tiles: `w(r)` is row `r`'s span, `x(j)` activation row `j`'s
/// (all the same length, a multiple of 16), and `acc[r * stride + j]` is the pair's
/// accumulator. Token groups go outermost, so a group's activations stay in L1 while its tile
/// sweeps the rows.
///
/// `prefill` is the prefill nest's ([`Prefill`]; the few-row nest passes `None`): its tiles
/// fold through [`Kernel::fold_wide`] (or [`Kernel::fold_half_wide`] in halves), each naming
/// one row of the next token group's activations to the prefetcher, and (on the tiers of 32
/// registers and of halves) a group whose activations do not start on a cache line is copied
/// into the stage by its first tile, so that the other tiles' activation loads do not
/// straddle two lines.
///
/// # Safety
/// The running CPU supports the tier `K`.
///
/// # Panics
/// If `acc` is shorter than `rb` rows of `stride ≥ tb` accumulators, or halves are asked of a
/// tier without [`Kernel::HALVES`].
pub(crate) unsafe fn fold_tiles<'w, 'x, K: Kernel>(
    w: &impl Fn(usize) -> &'w [f32],
    rb: usize,
    tb: usize,
    acc: &mut [Lanes],
    stride: usize,
    x: &impl Fn(usize) -> &'x [f32],
    prefill: Option<Prefill<'_>>,
) -> usize {
    let (halves, mut stage, next) =
        prefill.map_or((false, None, &[][..]), |p| (p.halves, Some(p.stage), p.next));
    assert!(stride >= tb && acc.len() >= rb * stride, "fold_tiles: accumulators");
    assert!(K::HALVES || !halves, "fold_tiles: halves on a tier of whole accumulators");
    let wide = stage.is_some();
    let mut named = 0;
    for Group { j, n, acts, take } in Plan::<K>::new(rb, tb, halves, wide, next.len()) {
        let mut ahead: [&[u8]; STAGE_ROWS] = [&[]; STAGE_ROWS];
        for (i, a) in ahead.iter_mut().take(acts).enumerate() {
            *a = bytes(x(j + n + i));
        }
        let spans = &next[named..named + take];
        named += take;
        let len = x(j).len();
        let misaligned = !x(j).as_ptr().addr().is_multiple_of(64);
        let s = Sweep { rb, stride, j, halves, wide, ahead, acts, spans, r0: 0 };
        match stage.as_deref_mut() {
            Some(st)
                if (K::WIDE || halves)
                    && misaligned
                    && rb >= tile_rows::<K>(n, halves)
                    && len <= PANEL_STRIDE =>
            {
                // SAFETY: the caller guarantees the tier (every arm); the stage holds
                // `STAGE_ROWS ≥ n` rows of `PANEL_STRIDE ≥ len` floats.
                unsafe {
                    match n {
                        6 => s.staged::<K, 6>(w, acc, x, st),
                        5 => s.staged::<K, 5>(w, acc, x, st),
                        4 => s.staged::<K, 4>(w, acc, x, st),
                        3 => s.staged::<K, 3>(w, acc, x, st),
                        2 => s.staged::<K, 2>(w, acc, x, st),
                        _ => s.staged::<K, 1>(w, acc, x, st),
                    }
                }
            }
            // SAFETY: the caller guarantees the tier (every arm).
            _ => unsafe {
                match n {
                    6 => s.run::<K, 6>(w, acc, x),
                    5 => s.run::<K, 5>(w, acc, x),
                    4 => s.run::<K, 4>(w, acc, x),
                    3 => s.run::<K, 3>(w, acc, x),
                    2 => s.run::<K, 2>(w, acc, x),
                    _ => s.run::<K, 1>(w, acc, x),
                }
            },
        }
    }
    named
}

/// How many of `spans` next spans' rows [`fold_tiles`] names to the prefetcher in a prefill
/// call of `tb` activation rows over `rb` weight rows (the caller names the rest itself).
pub(crate) fn spans_named<K: Kernel>(rb: usize, tb: usize, halves: bool, spans: usize) -> usize {
    Plan::<K>::new(rb, tb, halves, true, spans).map(|g| g.take).sum()
}

/// One token group of [`fold_tiles`]: its first activation row and size, how many rows of
/// the next token group its tiles name to the prefetcher, and how many next spans' rows.
struct Group {
    j: usize,
    n: usize,
    acts: usize,
    take: usize,
}

/// The token groups of [`fold_tiles`] in order: a prefill call's (`wide`) tiles name the
/// next group's activation rows, then the next spans' rows (`spans` of them, spread evenly
/// over the sweeps), one each.
struct Plan<K> {
    rb: usize,
    tb: usize,
    halves: bool,
    wide: bool,
    per_sweep: usize,
    left: usize,
    j: usize,
    tier: std::marker::PhantomData<K>,
}

impl<K: Kernel> Plan<K> {
    fn new(rb: usize, tb: usize, halves: bool, wide: bool, spans: usize) -> Self {
        let (mut sweeps, mut j) = (0, 0);
        while j < tb {
            j += group::<K>(tb - j, halves);
            sweeps += 1;
        }
        let left = if wide { spans } else { 0 };
        let per_sweep = left.div_ceil(sweeps.max(1));
        Self { rb, tb, halves, wide, per_sweep, left, j: 0, tier: std::marker::PhantomData }
    }
}

impl<K: Kernel> Iterator for Plan<K> {
    type Item = Group;

    fn next(&mut self) -> Option<Group> {
        let j = self.j;
        if j >= self.tb {
            return None;
        }
        let n = group::<K>(self.tb - j, self.halves);
        self.j += n;
        let acts = if self.wide && self.j < self.tb {
            group::<K>(self.tb - self.j, self.halves)
        } else {
            0
        };
        let tiles = self.rb.div_ceil(tile_rows::<K>(n, self.halves));
        let take = self.per_sweep.min(tiles.saturating_sub(acts)).min(self.left);
        self.left -= take;
        Some(Group { j, n, acts, take })
    }
}

/// `x`'s bytes: what a tile names to the prefetcher.
fn bytes(x: &[f32]) -> &[u8] {
    // SAFETY: an f32 is 4 initialised bytes with no padding, and u8 has alignment 1; the
    // borrow is shared and as long as `x`'s.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), size_of_val(x)) }
}

/// Weight rows per tile for a token group of `n`: 4 on 32-register tiers and for a lone
/// token; in halves, as many as leave one register for an activation and one per row for its
/// weights (`R · N + R + 1 ≤ 16`); otherwise 2.
pub(crate) fn tile_rows<K: Kernel>(n: usize, halves: bool) -> usize {
    if K::WIDE || n == 1 {
        4
    } else if halves {
        (15 / (n + 1)).min(4)
    } else {
        2
    }
}

/// What the prefill nest ([`crate::wide`]) asks of [`fold_tiles`] beyond the few-row nest's
/// plain tiles.
pub(crate) struct Prefill<'s> {
    /// Whether each `w(r)` is in the split order of [`Kernel::fold_half`] and the tiles fold
    /// one 8-lane half at a time (only on a tier with [`Kernel::HALVES`]).
    pub(crate) halves: bool,
    /// The aligned stage for a token group's activations: [`STAGE_ROWS`] rows of
    /// [`PANEL_STRIDE`] floats.
    pub(crate) stage: &'s mut [f32],
    /// The stored bytes the nest decodes next, one weight row's span each: the tiles that
    /// name no activations name them to the prefetcher, one each, spread over the sweeps
    /// ([`fold_tiles`] returns how many it named; the caller names the rest itself).
    pub(crate) next: &'s [&'s [u8]],
}

/// The size of the next token group when `left` activation rows are left. 32 registers:
/// groups of 6 tokens against rows 4 at a time (24 accumulators). 16 in halves: groups of 4
/// (5 to 7 tokens left: two groups of about half, rather than 4 and a rest of 1 to 3)
/// against row triples (12 registers). 16 in whole accumulators: groups of 3 (2 when that
/// leaves no group of 1) against row pairs (12 registers).
pub(crate) fn group<K: Kernel>(left: usize, halves: bool) -> usize {
    if K::WIDE {
        left.min(6)
    } else if halves {
        if left > 4 && left < 8 {
            left.div_ceil(2)
        } else {
            left.min(4)
        }
    } else {
        match left {
            1 => 1,
            2 | 4 => 2,
            _ => 3,
        }
    }
}

/// One token group's sweep over a span's rows: the arguments of [`fold_tiles`] that its
/// tiles share.
struct Sweep<'a> {
    rb: usize,
    stride: usize,
    j: usize,
    halves: bool,
    /// Whether the tiles fold through [`Kernel::fold_wide`] (the prefill nest).
    wide: bool,
    /// The next token group's activation rows: the sweep's `i`-th tile names row `i` to the
    /// prefetcher (empty rows: nothing).
    ahead: [&'a [u8]; STAGE_ROWS],
    /// How many of `ahead` are activation rows.
    acts: usize,
    /// The next spans' rows the sweep's tiles after the first `acts` name, one each.
    spans: &'a [&'a [u8]],
    /// The first row to sweep.
    r0: usize,
}

impl<'a> Sweep<'a> {
    /// What the sweep's `i`-th tile names to the prefetcher: a row of the next token group's
    /// activations, else a row of the next spans, else nothing.
    fn named(&self, i: usize) -> &'a [u8] {
        if i < self.acts {
            self.ahead[i]
        } else {
            self.spans.get(i - self.acts).copied().unwrap_or_default()
        }
    }

    /// Sweeps rows `r0..rb` for tokens `j..j + N` in tiles of as many rows as the registers
    /// hold ([`tile_rows`]).
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn run<'w, 'x, K: Kernel, const N: usize>(
        &self,
        w: &impl Fn(usize) -> &'w [f32],
        acc: &mut [Lanes],
        x: &impl Fn(usize) -> &'x [f32],
    ) {
        let most = tile_rows::<K>(N, self.halves);
        let t = Tile { stride: self.stride, j: self.j, halves: self.halves, wide: self.wide };
        let mut r = self.r0;
        let mut i = usize::from(self.r0 > 0);
        while r < self.rb {
            let a = &mut *acc;
            let ahead = self.named(i);
            i += 1;
            // SAFETY: the caller guarantees the tier (every arm).
            r += unsafe {
                match most.min(self.rb - r) {
                    4 => t.fold::<K, 4, N>(w, a, r, x, ahead),
                    3 => t.fold::<K, 3, N>(w, a, r, x, ahead),
                    2 => t.fold::<K, 2, N>(w, a, r, x, ahead),
                    _ => t.fold::<K, 1, N>(w, a, r, x, ahead),
                }
            };
        }
    }

    /// [`Sweep::run`] through an aligned copy of the activations: the first tile reads them
    /// where they are and copies them into `stage` (rows [`PANEL_STRIDE`] apart) as it loads
    /// them, the other tiles read the copy. Only for a sweep of at least one whole tile.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    ///
    /// # Panics
    /// If `stage` is shorter than `N` rows or a span longer than [`PANEL_STRIDE`].
    unsafe fn staged<'w, 'x, K: Kernel, const N: usize>(
        mut self,
        w: &impl Fn(usize) -> &'w [f32],
        acc: &mut [Lanes],
        x: &impl Fn(usize) -> &'x [f32],
        stage: &mut [f32],
    ) {
        let most = tile_rows::<K>(N, self.halves);
        // SAFETY: the caller guarantees the tier (every arm).
        unsafe {
            match most {
                4 => self.first::<K, 4, N>(w, acc, x, stage),
                3 => self.first::<K, 3, N>(w, acc, x, stage),
                2 => self.first::<K, 2, N>(w, acc, x, stage),
                _ => self.first::<K, 1, N>(w, acc, x, stage),
            }
        }
        let (j, len) = (self.j, x(self.j).len());
        let stage = &*stage;
        let xs = |i: usize| &stage[(i - j) * PANEL_STRIDE..][..len];
        self.r0 = most;
        // SAFETY: the caller guarantees the tier.
        unsafe { self.run::<K, N>(w, acc, &xs) };
    }

    /// The first R × N tile of [`Sweep::staged`] (rows `0..R`), copying the activations.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn first<'w, 'x, K: Kernel, const R: usize, const N: usize>(
        &self,
        w: &impl Fn(usize) -> &'w [f32],
        acc: &mut [Lanes],
        x: &impl Fn(usize) -> &'x [f32],
        stage: &mut [f32],
    ) {
        let (stride, j) = (self.stride, self.j);
        let len = x(j).len();
        let ws: [&[f32]; R] = std::array::from_fn(w);
        let xs: [&[f32]; N] = std::array::from_fn(|i| x(j + i));
        let mut rows = stage.chunks_exact_mut(PANEL_STRIDE);
        let st: [&mut [f32]; N] = std::array::from_fn(|_| {
            let row = rows.next().expect("fold_tiles: stage rows");
            &mut row[..len]
        });
        let mut accs = acc.chunks_exact_mut(stride);
        let a: [&mut [Lanes; N]; R] = std::array::from_fn(|_| {
            let row = accs.next().expect("invariant: R rows of accumulators (checked)");
            (&mut row[j..j + N]).try_into().expect("invariant: N tokens were sliced")
        });
        if self.halves {
            // SAFETY: the caller guarantees the tier; `fold_half_wide` checks the lengths.
            unsafe { K::fold_half_wide(ws, xs, a, self.named(0), Some(st)) };
        } else {
            // SAFETY: the caller guarantees the tier; `fold_wide` checks the slice lengths.
            unsafe { K::fold_wide(ws, xs, a, self.named(0), Some(st)) };
        }
    }
}

/// What every tile of a sweep shares.
struct Tile {
    stride: usize,
    j: usize,
    halves: bool,
    wide: bool,
}

impl Tile {
    /// Folds one R × N tile (rows `r..r + R`, tokens `j..j + N`), naming `ahead` to the
    /// prefetcher when `wide`; returns R.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn fold<'w, 'x, K: Kernel, const R: usize, const N: usize>(
        &self,
        w: &impl Fn(usize) -> &'w [f32],
        acc: &mut [Lanes],
        r: usize,
        x: &impl Fn(usize) -> &'x [f32],
        ahead: &[u8],
    ) -> usize {
        let (stride, j) = (self.stride, self.j);
        let ws: [&[f32]; R] = std::array::from_fn(|i| w(r + i));
        let xs: [&[f32]; N] = std::array::from_fn(|i| x(j + i));
        let mut rows = acc[r * stride..].chunks_exact_mut(stride);
        let a: [&mut [Lanes; N]; R] = std::array::from_fn(|_| {
            let row = rows.next().expect("invariant: R rows of accumulators (asserted)");
            (&mut row[j..j + N]).try_into().expect("invariant: N tokens were sliced")
        });
        if self.halves && self.wide {
            // SAFETY: the caller guarantees the tier; `fold_half_wide` checks the lengths.
            unsafe { K::fold_half_wide(ws, xs, a, ahead, None) };
        } else if self.halves {
            // SAFETY: the caller guarantees the tier; `fold_half` checks the slice lengths.
            unsafe { K::fold_half(ws, xs, a) };
        } else if self.wide {
            // SAFETY: the caller guarantees the tier; `fold_wide` checks the slice lengths.
            unsafe { K::fold_wide(ws, xs, a, ahead, None) };
        } else {
            // SAFETY: the caller guarantees the tier; `fold` checks the slice lengths.
            unsafe { K::fold(ws, xs, a) };
        }
        R
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token group once, in order; a group's tiles name at most one row each (the next
    /// group's activation rows first, then next spans' rows), the spans spread evenly.
    fn check<K: Kernel>(name: &str, halves: bool) {
        for rb in [1, 3, 4, 17, 64] {
            for tb in [1, 9, 12, 13, 64, 128] {
                for spans in [0, 1, 5, 64] {
                    let groups: Vec<Group> = Plan::<K>::new(rb, tb, halves, true, spans).collect();
                    let per_sweep = spans.div_ceil(groups.len());
                    let mut j = 0;
                    for g in &groups {
                        assert_eq!(g.j, j, "{name}: groups in order");
                        j += g.n;
                        let tiles = rb.div_ceil(tile_rows::<K>(g.n, halves));
                        assert!(g.acts <= STAGE_ROWS, "{name}: {} activation rows", g.acts);
                        assert!(g.take <= tiles.saturating_sub(g.acts), "{name}: one row a tile");
                        assert!(g.take <= per_sweep, "{name}: spread over the sweeps");
                    }
                    assert_eq!(j, tb, "{name}: every token once");
                    let last = groups.last().expect("tb > 0");
                    assert_eq!(last.acts, 0, "{name}: nothing after the last group");
                    let named: usize = groups.iter().map(|g| g.take).sum();
                    assert_eq!(named, spans_named::<K>(rb, tb, halves, spans), "{name}");
                    assert!(named <= spans, "{name}: {named} of {spans} spans");
                    if tb >= 64 && rb == 64 {
                        assert_eq!(named, spans, "{name}: a prefill call names every span");
                    }
                    let few: usize =
                        Plan::<K>::new(rb, tb, halves, false, spans).map(|g| g.take + g.acts).sum();
                    assert_eq!(few, 0, "{name}: the few-row nest names nothing");
                }
            }
        }
    }

    #[test]
    fn the_next_spans_were_named_in_a_burst_while_the_panel_was_decoded_now_tiles_name_them() {
        check::<crate::arch::Portable>("portable", false);
        #[cfg(target_arch = "x86_64")]
        {
            check::<crate::arch::avx512::Avx512>("avx512", false);
            check::<crate::arch::avx2::Avx2>("avx2 halves", true);
        }
    }
}
