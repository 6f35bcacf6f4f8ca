//! The loop nest of prefill-sized calls (more than [`crate::tiled::TOKEN_BLOCK`] activation
//! rows); its register tiles are [`crate::sweep`]'s. On the AVX-512 and AVX2 tiers, calls of
//! at least 33 rows (through `matmul`, `matmul_then`, `matmul_pair`, or a layer's batched
//! experts, `crate::many`) take the outer-product nest instead (`crate::outer`, over
//! activations packed once per call: `crate::packed`), which runs in this module's scratch;
//! fewer rows, other tiers, and calls that find the pack buffer lent run here.
//!
//! A call of T activation rows against a weight matrix is compute-bound once T is large, so
//! the nest is arranged so that the FMA units, not a cache level, set the pace:
//!
//! - **Token blocks** of up to [`WIDE_TOKEN_BLOCK`] activation rows: the weights are read from
//!   memory and widened once per block, so a weight byte serves 128 activation rows (64
//!   left f32, BF16 and FP8 weights 2–5 points short at T=256, their decode a larger share:
//!   measured in docs/PERFORMANCE.md, issue 20, session 13).
//! - **Row groups** of [`GROUP`] weight rows within a block: the block's activations are read
//!   from L3 once per group, so an activation value serves 64 weight rows, and a token
//!   group's activations, once in L1, serve 16 register tiles (row blocks of 8, as the
//!   few-row nest uses, made the activations' L3 traffic the bound; groups of 64 rather than
//!   32 gained 2–6 points once the next token group was prefetched and staged: measured in
//!   docs/PERFORMANCE.md, issue 20, session 15).
//! - **Column chunks** of [`WIDE_CHUNK`] within a group: the group's chunk is widened to f32
//!   once into a panel (260 KiB, in L2; rows [`PANEL_STRIDE`] apart), and every (row,
//!   activation row) pair's 16-lane accumulator lives in a buffer (the group × block
//!   accumulators: up to 512 KiB, in L2: 2 MiB on the device's Xeon, only 1.25 MiB on the
//!   dev VM's, where with the block's activations they overflow it, session 22) between
//!   chunks. The chunk is twice the few-row nest's [`CHUNK`], so that a register tile runs
//!   64 steps of 16 columns per call instead of 32: the per-tile costs (the call, its
//!   accumulators loaded and stored, the loop's exit) are paid half as often, while a
//!   token group's activations (up to 6 × 4 KiB) and a tile's weight rows still fit in L1
//!   (2048 columns did not: measured in docs/PERFORMANCE.md, issue 20, session 11).
//! - **The next span prefetched a whole chunk ahead**: the bytes each panel row decodes next
//!   (the same row's next chunk, or the same row of the next group) are named to the
//!   prefetcher by the fold's tiles, one row's span per tile that names no activations,
//!   spread evenly over the token groups' sweeps ([`crate::sweep`]), so the lines arrive
//!   while the FMAs run. A group's rows lie a whole row apart, a pattern the hardware
//!   prefetchers follow poorly, so without this the decode waited on memory; naming them
//!   while the panel was decoded, one row per row decoded, left the decode waiting on the
//!   line fill buffers instead (+1–2 points of the FMA peak for bf16, +2–3 for f32 at
//!   T=256, one thread: docs/PERFORMANCE.md, issue 20, session 22). What the tiles cannot
//!   name (a call of few token groups) and every row's share of the scales are still named
//!   during the decode.
//! - **No allocation per call**: the panel, accumulators, activation tails and stage are one
//!   thread-local [`Scratch`] per thread, sized for the largest call ([`WIDE_SCRATCH_BYTES`])
//!   when the thread first makes such a call, and never zeroed again (every value a call reads
//!   it has written first).
//! - **Cache-line-aligned scratch, panel rows off the 4 KiB stride**: the scratch is made of
//!   64-byte [`Line`]s, so no 16-lane load of the panel or of an accumulator straddles two
//!   cache lines. A `Vec<f32>` of this size comes from `mmap` 16 bytes past a page, which made
//!   every AVX-512 weight load a split load (two of L1's loads, and two lines to wait for from
//!   L2), and half of AVX2's. And the panel's rows lie one line more than a chunk apart, so
//!   that a tile's rows at the same column fall in different L1 sets rather than all in one
//!   (measured in docs/PERFORMANCE.md, issue 20, session 13).
//! - **Register tiles** within a chunk ([`crate::sweep`]): tokens in groups of 6 (4 on
//!   AVX2), each group's chunk of activations (up to 24 KiB) held in L1 while the tile sweeps
//!   the group's rows 4 (3 on AVX2) at a time; a tile is nothing but R + N loads per R · N
//!   FMAs per 16-column step. The fold loop names the next token group's activations to the
//!   prefetcher as it goes (on AVX-512 it also takes two steps per iteration), and a group
//!   whose activations do not start on a cache line (a large `Vec<f32>` starts 16 bytes past
//!   one) is read from an aligned copy its first tile makes (the **stage**, six rows in the
//!   scratch): each worth a few points of the FMA peak, measured in docs/PERFORMANCE.md,
//!   issue 20, session 14. The fold itself (weights from the L2 panel, activations from L1)
//!   reaches about two thirds of the peak in a micro-benchmark, the same loop over data
//!   held in L1 three quarters, and the same loop run 8 times longer per tile (its weights
//!   then in L1) 85%. Prefetching the next tile's weight rows or accumulators into L1 near
//!   a tile's end gained nothing, and a profile puts nine tenths of the fold's time in its
//!   steady loop: what remains is the rate of that loop on weights streamed from the L2
//!   panel (session 15).
//! - **Halves on AVX2** ([`Kernel::HALVES`]): a 16-lane accumulator takes two of its sixteen
//!   registers, so tiles fold lanes 0–7 over the whole span and then lanes 8–15
//!   ([`Kernel::fold_half`]), one register per accumulator: 3 × 4 tiles, 7 loads per 12 FMAs
//!   (whole accumulators allowed 2 × 3, 10 loads per 12 FMAs). Each panel row is stored
//!   half-split (every step's low 8 lanes, then every step's high 8; `split_halves`), so each
//!   half's pass reads its weights contiguously, half the cache lines of a column-ordered
//!   panel (measured in docs/PERFORMANCE.md, issue 20, session 12).
//!
//! **Exactness** is the few-row nest's ([`crate::tiled`]): lanes are independent, so folding
//! one half before the other, or reading weights in the split order, changes no lane's
//! sequence of FMAs; accumulators start at +0.0, are
//! stored and reloaded bit-unchanged between chunks, every span starts at a multiple of 16
//! columns and spans are folded in increasing column order, and the final partial 16-column
//! step folds +0.0-padded weights against −0.0-padded activations (`fma(+0, −0, acc) = acc`,
//! −0.0 accumulators included).
//! So every result is the canonical reduction of [`crate::matmul`], whatever the blocking.

