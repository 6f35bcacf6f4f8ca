//! How a call is cut into the chunks the pool's threads claim ([`crate::matmul`]'s
//! `for_chunks` and [`crate::many`]): output rows first, on a guided schedule whose chunks
//! shrink as they go so that the threads finish together ([`split`], [`guided_cuts`]); a
//! small matrix by activation rows too; a packed prefill call ([`crate::packed`]) in whole row
//! groups of the outer nest and then, one row group at a time, by activation rows
//! ([`cut_guided`]). No cut changes a result bit: every cell is computed by the same code,
//! whichever chunk holds it.

use crate::packed::GROUP_TOKENS;
use crate::tiled::TOKEN_BLOCK;
use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

/// Below this many output rows a call runs on the calling thread.
const PAR_MIN_ROWS: usize = 64;
/// Below this many multiply-adds (`rows · cols · t`) a call runs on the calling thread alone:
/// handing chunks to the pool's helpers costs about a microsecond, more than the work itself.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;
/// Row chunks per pool thread wanted when a call is also split by activation rows.
const CHUNKS_PER_THREAD: usize = 4;
/// Fewest rows in a chunk of a call of few activation rows. Every cut between row chunks is a
/// multiple of it (the last chunk ends at the matrix's last row), which [`crate::finish`]
/// relies on to hand whole groups of rows to one chunk.
pub(crate) const MIN_CHUNK_ROWS: usize = 16;
// A prefill's coarse cuts are whole row groups of the wide nest, so multiples of it too.
const _: () = assert!(crate::wide::GROUP.is_multiple_of(MIN_CHUNK_ROWS));
/// Fewest activation rows in a chunk when a call of many activation rows is also split by
/// activation rows (each such chunk decodes its weights again).
const MIN_CHUNK_TOKENS: usize = 16;
/// Fewest activation rows in a chunk of a packed call cut by activation rows
/// ([`cut_guided`]), a multiple of the outer nest's token groups: each such chunk decodes
/// its row group's weights again.
pub(crate) const MIN_SLICE_TOKENS: usize = 48;
const _: () = assert!(MIN_SLICE_TOKENS.is_multiple_of(GROUP_TOKENS));
/// Fewest [`slice_units`] a thread for a packed call to be cut by [`cut_guided`]
/// ([`sliced_enough`]).
pub(crate) const SLICES_PER_THREAD: usize = 2;
/// Each row chunk takes `1 / (GUIDED_SHARE · threads)` of the rows not yet handed out.
pub(crate) const GUIDED_SHARE: usize = 2;

/// Activation rows per chunk when a call's `n` rows are cut into `token_chunks` chunks: whole
/// token groups where the chunks fold a pack (`grouped`: the outer nest folds whole groups, so
/// a pack's chunks start on them). [`crate::matmul::for_chunks`] and [`crate::many`] cut
/// calls alike.
pub(crate) fn token_chunk(n: usize, token_chunks: usize, grouped: bool) -> usize {
    let tc = n.div_ceil(token_chunks);
    if grouped {
        tc.next_multiple_of(GROUP_TOKENS)
    } else {
        tc
    }
}

/// Activation rows of token chunk `ti` of `tc` rows each ([`token_chunk`]) in a call of `n`
/// (empty past the last).
pub(crate) fn token_range(ti: usize, tc: usize, n: usize) -> Range<usize> {
    (ti * tc).min(n)..n.min((ti + 1) * tc)
}

