//! The loop nest of prefill-sized calls (more than [`crate::tiled::TOKEN_BLOCK`] activation
//! rows), and the
//! register-tile dispatch every several-row fold shares.
//!
//! A call of T activation rows against a weight matrix is compute-bound once T is large, so
//! the nest is arranged so that the FMA units, not a cache level, set the pace:
//!
//! - **Token blocks** of up to [`WIDE_TOKEN_BLOCK`] activation rows: the weights are read from
//!   memory and widened once per block, so a weight byte serves 64 activation rows.
//! - **Row groups** of [`GROUP`] weight rows within a block: the block's activations are read
//!   from L3 once per group, so an activation value serves 32 weight rows (row blocks of 8, as
//!   the few-row nest uses, made the activations' L3 traffic the bound).
//! - **Column chunks** of [`WIDE_CHUNK`] within a group: the group's chunk is widened to f32
//!   once into a panel (128 KiB, in L2), and every (row, activation row) pair's 16-lane
//!   accumulator lives in a buffer (the group × block accumulators: up to 128 KiB, in L2)
//!   between chunks. The chunk is twice the few-row nest's [`CHUNK`], so that a register
//!   tile runs 64 steps of 16 columns per call instead of 32: the per-tile costs (the call,
//!   its accumulators loaded and stored, the loop's exit) are paid half as often, while a
//!   token group's activations (up to 6 × 4 KiB) and a tile's weight rows still fit in L1
//!   (2048 columns did not: measured in docs/PERFORMANCE.md, issue 20, session 11).
//! - **The next span prefetched a whole chunk ahead**: while row `i` of the panel is decoded,
//!   the bytes it will decode next (the same row's next chunk, or row `i` of the next group)
//!   are named to the prefetcher, one row at a time rather than in a burst that would queue
//!   the decode's own loads behind it. A group's rows lie a whole row apart, a pattern the
//!   hardware prefetchers follow poorly, so without this the decode waited on memory.
//! - **No allocation per call**: the panel, accumulators and activation tails are one
//!   thread-local [`Scratch`] per thread, sized for the largest call ([`WIDE_SCRATCH_BYTES`])
//!   when the thread first makes such a call, and never zeroed again (every value a call reads
//!   it has written first).
//! - **Register tiles** within a chunk: tokens in groups of 6 (3 on tiers of 16 registers),
//!   each group's chunk of activations (up to 24 KiB) held in L1 while the tile sweeps the
//!   group's rows 4 (2) at a time; a tile is nothing but R + N loads per R · N FMAs per
//!   16-column step.
//!
//! **Exactness** is the few-row nest's ([`crate::tiled`]): accumulators start at +0.0, are
//! stored and reloaded bit-unchanged between chunks, every span starts at a multiple of 16
//! columns and spans are folded in increasing column order, and the final partial 16-column
//! step folds +0.0-padded weights against −0.0-padded activations (`fma(+0, −0, acc) = acc`,
//! −0.0 accumulators included).
//! So every result is the canonical reduction of [`crate::matmul`], whatever the blocking.

use std::cell::RefCell;
use std::ops::Range;

use crate::arch::prefetch;
use crate::formats::Format;
use crate::matmul::{reduce16, Matrix};
use crate::tiled::{Kernel, Lanes, CHUNK};

/// Most activation rows per token block.
pub(crate) const WIDE_TOKEN_BLOCK: usize = 64;
/// Columns per chunk of the wide nest: a multiple of [`CHUNK`] (so of every format's block).
pub(crate) const WIDE_CHUNK: usize = 2 * CHUNK;
/// Weight rows per row group.
pub(crate) const GROUP: usize = 32;

/// The most bytes one thread's calls of more than eight activation rows keep for themselves
/// (its f32 weight panel, accumulators and padded activation tails), whatever the row count:
/// allocated by the first such call on a thread and reused by every later one for the
/// thread's life, a fixed cost per kernel thread that a memory plan's headroom must cover.
pub const WIDE_SCRATCH_BYTES: usize =
    (GROUP * WIDE_CHUNK + GROUP * WIDE_TOKEN_BLOCK * 16 + WIDE_TOKEN_BLOCK * 16) * 4;

/// One thread's buffers for the wide nest, sized for the largest call, so that no call
/// allocates or zeroes them again: the weight panel, the accumulators of a row group × token
/// block, and the activations' partial 16-column tails.
struct Scratch {
    panel: Vec<f32>,
    acc: Vec<Lanes>,
    xpad: Vec<Lanes>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            panel: vec![0.0; GROUP * WIDE_CHUNK],
            acc: vec![[0.0; 16]; GROUP * WIDE_TOKEN_BLOCK],
            xpad: vec![[0.0; 16]; WIDE_TOKEN_BLOCK],
        }
    }
}

const _: () = assert!(size_of::<Scratch>() < 128, "the buffers live on the heap");
const _: () = assert!(WIDE_CHUNK.is_multiple_of(CHUNK));