use std::cell::RefCell;
use std::ops::Range;

use crate::arch::prefetch;
use crate::formats::Format;
use crate::matmul::Matrix;
use crate::sweep::{fold_tiles, Prefill};
use crate::tiled::{Kernel, Lanes, CHUNK};

/// Most activation rows per token block.
pub(crate) const WIDE_TOKEN_BLOCK: usize = 128;
/// Columns per chunk of the wide nest: a multiple of [`CHUNK`] (so of every format's block).
pub(crate) const WIDE_CHUNK: usize = 2 * CHUNK;
/// Weight rows per row group.
pub(crate) const GROUP: usize = 64;
/// Floats from one panel row to the next: a chunk and one cache line, so that the rows of a
/// tile, read at the same column, do not all map to the same L1 set.
pub(crate) const PANEL_STRIDE: usize = WIDE_CHUNK + 16;

/// The most bytes one thread's calls of more than eight activation rows keep for themselves
/// (its f32 weight panel, accumulators and padded activation tails), whatever the row count:
/// allocated by the first such call on a thread and reused by every later one for the
/// thread's life, a fixed cost per kernel thread that a memory plan's headroom must cover.
/// The buffers a prefill call's activations are packed into are the pool's, not a thread's
/// ([`crate::pool_scratch_bytes`]).
pub const WIDE_SCRATCH_BYTES: usize =
    (GROUP * PANEL_STRIDE + ACC_LINES * 16 + WIDE_TOKEN_BLOCK * 16 + STAGE_ROWS * PANEL_STRIDE) * 4;