/// How a call of `t` activation rows on a `rows × cols` matrix is split over `threads`: the
/// row chunks' boundaries (`cuts[i]..cuts[i + 1]`) and the number of activation-row chunks,
/// or `None` for a call the calling thread runs whole (nothing allocated then). Output rows are split first; a call with too few output rows to keep every thread busy and
/// many activation rows (a prefill on a small matrix) is split by activation rows too. Either
/// split computes every cell with the same code, so no result bit depends on it.
///
/// Row chunks shrink as they go ([`guided_cuts`]): the pool hands them out in order, so the
/// last ones claimed are small and the threads finish together. With equal chunks of a
/// quarter of a thread's share, the engine thread waited on the helpers' last chunks for
/// 13–15% of a 16-thread pass (the device host, `--stats`).
pub(crate) fn split(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
) -> Option<(Rc<[usize]>, usize)> {
    if threads <= 1 || rows * cols * t < PAR_MIN_WORK {
        return None;
    }
    let cuts = if rows < PAR_MIN_ROWS {
        // One chunk of every row (a chunk at least `rows` long).
        cached_cuts(rows, threads, rows, rows)
    } else if t > TOKEN_BLOCK {
        // A prefill's chunks keep whole row groups of the wide nest while many rows are left;
        // the last ones, which decide when the call ends, shrink below a group.
        cached_cuts(rows, threads, crate::wide::GROUP, MIN_CHUNK_ROWS)
    } else {
        cached_cuts(rows, threads, MIN_CHUNK_ROWS, MIN_CHUNK_ROWS)
    };
    let row_chunks = cuts.len() - 1;
    let token_chunks = if row_chunks < threads && t >= 2 * MIN_CHUNK_TOKENS {
        (threads * CHUNKS_PER_THREAD).div_ceil(row_chunks).min(t / MIN_CHUNK_TOKENS)
    } else {
        1
    };
    (row_chunks * token_chunks > 1).then_some((cuts, token_chunks))
}

/// The chunks `(activation rows, rows)` of a packed call (one the outer nest folds,
/// [`crate::packed`]) of `t` activation rows on a `rows × cols` matrix on a pool of
/// `threads`: [`cut_guided`] with token slices over the whole call where [`slices`] and
/// [`sliced_enough`] hold; otherwise as [`split`] cuts it
/// ([`chunk_list`]: a small matrix also by activation rows, on whole token groups), or one
/// chunk of everything where the call runs on the calling thread.
pub(crate) fn packed_chunks(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
) -> Vec<(Range<usize>, Range<usize>)> {
    let mut left = rows * cols * t;
    if threads <= 1
        || left < PAR_MIN_WORK
        || !slices(true, t)
        || !sliced_enough(threads, slice_units(rows, t))
    {
        // `split` runs the first two whole on the calling thread.
        return chunk_list(threads, rows, cols, t, true);
    }
    let mut chunks = Vec::new();
    cut_guided(threads, rows, cols, t, true, &mut left, |tk, r| chunks.push((tk, r)));
    chunks
}

/// The chunks `(activation rows, rows)` of a call of `t` activation rows on a `rows × cols`
/// matrix on a pool of `threads` as [`split`] cuts it: every row chunk of each non-empty
/// token chunk (whole token groups where `grouped`, [`token_chunk`]), token chunks outer; one
/// chunk of everything where the call runs on the calling thread.
pub(crate) fn chunk_list(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
    grouped: bool,
) -> Vec<(Range<usize>, Range<usize>)> {
    let Some((cuts, token_chunks)) = split(threads, rows, cols, t) else {
        return vec![(0..t, 0..rows)];
    };
    let tc = token_chunk(t, token_chunks, grouped);
    (0..token_chunks)
        .map(|ti| token_range(ti, tc, t))
        .filter(|tokens| !tokens.is_empty())
        .flat_map(|tokens| cuts.windows(2).map(move |r| (tokens.clone(), r[0]..r[1])))
        .collect()
}

/// Whether [`cut_guided`] cuts a part's last row groups by activation rows: a packed part
/// (`grouped`) of at least twice [`MIN_SLICE_TOKENS`] activation rows.
pub(crate) fn slices(grouped: bool, t: usize) -> bool {
    grouped && t >= 2 * MIN_SLICE_TOKENS
}

/// Slices of [`MIN_SLICE_TOKENS`] a part of `rows` × `t` activation rows holds: its row
/// groups times its activation rows' whole slices.
pub(crate) fn slice_units(rows: usize, t: usize) -> usize {
    rows.div_ceil(crate::wide::GROUP) * (t / MIN_SLICE_TOKENS)
}

/// Whether a packed call of `units` [`slice_units`] (summed over its parts) is cut by
/// [`cut_guided`] on a pool of `threads`: where they are at least [`SLICES_PER_THREAD`] a
/// thread.
/// Fewer row groups than threads were once cut as [`split`] cuts a small matrix, in 16-row
/// chunks; cut by [`cut_guided`] instead, the device host's 16 threads ran a 768 × 2,048
/// call at T = 256 (60 units) 1.18–1.22× and 512 × 7,168 (40) 1.06× faster, but 768 × 2,048
/// at T = 128 (24) 0.92× and 256 × 7,168 at T = 256 (20) 0.84–0.88× (issue 20, session 30).
pub(crate) fn sliced_enough(threads: usize, units: usize) -> bool {
    units >= SLICES_PER_THREAD * threads
}