thread_local! {
    /// This thread's [`Scratch`], made by its first wide call.
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// `emit(ti, r, Σ_c W[r, c] · x[ti, c])` for every `r` in `rows` and `ti < t`, each sum in the
/// canonical order, on the tier `K`, for any `t` (meant for `t` > [`crate::tiled::TOKEN_BLOCK`]).
/// Runs in this thread's reusable [`Scratch`] (a fresh one if this thread is already inside a
/// call, which only an `emit` that calls back into the kernels would cause).
///
/// # Safety
/// The running CPU supports the tier `K`.
///
/// # Panics
/// If `x` is not `t * m.cols()` long or `rows` runs past `m.rows()`.
pub(crate) unsafe fn run<K: Kernel, F: Format>(
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    emit: impl FnMut(usize, usize, f32),
) {
    assert_eq!(x.len(), t * m.cols(), "matmul: x length");
    assert!(rows.end <= m.rows(), "matmul: row range");
    if t == 0 || rows.is_empty() {
        return;
    }
    let mut emit = Some(emit);
    let mut go = |s: &mut Scratch| {
        if let Some(emit) = emit.take() {
            // SAFETY: guaranteed by the caller.
            unsafe { run_in::<K, F>(s, m, x, t, rows.clone(), emit) };
        }
    };
    // A thread that is being torn down has no scratch left to lend: it gets a fresh one too.
    let lent = SCRATCH.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => go(slot.get_or_insert_with(Scratch::new)),
        Err(_) => go(&mut Scratch::new()),
    });
    if lent.is_err() {
        go(&mut Scratch::new());
    }
}

/// [`run`] in the buffers `s`, for `t > 0` and non-empty `rows`.
///
/// # Safety
/// The running CPU supports the tier `K`.
unsafe fn run_in<K: Kernel, F: Format>(
    s: &mut Scratch,
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    mut emit: impl FnMut(usize, usize, f32),
) {
    let cols = m.cols();
    // Blocks of equal size, so that none is left with a lone activation row.
    let size = t.div_ceil(t.div_ceil(WIDE_TOKEN_BLOCK));
    let main_cols = cols - cols % 16;
    for t0 in (0..t).step_by(size) {
        let n = size.min(t - t0);
        for (j, p) in s.xpad[..n].iter_mut().enumerate() {
            *p = [-0.0; 16];
            p[..cols - main_cols]
                .copy_from_slice(&x[(t0 + j) * cols + main_cols..][..cols - main_cols]);
        }
        for g0 in rows.clone().step_by(GROUP) {
            let gr = GROUP.min(rows.end - g0);
            let acc = &mut s.acc[..gr * n];
            acc.fill([0.0; 16]);
            for c0 in (0..cols).step_by(WIDE_CHUNK) {
                let len = WIDE_CHUNK.min(cols - c0);
                let main = len - len % 16;
                // Where each panel row's next span lies (this row's next chunk, the same row
                // of the next group, or of the first group again for the next token block).
                let (pr0, pc0) = if c0 + WIDE_CHUNK < cols {
                    (g0, c0 + WIDE_CHUNK)
                } else if g0 + GROUP < rows.end {
                    (g0 + GROUP, 0)
                } else {
                    (rows.start, 0)
                };
                let pn = GROUP.min(rows.end - pr0);
                for (i, p) in s.panel.chunks_exact_mut(WIDE_CHUNK).take(gr).enumerate() {
                    if i < pn {
                        prefetch_span(m, pr0 + i, pc0);
                    }
                    // SAFETY: the caller guarantees the tier; the span `c0..c0 + len` lies in
                    // the row, `c0` is a multiple of `WIDE_CHUNK` (so of every format's block)
                    // and `len` either `WIDE_CHUNK` or the rest of the row.
                    unsafe { K::decode::<F>(F::row(m, g0 + i), c0, &mut p[..len]) };
                    p[len..len.next_multiple_of(16)].fill(0.0);
                }
                for i in gr..pn {
                    prefetch_span(m, pr0 + i, pc0);
                }
                let panel = &s.panel;
                let w = |r: usize| &panel[r * WIDE_CHUNK..][..main];
                let xs = |j: usize| &x[(t0 + j) * cols + c0..][..main];
                // SAFETY: the caller guarantees the tier.
                unsafe { fold_tiles::<K>(&w, gr, n, acc, n, &xs) };
                if main < len {
                    let w = |r: usize| &panel[r * WIDE_CHUNK + main..][..16];
                    let xs = |j: usize| &s.xpad[j][..];
                    // SAFETY: the caller guarantees the tier.
                    unsafe { fold_tiles::<K>(&w, gr, n, acc, n, &xs) };
                }
            }
            for (i, a) in acc.chunks_exact(n).enumerate() {
                let row = F::row(m, g0 + i);
                for (j, lanes) in a.iter().enumerate() {
                    emit(t0 + j, g0 + i, F::finish(row, reduce16(*lanes)));
                }
            }
        }
    }
}