/// Accumulator lines of the scratch: a row group × token block of this nest, or the outer
/// nest's block ([`crate::outer`]), whichever is more.
#[cfg(target_arch = "x86_64")]
const ACC_LINES: usize = max(GROUP * WIDE_TOKEN_BLOCK, crate::outer::ACC_FLOATS / 16);
#[cfg(not(target_arch = "x86_64"))]
const ACC_LINES: usize = GROUP * WIDE_TOKEN_BLOCK;

/// The larger of `a` and `b`, in a constant.
#[cfg(target_arch = "x86_64")]
const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

// The outer nest runs in this scratch: its panel, accumulators and decode stage fit.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    crate::outer::PANEL_FLOATS <= GROUP * PANEL_STRIDE
        && crate::outer::STAGE_FLOATS <= STAGE_ROWS * PANEL_STRIDE
);

/// Activation rows of the aligned stage: a token group of the widest tile (4 × 6).
pub(crate) const STAGE_ROWS: usize = 6;

/// 16 floats on a cache line of their own: the unit of the scratch buffers, so that every
/// 16-lane load and store of a panel row, an accumulator or an activation tail is aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

const _: () = assert!(size_of::<Line>() == 64 && align_of::<Line>() == 64);
const _: () = assert!(PANEL_STRIDE.is_multiple_of(16));

/// `lines` as the floats they hold.
fn floats(lines: &[Line]) -> &[f32] {
    // SAFETY: `Line` is `repr(C)` around `[f32; 16]` and exactly 64 bytes (asserted), so the
    // lines are `16 * len` contiguous, initialised f32s; the borrow is shared.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), lines.len() * 16) }
}

/// `lines` as the floats they hold, mutably.
fn floats_mut(lines: &mut [Line]) -> &mut [f32] {
    // SAFETY: as in `floats` (any f32 is a valid value to write); the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 16) }
}

/// `lines` as 16-lane accumulators, mutably.
fn lanes_mut(lines: &mut [Line]) -> &mut [Lanes] {
    // SAFETY: each `Line` is exactly one `[f32; 16]` (asserted), whose alignment (4) its 64
    // divides; the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len()) }
}

/// One thread's buffers for the wide nest, sized for the largest call, so that no call
/// allocates or zeroes them again: the weight panel, the accumulators of a row group × token
/// block, the activations' partial 16-column tails, and the stage where a token group's
/// activations are copied to lie on cache lines.
struct Scratch {
    panel: Vec<Line>,
    acc: Vec<Line>,
    xpad: Vec<Line>,
    stage: Vec<Line>,
}