/// Rows of a guided chunk that wants `want` rows: a multiple of `coarse` while `want` is at
/// least that, else of `fine` (at least `fine`).
fn guided_size(want: usize, coarse: usize, fine: usize) -> usize {
    if want >= coarse {
        want / coarse * coarse
    } else {
        (want / fine * fine).max(fine)
    }
}

/// Cuts a call's part of `rows` × `t` activation rows (weighed as `cols` columns) on a
/// guided schedule, `left` the work (`rows · cols · t` summed over the call's parts) not yet
/// handed out, updated: each chunk takes about `1 / (GUIDED_SHARE · threads)` of it, in whole
/// row groups of the outer nest ([`crate::wide::GROUP`], all the activation rows) while that
/// is at least one; then, where `slice` ([`slices`]: a packed part), whole row groups still
/// while more work is left than a row group for each thread, and only the last (about one a
/// thread) cut by activation rows, each in whole token groups of at least
/// [`MIN_SLICE_TOKENS`] and about `1 / threads` of the work left, so that the call still ends
/// evenly; otherwise in 16-row steps, as [`split`] cuts the other calls (cut only in whole row
/// groups, a 64-token call's last chunks left threads idle: T = 64 at 16 threads 60–69% of the
/// peak against 63–73%, session 28).
///
/// **Why slices.** Cut as the other nests' calls are, a packed call's last chunks shrank to
/// 16 rows: on 16 threads half of a 2,048-row call's rows were folded in 16-row chunks, whose
/// tiles hold one vector of rows (one weight load per six broadcast activations) and each of
/// which read the call's whole pack for its 16 rows, four times a row group's activation bytes
/// per FMA, from the L3 that the 16 cores share (docs/PERFORMANCE.md, issue 20, session 28).
/// A row group cut by activation rows keeps its tiles whole and reads only its tokens' share
/// of the pack; it decodes its weights once per chunk, which a chunk of at least
/// [`MIN_SLICE_TOKENS`] amortises.
///
/// **Why only the last row groups.** Slicing began where a guided share fell below a row
/// group: on 16 threads, at the second of a 2,048-row call's 32 groups, so most groups were
/// decoded two to five times for slices of 48–200 tokens. Keeping whole groups until one a
/// thread is left took the device host's 16-thread T = 256 call 1.03–1.05× faster at 1,024
/// and 2,048 rows (bf16 and MXFP4) and 1.02× at 7,168, medians of 21–41 interleaved pairs
/// (docs/PERFORMANCE.md, issue 20, session 30).
pub(crate) fn cut_guided(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
    slice: bool,
    left: &mut usize,
    mut push: impl FnMut(Range<usize>, Range<usize>),
) {
    let group = crate::wide::GROUP;
    let threads = threads.max(1);
    let share = GUIDED_SHARE * threads;
    let per_row = (cols * t).max(1);
    let mut r0 = 0;
    while r0 < rows {
        let mut want = *left / share / per_row;
        if slice && *left > threads * group * per_row {
            want = want.max(group);
        }
        if want >= group || !slice {
            let size = guided_size(want, group, MIN_CHUNK_ROWS).min(rows - r0);
            push(0..t, r0..r0 + size);
            *left = left.saturating_sub(size * per_row);
            r0 += size;
            continue;
        }
        let gr = group.min(rows - r0);
        let mut k0 = 0;
        while k0 < t {
            let want = *left / threads / (gr * cols).max(1);
            let mut n = (want / GROUP_TOKENS * GROUP_TOKENS).max(MIN_SLICE_TOKENS).min(t - k0);
            if t - k0 - n < MIN_SLICE_TOKENS {
                n = t - k0;
            }
            push(k0..k0 + n, r0..r0 + gr);
            *left = left.saturating_sub(n * gr * cols);
            k0 += n;
        }
        r0 += gr;
    }
}