/// Names to the prefetcher the stored bytes of columns `c0 .. c0 + WIDE_CHUNK` (clamped to
/// the row) of row `r`: its weights and its share of the scales. Every format stores the same
/// number of bytes per 32 columns of a row, row after row; FP8's scales, which serve 128 rows,
/// give an approximate span, which is harmless: a prefetch changes no result.
fn prefetch_span(m: &Matrix<'_>, r: usize, c0: usize) {
    let cols = m.cols().max(1);
    for buf in m.rows_bytes(r..r + 1) {
        let (a, b) = (buf.len() * c0 / cols, buf.len() * (c0 + WIDE_CHUNK).min(cols) / cols);
        prefetch(buf.get(a..b).unwrap_or_default());
    }
}

/// Folds one span of widened weights into the accumulators of `rb` weight rows × `tb`
/// activation rows in register tiles: `w(r)` is row `r`'s span, `x(j)` activation row `j`'s
/// (all the same length, a multiple of 16), and `acc[r * stride + j]` is the pair's
/// accumulator. Token groups go outermost, so a group's activations stay in L1 while its tile
/// sweeps the rows.
///
/// # Safety
/// The running CPU supports the tier `K`.
///
/// # Panics
/// If `acc` is shorter than `rb` rows of `stride ≥ tb` accumulators.
pub(crate) unsafe fn fold_tiles<'w, 'x, K: Kernel>(
    w: &impl Fn(usize) -> &'w [f32],
    rb: usize,
    tb: usize,
    acc: &mut [Lanes],
    stride: usize,
    x: &impl Fn(usize) -> &'x [f32],
) {
    assert!(stride >= tb && acc.len() >= rb * stride, "fold_tiles: accumulators");
    let mut j = 0;
    while j < tb {
        // 32 registers: groups of 6 tokens against rows 4 at a time (24 accumulators). 16:
        // groups of 3 (2 when that leaves no group of 1) against row pairs (12 registers).
        let n = if K::WIDE {
            (tb - j).min(6)
        } else {
            match tb - j {
                1 => 1,
                2 | 4 => 2,
                _ => 3,
            }
        };
        let mut r = 0;
        while r < rb {
            let four = K::WIDE && rb - r >= 4;
            let two = rb - r >= 2;
            let a = &mut *acc;
            // SAFETY: the caller guarantees the tier (for every arm).
            r += unsafe {
                match (n, four, two) {
                    (6, true, _) => tile::<K, 4, 6>(w, a, stride, r, j, x),
                    (6, _, true) => tile::<K, 2, 6>(w, a, stride, r, j, x),
                    (6, _, _) => tile::<K, 1, 6>(w, a, stride, r, j, x),
                    (5, true, _) => tile::<K, 4, 5>(w, a, stride, r, j, x),
                    (5, _, true) => tile::<K, 2, 5>(w, a, stride, r, j, x),
                    (5, _, _) => tile::<K, 1, 5>(w, a, stride, r, j, x),
                    (4, true, _) => tile::<K, 4, 4>(w, a, stride, r, j, x),
                    (4, _, true) => tile::<K, 2, 4>(w, a, stride, r, j, x),
                    (4, _, _) => tile::<K, 1, 4>(w, a, stride, r, j, x),
                    (3, true, _) => tile::<K, 4, 3>(w, a, stride, r, j, x),
                    (3, _, true) => tile::<K, 2, 3>(w, a, stride, r, j, x),
                    (3, _, _) => tile::<K, 1, 3>(w, a, stride, r, j, x),
                    (2, true, _) => tile::<K, 4, 2>(w, a, stride, r, j, x),
                    (2, _, true) => tile::<K, 2, 2>(w, a, stride, r, j, x),
                    (2, _, _) => tile::<K, 1, 2>(w, a, stride, r, j, x),
                    // A lone token takes rows four at a time on every tier (4 × 2 registers).
                    (_, _, _) if rb - r >= 4 => tile::<K, 4, 1>(w, a, stride, r, j, x),
                    (_, _, true) => tile::<K, 2, 1>(w, a, stride, r, j, x),
                    (_, _, _) => tile::<K, 1, 1>(w, a, stride, r, j, x),
                }
            };
        }
        j += n;
    }
}

/// Folds one R × N tile (rows `r..r + R`, tokens `j..j + N`); returns R.
///
/// # Safety
/// The running CPU supports the tier `K`.
unsafe fn tile<'w, 'x, K: Kernel, const R: usize, const N: usize>(
    w: &impl Fn(usize) -> &'w [f32],
    acc: &mut [Lanes],
    stride: usize,
    r: usize,
    j: usize,
    x: &impl Fn(usize) -> &'x [f32],
) -> usize {
    let ws: [&[f32]; R] = std::array::from_fn(|i| w(r + i));
    let xs: [&[f32]; N] = std::array::from_fn(|i| x(j + i));
    let mut rows = acc[r * stride..].chunks_exact_mut(stride);
    let a: [&mut [Lanes; N]; R] = std::array::from_fn(|_| {
        let row = rows.next().expect("invariant: R rows of accumulators (asserted)");
        (&mut row[j..j + N]).try_into().expect("invariant: N tokens were sliced")
    });
    // SAFETY: the caller guarantees the tier; `fold` checks the slice lengths.
    unsafe { K::fold(ws, xs, a) };
    R
}