impl Scratch {
    fn new() -> Self {
        let zero = Line([0.0; 16]);
        Self {
            panel: vec![zero; GROUP * PANEL_STRIDE / 16],
            acc: vec![zero; ACC_LINES],
            xpad: vec![zero; WIDE_TOKEN_BLOCK],
            stage: vec![zero; STAGE_ROWS * PANEL_STRIDE / 16],
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
/// canonical order, on the tier `K`, for any `t` (meant for `t` > [`crate::tiled::TOKEN_BLOCK`],
/// and for the calls [`crate::stored`] serves, which it hands there with the same scratch).
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
    with_scratch(|s| {
        // SAFETY: guaranteed by the caller.
        unsafe { run_in::<K, F>(s, m, x, t, rows, emit) }
    });
}

/// Runs `go` once with this thread's [`Scratch`], or a fresh one if the thread is already
/// inside a call (an `emit` that calls back into the kernels) or being torn down.
fn with_scratch(go: impl FnOnce(&mut Scratch)) {
    crate::kept::with_kept(&SCRATCH, || None, |slot| go(slot.get_or_insert_with(Scratch::new)));
}

/// The outer-product nest of `isa` ([`crate::outer::run`], with AVX-512's tiles or AVX2's
/// from `crate::outer_avx2`) of the tokens `tokens` of the pack `p` (a prefill call's
/// activations, packed once for all its chunks) in this thread's [`Scratch`]:
/// `emit(j, r, sum)` for token `j` (relative to `tokens.start`) and every `r` in `rows`.
///
/// # Safety
/// The running CPU supports `isa`.
///
/// # Panics
/// If `isa` is neither AVX-512 nor AVX2, `p` is not `m`'s columns, `tokens` runs past the
/// pack or `rows` past `m`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn run_outer<F: Format>(
    isa: crate::isa::Isa,
    m: &Matrix<'_>,
    p: &crate::packed::Packed<'_>,
    tokens: Range<usize>,
    rows: Range<usize>,
    emit: impl FnMut(usize, usize, f32),
) {
    if tokens.is_empty() || rows.is_empty() {
        return;
    }
    with_scratch(|s| {
        let buffers = crate::outer::Buffers {
            panel: floats_mut(&mut s.panel),
            acc: floats_mut(&mut s.acc),
            stage: floats_mut(&mut s.stage),
        };
        // SAFETY: the caller guarantees the tier; the scratch's buffers are on cache lines
        // and hold what either nest needs (asserted at compile time above and in
        // `crate::outer_avx2`).
        unsafe {
            match isa {
                crate::isa::Isa::Avx512 => crate::outer::run::<crate::arch::avx512::Avx512, F>(
                    buffers, m, p, tokens, rows, emit,
                ),
                crate::isa::Isa::Avx2 => crate::outer::run::<crate::arch::avx2::Avx2, F>(
                    buffers, m, p, tokens, rows, emit,
                ),
                other => panic!("outer nest: the {other} tier has none"),
            }
        }
    });
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
    if crate::stored::serves::<K, F>(m, t) {
        // SAFETY: guaranteed by the caller; `serves` holds, and the scratch holds
        // `GROUP * WIDE_TOKEN_BLOCK >= GROUP * t` accumulators.
        unsafe {
            crate::stored::run::<K, F>(
                lanes_mut(&mut s.acc),
                (floats_mut(&mut s.stage), floats_mut(&mut s.panel)),
                m,
                x,
                t,
                rows,
                emit,
            );
        };
        return;
    }
    let cols = m.cols();
    // Blocks of equal size, so that none is left with a lone activation row.
    let size = t.div_ceil(t.div_ceil(WIDE_TOKEN_BLOCK));
    let main_cols = cols - cols % 16;
    // One panel row in column order, before `split_halves` (tiers that fold in halves).
    let mut line = [0.0f32; WIDE_CHUNK];
    let panel = floats_mut(&mut s.panel);
    for t0 in (0..t).step_by(size) {
        let n = size.min(t - t0);
        for (j, p) in lanes_mut(&mut s.xpad[..n]).iter_mut().enumerate() {
            *p = [-0.0; 16];
            p[..cols - main_cols]
                .copy_from_slice(&x[(t0 + j) * cols + main_cols..][..cols - main_cols]);
        }
        for g0 in rows.clone().step_by(GROUP) {
            let gr = GROUP.min(rows.end - g0);
            let acc = &mut lanes_mut(&mut s.acc)[..gr * n];
            acc.fill([0.0; 16]);
            for c0 in (0..cols).step_by(WIDE_CHUNK) {
                let len = WIDE_CHUNK.min(cols - c0);
                let main = len - len % 16;
                // Where each panel row's next span lies (this row's next chunk, the same row
                // of the next group, or of the first group again for the next token block).
                let (pr0, pc0) = next_span(&rows, GROUP, g0, c0, WIDE_CHUNK, cols);
                let pn = GROUP.min(rows.end - pr0);
                // The next span's stored bytes, row by row: the fold's tiles name as many as
                // they can to the prefetcher, spread between their FMAs; the rest, and every
                // row's share of the scales, are named here, one row per row decoded.
                let next: [&[u8]; GROUP] =
                    std::array::from_fn(|i| if i < pn { span(m, 0, pr0 + i, pc0) } else { &[] });
                let named = crate::sweep::spans_named::<K>(gr, n, K::HALVES, pn);
                let name = |i: usize| {
                    prefetch(span(m, 1, pr0 + i, pc0));
                    if i >= named {
                        prefetch(next[i]);
                    }
                };
                for (i, p) in panel.chunks_exact_mut(PANEL_STRIDE).take(gr).enumerate() {
                    if i < pn {
                        name(i);
                    }
                    let row = F::row(m, g0 + i);
                    // SAFETY: the caller guarantees the tier; the span `c0..c0 + len` lies in
                    // the row, `c0` is a multiple of `WIDE_CHUNK` (so of every format's block)
                    // and `len` either `WIDE_CHUNK` or the rest of the row.
                    unsafe {
                        if K::HALVES {
                            K::decode::<F>(row, c0, &mut line[..len]);
                            split_halves(&line[..len], &mut p[..len]);
                        } else {
                            K::decode::<F>(row, c0, &mut p[..len]);
                        }
                    }
                    p[len..len.next_multiple_of(16)].fill(0.0);
                }
                (gr..pn).for_each(name);
                let panel = &*panel;
                let w = |r: usize| &panel[r * PANEL_STRIDE..][..main];
                let xs = |j: usize| &x[(t0 + j) * cols + c0..][..main];
                let prefill = Some(Prefill {
                    halves: K::HALVES,
                    stage: floats_mut(&mut s.stage),
                    next: &next[..pn],
                });
                // SAFETY: the caller guarantees the tier.
                let by_tiles = unsafe { fold_tiles::<K>(&w, gr, n, acc, n, &xs, prefill) };
                debug_assert_eq!(by_tiles, named, "the tiles named the spans planned");
                if main < len {
                    let w = |r: usize| &panel[r * PANEL_STRIDE + main..][..16];
                    let xpad = floats(&s.xpad);
                    let xs = |j: usize| &xpad[j * 16..][..16];
                    // SAFETY: the caller guarantees the tier.
                    unsafe { fold_tiles::<K>(&w, gr, n, acc, n, &xs, None) };
                }
            }
            // SAFETY: the caller guarantees the tier.
            unsafe { emit_group::<K, F>(acc, n, &group_rows::<F>(m, g0, gr), t0, g0, &mut emit) };
        }
    }
}

/// The views of rows `g0 .. g0 + gr` of `m` (a row group), the last repeated to fill the
/// array: taken once for the group, not once per cell.
pub(crate) fn group_rows<'m, F: Format>(
    m: &Matrix<'m>,
    g0: usize,
    gr: usize,
) -> [F::Row<'m>; GROUP] {
    std::array::from_fn(|i| F::row(m, g0 + i.min(gr - 1)))
}