/// [`guided_cuts`], kept per thread for the shapes seen last (a pass multiplies a few dozen
/// shapes thousands of times; computing the cuts was a visible share of the engine thread's
/// own work in a one-row decode).
fn cached_cuts(rows: usize, threads: usize, coarse: usize, fine: usize) -> Rc<[usize]> {
    /// Shapes kept (a model has a few dozen; the cache starts over when full).
    const KEPT: usize = 64;
    /// (rows, threads, coarse, fine) and the cuts of that shape.
    type Kept = Vec<((usize, usize, usize, usize), Rc<[usize]>)>;
    thread_local! {
        static CUTS: RefCell<Kept> = const { RefCell::new(Vec::new()) };
    }
    CUTS.with(|c| {
        let mut c = c.borrow_mut();
        let key = (rows, threads, coarse, fine);
        if let Some((_, cuts)) = c.iter().find(|(k, _)| *k == key) {
            return Rc::clone(cuts);
        }
        if c.len() >= KEPT {
            c.clear();
        }
        let cuts: Rc<[usize]> = guided_cuts(rows, threads, coarse, fine).into();
        c.push((key, Rc::clone(&cuts)));
        cuts
    })
}

/// Boundaries of row chunks over `0..rows`, each `1 / (GUIDED_SHARE · threads)` of the rows
/// left: a multiple of `coarse` while that share is at least `coarse`, then of `fine` (at
/// least `fine`; the last one takes what remains). A prefill's last chunks of whole 64-row
/// groups were a large share of a small call (an expert's 3,072 rows are 48 groups, three a
/// thread at 16 threads), so the engine thread waited on the helpers' last ones.
fn guided_cuts(rows: usize, threads: usize, coarse: usize, fine: usize) -> Vec<usize> {
    let mut cuts = vec![0];
    let mut start = 0;
    while start < rows {
        let left = rows - start;
        let want = left / (GUIDED_SHARE * threads);
        start += guided_size(want, coarse, fine).min(left);
        cuts.push(start);
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_row_chunks_left_the_engine_thread_waiting_on_the_helpers_last_ones() {
        for (rows, threads, coarse, fine) in
            [(3072, 16, 16, 16), (7168, 16, 64, 64), (3584, 2, 16, 16), (100, 3, 16, 16)]
        {
            let cuts = guided_cuts(rows, threads, coarse, fine);
            assert_eq!((cuts[0], cuts[cuts.len() - 1]), (0, rows));
            let sizes: Vec<usize> = cuts.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");
            // Whole groups and shrinking, but for the remainder at the end.
            let body = &sizes[..sizes.len() - 1];
            assert!(body.iter().all(|&s| s % coarse == 0), "{sizes:?}");
            assert!(body.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
            // The last chunks are the smallest: a thread that claims one ends soon after.
            assert!(sizes[sizes.len() - 1] <= coarse, "{sizes:?}");
            assert!(sizes.len() <= 8 * threads + rows / (rows / coarse).max(1), "{sizes:?}");
        }
        // A prefill on a small matrix is still split by activation rows.
        let (cuts, token_chunks) = split(16, 64, 4096, 256).expect("split");
        assert!(cuts.len() - 1 < 16 && token_chunks > 1, "{cuts:?} {token_chunks}");
        assert_eq!(split(1, 4096, 4096, 1), None);
        // Few rows and one activation row: run whole, nothing to hand out.
        assert_eq!(split(16, 32, 4096, 1), None);
        assert_eq!(*cached_cuts(3072, 16, 16, 16), *guided_cuts(3072, 16, 16, 16));
        assert_eq!(*cached_cuts(3072, 16, 16, 16), *guided_cuts(3072, 16, 16, 16), "cached");
    }

    #[test]
    fn a_prefill_calls_last_chunks_of_whole_row_groups_left_the_engine_thread_waiting() {
        // An expert's gate projection in a 16-thread prefill: 48 groups of 64 rows.
        for (rows, threads) in [(3072, 16), (7168, 16), (3072, 2), (2048, 16), (64 * 3 + 16, 4)] {
            let cuts = guided_cuts(rows, threads, 64, 16);
            assert_eq!((cuts[0], cuts[cuts.len() - 1]), (0, rows));
            let sizes: Vec<usize> = cuts.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
            // Chunks of a group or more keep whole groups; the smaller ones whole 16-row steps.
            assert!(sizes.iter().all(|&s| s % 16 == 0 && (s < 64 || s % 64 == 0)), "{sizes:?}");
            assert_eq!(sizes[sizes.len() - 1], 16, "{sizes:?}");
        }
        let (cuts, _) = split(16, 3072, 7168, 11).expect("split");
        assert_eq!(cuts[cuts.len() - 1] - cuts[cuts.len() - 2], 16, "{cuts:?}");
    }

    #[test]
    fn packed_calls_last_chunks_were_16_row_chunks_rereading_the_whole_pack_now_row_groups_cut_by_tokens(
    ) {
        for (threads, rows, cols, t) in [
            (16, 2048, 7168, 264),
            (16, 3072, 3584, 256),
            (16, 7168, 2048, 264),
            (2, 2048, 7168, 264),
            (3, 200, 1024, 100),
            (16, 64, 4096, 256),
            (16, 40, 4096, 100),
            (16, 2048, 7168, 64),
            (2, 300, 1024, 95),
            (16, 768, 2048, 256),
            (16, 256, 7168, 256),
        ] {
            let chunks = packed_chunks(threads, rows, cols, t);
            // Every (token, row) cell once.
            let mut seen = vec![0u8; rows * t];
            for (tk, r) in &chunks {
                for j in tk.clone() {
                    for i in r.clone() {
                        seen[j * rows + i] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{threads} {rows}x{cols} t={t}: {chunks:?}");
            let min = MIN_SLICE_TOKENS;
            if t < 2 * min || !sliced_enough(threads, slice_units(rows, t)) {
                // Too few activation rows or row groups to cut so: as `split` cuts the call.
                let (cuts, token_chunks) = split(threads, rows, cols, t).expect("split");
                let tc = token_chunk(t, token_chunks, true);
                assert!(chunks.iter().all(|(tk, _)| tk.start % tc == 0 && !tk.is_empty()));
                assert_eq!(chunks.len(), (cuts.len() - 1) * t.div_ceil(tc), "{chunks:?}");
                continue;
            }
            for (tk, r) in &chunks {
                // Whole row groups (the last may be the matrix's remainder), so whole 16-row
                // steps for `crate::finish`; token slices on whole token groups, of at least
                // the minimum.
                assert!(r.start % 64 == 0 && (r.len() % 64 == 0 || r.end == rows), "{r:?}");
                assert!(tk.start % GROUP_TOKENS == 0, "{tk:?}");
                assert!(tk.len() >= min, "{tk:?} of {t}");
                assert!(tk.len() == t || r.len() <= 64, "{tk:?} {r:?}");
            }
            // Spread over the threads, and no chunk of fewer than 64 rows where there are 64.
            assert!(chunks.len() >= threads.min(slice_units(rows, t)), "{chunks:?}");
            assert!(chunks.iter().all(|(_, r)| r.len() >= 64.min(rows - r.start)));
            assert!(chunks.iter().any(|(tk, _)| tk.len() < t), "cut by tokens: {chunks:?}");
        }
        assert_eq!(packed_chunks(1, 2048, 7168, 264), vec![(0..264, 0..2048)]);
    }

    #[test]
    fn packed_calls_sliced_from_their_second_row_group_decoded_most_groups_again_now_whole_until_one_a_thread(
    ) {
        for (threads, rows, cols, t) in [
            (16, 2048, 7168, 256),
            (16, 1024, 7168, 256),
            (16, 7168, 7168, 256),
            (4, 640, 2048, 96),
            (16, 768, 2048, 256),
        ] {
            let chunks = packed_chunks(threads, rows, cols, t);
            let groups = rows.div_ceil(64);
            // Row groups cut by activation rows, each counted once.
            let mut cut: Vec<usize> =
                chunks.iter().filter(|(tk, _)| tk.len() < t).map(|(_, r)| r.start / 64).collect();
            cut.dedup();
            // Only the last ones, no more than one a thread, and some: the call ends evenly.
            assert!(!cut.is_empty() && cut.len() <= threads, "{threads} {rows}: {chunks:?}");
            assert!(
                cut.iter().all(|&g| g >= groups.saturating_sub(threads)),
                "{threads} {rows}: {cut:?}"
            );
            // The whole ones first, in chunks of whole groups.
            let whole = chunks.iter().take_while(|(tk, _)| tk.len() == t);
            assert!(whole.clone().all(|(_, r)| r.len() % 64 == 0), "{chunks:?}");
            assert_eq!(whole.map(|(_, r)| r.len()).sum::<usize>(), 64 * cut[0], "{chunks:?}");
        }
    }
}