/// The end of a row group of this nest: every accumulator of `acc`
/// (the group's rows one after the other, `n` tokens each) reduced, finished with its row of
/// `rows` and handed to `emit(t0 + token, g0 + row, value)`. At 16 tokens or more a row's
/// accumulators are reduced 16 at a time where they lie ([`crate::reduce::reduce_run`]);
/// fewer, a token's 16 rows at a time ([`crate::reduce::reduce_rows`]).
///
/// # Safety
/// The running CPU supports the tier `K`.
// The stored nest ([`crate::stored`]) ends its groups itself, with `reduce_rows` at every token
// count: through this function, inlined or not, its bf16 calls of 4 and 8 rows measured 2-5%
// slower (session 22, one thread), the code around it inlined differently; and at 16-24 tokens
// `reduce_rows` measured 1.02-1.03x `reduce_run` there (session 38), where this nest's MXFP4
// groups of 16-24 tokens measured even (0.98-1.02x), so both keep what they have.
#[inline(always)]
unsafe fn emit_group<K: Kernel, F: Format>(
    acc: &[Lanes],
    n: usize,
    rows: &[F::Row<'_>; GROUP],
    t0: usize,
    g0: usize,
    mut emit: impl FnMut(usize, usize, f32),
) {
    if n >= 16 {
        // A row's accumulators lie side by side: 16 of them reduced at once, in place.
        for (i, a) in acc.chunks_exact(n).enumerate() {
            // SAFETY: the caller guarantees the tier.
            unsafe {
                crate::reduce::reduce_run::<K>(a, |j, s| {
                    emit(t0 + j, g0 + i, F::finish(rows[i], s));
                });
            }
        }
    } else {
        // SAFETY: the caller guarantees the tier.
        unsafe {
            crate::reduce::reduce_rows::<K>(acc, n, acc.len() / n, |j, i, s| {
                emit(t0 + j, g0 + i, F::finish(rows[i], s));
            });
        }
    }
}

/// Copies a widened span `line` (column order) into `out` in the split order of
/// [`Kernel::fold_half`] over its whole 16-column steps: lanes 0–7 of every step, then lanes
/// 8–15 of every step; a final partial step stays in column order after them.
fn split_halves(line: &[f32], out: &mut [f32]) {
    let main = line.len() - line.len() % 16;
    let (lo, rest) = out.split_at_mut(main / 2);
    let (hi, tail) = rest.split_at_mut(main / 2);
    for ((step, l), h) in
        line.chunks_exact(16).zip(lo.chunks_exact_mut(8)).zip(hi.chunks_exact_mut(8))
    {
        l.copy_from_slice(&step[..8]);
        h.copy_from_slice(&step[8..]);
    }
    tail.copy_from_slice(&line[main..]);
}

/// Where the stored bytes a prefill nest decodes after chunk `c0` (of `chunk` columns, of
/// `cols`) of the row group at `g0` (of `group` rows, of the call's `rows`) start: the
/// group's next chunk, the next group's first, or the first group's again (for the next
/// token block). Returns (row, column).
pub(crate) fn next_span(
    rows: &Range<usize>,
    group: usize,
    g0: usize,
    c0: usize,
    chunk: usize,
    cols: usize,
) -> (usize, usize) {
    if c0 + chunk < cols {
        (g0, c0 + chunk)
    } else if g0 + group < rows.end {
        (g0 + group, 0)
    } else {
        (rows.start, 0)
    }
}

/// The stored bytes of columns `c0 .. c0 + WIDE_CHUNK` (clamped to the row) of row `r` in
/// buffer `buf` of the matrix (0: the weights, 1: the scales). Every format stores the same
/// number of bytes per 32 columns of a row, row after row; FP8's scales, which serve 128 rows,
/// give an approximate span, which is harmless: the span is only named to the prefetcher.
pub(crate) fn span<'a>(m: &Matrix<'a>, buf: usize, r: usize, c0: usize) -> &'a [u8] {
    let cols = m.cols().max(1);
    let bytes = m.rows_bytes(r..r + 1)[buf];
    let (a, b) = (bytes.len() * c0 / cols, bytes.len() * (c0 + WIDE_CHUNK).min(cols) / cols);
    bytes.get(a..b).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Portable;

    /// Deterministic values with both signs, some zeros and a wide range of magnitudes.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = f32::from(u16::try_from(s >> 16).unwrap_or(0)) / 4096.0 - 8.0;
                if s.is_multiple_of(11) {
                    0.0
                } else {
                    v * f32::from(u8::try_from(s % 7).unwrap_or(0) + 1).powi(3)
                }
            })
            .collect()
    }

    /// One 3 × 4 tile's fold on some tier and order.
    type TileFold = dyn Fn([&[f32]; 3], [&[f32]; 4], [&mut [Lanes; 4]; 3]);

    /// Folds a 3 × 4 tile of `len` columns in column order on the portable tier, and in the
    /// split order through `fold_half` on the portable tier and (where the CPU has it) AVX2:
    /// every accumulator's bits agree, starting from accumulators that are not zero.
    fn split_fold_case(len: usize) {
        let w: Vec<Vec<f32>> = (0..3).map(|r| values(len, 10 + r)).collect();
        let x: Vec<Vec<f32>> = (0..4).map(|j| values(len, 20 + j)).collect();
        let split: Vec<Vec<f32>> = w
            .iter()
            .map(|row| {
                let mut out = vec![f32::NAN; len];
                split_halves(row, &mut out);
                out
            })
            .collect();
        let start: [[Lanes; 4]; 3] = std::array::from_fn(|r| {
            std::array::from_fn(|j| {
                let v = values(16, u32::try_from(100 + 4 * r + j).unwrap_or(0));
                std::array::from_fn(|l| v[l])
            })
        });
        let fold = |ws: &[Vec<f32>], f: &TileFold| {
            let mut acc = start;
            let [a, b, c] = &mut acc;
            f(std::array::from_fn(|r| &ws[r][..]), std::array::from_fn(|j| &x[j][..]), [a, b, c]);
            acc.map(|row| row.map(|lanes| lanes.map(f32::to_bits)))
        };
        // SAFETY: the portable tier runs on any CPU.
        let want = fold(&w, &|w, x, a| unsafe { Portable::fold(w, x, a) });
        // SAFETY: as above.
        let got = fold(&split, &|w, x, a| unsafe { Portable::fold_half(w, x, a) });
        assert_eq!(got, want, "portable fold_half, {len} columns");
        #[cfg(target_arch = "x86_64")]
        if crate::isa::Isa::Avx2.is_available() {
            use crate::arch::avx2::Avx2;
            // SAFETY: the CPU supports AVX2 and FMA (checked).
            let got = fold(&split, &|w, x, a| unsafe { Avx2::fold_half(w, x, a) });
            assert_eq!(got, want, "AVX2 fold_half, {len} columns");
        }
    }

    #[test]
    fn fold_half_on_split_weights_equals_fold_in_column_order() {
        for len in [16, 32, 48, 1024] {
            split_fold_case(len);
        }
    }

    #[test]
    fn a_panel_of_plain_f32_split_every_avx512_weight_load_across_two_cache_lines() {
        // A `Vec<f32>` this large came from `mmap`, 16 bytes past a page: every 64-byte load
        // of the panel straddled two lines. Every scratch buffer now starts on a line, every
        // panel row too, and rows a chunk apart no longer share their L1 set.
        let s = Scratch::new();
        for (name, addr) in [
            ("panel", s.panel.as_ptr().addr()),
            ("acc", s.acc.as_ptr().addr()),
            ("xpad", s.xpad.as_ptr().addr()),
            ("stage", s.stage.as_ptr().addr()),
        ] {
            assert_eq!(addr % 64, 0, "{name} starts on a cache line");
        }
        assert_eq!(PANEL_STRIDE * 4 % 64, 0, "every panel row starts on a cache line");
        assert_ne!(PANEL_STRIDE * 4 % 4096, 0, "panel rows off the 4 KiB stride");
        assert!(s.panel.len() * 16 >= GROUP * PANEL_STRIDE);
        assert!(s.stage.len() * 16 >= STAGE_ROWS * PANEL_STRIDE);
    }

    #[test]
    fn split_halves_keeps_a_partial_last_step_in_column_order() {
        let line: Vec<f32> = (0..41u8).map(f32::from).collect();
        let mut out = vec![f32::NAN; 41];
        split_halves(&line, &mut out);
        let lo: Vec<f32> = (0u8..8).chain(16..24).map(f32::from).collect();
        let hi: Vec<f32> = (8u8..16).chain(24..32).map(f32::from).collect();
        assert_eq!(out[..16], lo[..]);
        assert_eq!(out[16..32], hi[..]);
        assert_eq!(out[32..], line[32..]);
    }
}
