//! The prefill nest in outer-product form: a register holds one lane of 16 weight rows'
//! accumulators (8 on AVX2), not 16 lanes of one row's, so the weights a tile folds stay in
//! L1 while every token group of the block passes over them. One driver for both tiers, on
//! the same pack and panel.
//!
//! **Why.** The canonical reduction ([`crate::matmul`]) gives each (row, token) cell 16
//! lanes, lane `l` folding columns `l, l + 16, l + 32, …` in increasing order, then
//! [`crate::matmul::reduce16`]'s tree. The other nests hold a cell's 16 lanes in one register
//! and fold 16 columns per FMA, so each FMA needs 16 weights *and* 16 activations: a tile of
//! 4 rows × 6 tokens streams 4 KiB of weights per 1,536 FMAs from the L2 panel, and a token
//! group's 24 KiB of activations and the tile's weights share L1 (≈ 52% of the FMA peak at
//! T = 256 on one thread of the dev VM, issue 20, sessions 11–22). Here a register holds lane
//! `l` of 16 rows × 1 token: an FMA takes 16 weights (column `c` of 16 rows) and **one**
//! activation value, broadcast. A tile of 64 rows × 6 tokens then reads, per step, four
//! weight vectors and six scalars: the lane's slab of the panel (64 rows × 64 columns, 16 KiB)
//! stays in L1 while all the block's token groups fold over it, and a token group streams
//! only 1.5 KiB of activations per tile.
//!
//! **Layout.** Both operands are transposed so that a lane's values lie together:
//! - the **panel** of a row group's column chunk is `P[l][k][r]` = `W[g0 + r][c0 + 16k + l]`
//!   (64 rows, [`CHUNK`] columns, so 64 steps `k` a lane), made by decoding 16 rows × 256
//!   columns through the format's decode and transposing 16 × 16 blocks in registers;
//! - the activations are **packed** once per call (`crate::outer_avx512::pack`):
//!   `A[ch][l][g][k][j]` = `x[6g + j][ch · CHUNK + 16k + l]`, in token groups of 6 (the
//!   tokens a tile folds), so that a tile's activations are one run of 24 cache lines;
//!   shared by every thread's row chunks, a block of at most [`BLOCK`] (264) tokens at a
//!   time ([`crate::packed::in_blocks`]). The weights are decoded once per block: a 256-token
//!   prefill decodes them once. (Packed with a block's tokens side by side instead, a lane's
//!   steps lay a stride of all the tokens apart, which the hardware prefetchers did not
//!   follow: the fold ran at 56% of the peak at T = 256 against 87% at T = 64, and blocks
//!   were kept to 128 tokens, each decoding the weights again; docs/PERFORMANCE.md, issue 20,
//!   sessions 23 and 24.)
//!
//! **Tiers.** The driver ([`run`]: blocks, row groups, chunks, lanes, token groups, the
//! emitted sums) is one for both tiers; a tier ([`Tier`]) brings the panel's decode, the
//! tiles of a lane's token group and where a cell's accumulators lie: AVX-512's
//! (`crate::outer_avx512`) are 1 to 4 vectors of 16 rows × 6 tokens, AVX2's
//! (`crate::outer_avx2`) 16 rows × 6 tokens in two 8-lane vectors. While the tiles run, the
//! stored bytes the nest decodes next are named to the prefetcher, a few lines before each
//! token group's tiles, as the other prefill nest does ([`crate::wide`]).
//!
//! **Exactness.** Lane `l` of cell (r, j) still folds `fma(W[r][c], x[j][c], acc)` for
//! `c = l, l + 16, …` in increasing order: chunks in increasing order, steps `k` in
//! increasing order within a chunk, accumulators starting at +0.0 and stored bit-unchanged
//! between chunks. A row's last partial 16 columns fold +0.0 weights against −0.0 activations
//! (`fma(+0, −0, acc) = acc`, as in every nest), and the 16 lanes of a cell are added in
//! [`crate::matmul::reduce16`]'s tree, the lower lanes' as the first operand, for 16 rows at
//! once. So every result is the canonical reduction, bit for bit.

use std::ops::Range;

use crate::formats::Format;
use crate::matmul::Matrix;
use crate::packed::{Packed, BLOCK, CHUNK, GROUP_TOKENS, MICRO, STEPS};

/// Weight rows of a row group: four 16-row vectors.
pub(crate) const ROWS: usize = 64;
/// Floats of one lane's slab of the panel: a chunk of 64 rows and one cache line, so that the
/// 16 slabs a transposed block is stored into do not all fall in one L1 set.
pub(crate) const PANEL_LANE: usize = STEPS * ROWS + 16;
/// Columns a row is decoded in at a time (16 rows of it: 16 KiB, in L1) before transposing.
pub(crate) const SUB: usize = 256;
/// Floats of the panel, the accumulators and the decode stage the nest needs.
pub(crate) const PANEL_FLOATS: usize = 16 * PANEL_LANE;
/// Accumulator floats of a block: 16 lanes × token groups × [`CELLS`] (24 vectors of 16).
pub(crate) const ACC_FLOATS: usize = 16 * BLOCK.div_ceil(GROUP_TOKENS) * CELLS;
/// Floats of the decode stage: 16 rows of [`SUB`] columns.
pub(crate) const STAGE_FLOATS: usize = 16 * SUB;

const _: () = assert!(CHUNK.is_multiple_of(SUB) && SUB.is_multiple_of(128));
const _: () = assert!(ROWS == 4 * 16 && ROWS == crate::wide::GROUP);

/// The nest's buffers, each on a cache line: the panel ([`PANEL_FLOATS`]), the accumulators
/// ([`ACC_FLOATS`]) and the decode stage ([`STAGE_FLOATS`]).
pub(crate) struct Buffers<'s> {
    pub(crate) panel: &'s mut [f32],
    pub(crate) acc: &'s mut [f32],
    pub(crate) stage: &'s mut [f32],
}

/// What a SIMD tier brings to the nest's driver ([`run`]): the panel's decode, the tiles of
/// a lane's token group, and where a cell's accumulators lie. AVX-512's is here, AVX2's in
/// `crate::outer_avx2`; both keep a lane's accumulators for a token group in [`CELLS`]
/// floats, so a lane's for a block in `groups · CELLS`.
pub(crate) trait Tier {
    /// Rows [`Tier::reduce_lanes`] sums at once (a register's lanes).
    const WIDTH: usize;

    /// Decodes columns `c0 .. c0 + len` of rows `g0 .. g0 + gr` into the panel `P[l][k][r]`
    /// (lane `l`'s slab at `l · PANEL_LANE`), 16 rows × [`SUB`] columns at a time through
    /// `stage`; a row's last partial 16 columns, and the rows of a 16-row block past `gr`,
    /// are +0.0. Blocks past `gr` are left as they are (their cells are never emitted).
    ///
    /// # Safety
    /// The CPU supports the tier; `panel` and `stage` are at least [`PANEL_FLOATS`] and
    /// [`STAGE_FLOATS`] long, on cache lines; `c0` is a multiple of [`CHUNK`] and
    /// `len <= CHUNK` reaches the chunk's or the row's end.
    unsafe fn decode_panel<F: Format>(
        m: &Matrix<'_>,
        g0: usize,
        gr: usize,
        c0: usize,
        len: usize,
        panel: &mut [f32],
        stage: &mut [f32],
    );

    /// Folds rows `0 .. gr` of a lane's slab `w` (steps [`ROWS`] floats apart) against a
    /// token group's micro-panel `x` for `steps` steps into the group's accumulators `acc`
    /// ([`CELLS`] floats, from +0.0 if `first`), naming `next` (the micro-panel the lane's
    /// next fold reads) and the next group's accumulators to the prefetcher.
    ///
    /// # Safety
    /// The CPU supports the tier; `w` holds `steps` steps on a cache line, `x` is readable
    /// at `6k + j` for `k < steps`, `j < 6`, and `acc` holds [`CELLS`] floats on a line.
    unsafe fn fold(
        w: *const f32,
        x: *const f32,
        next: *const f32,
        steps: usize,
        acc: *mut f32,
        gr: usize,
        first: bool,
    );

    /// Where, in a token group's [`CELLS`], the lane's accumulators of token `j` and rows
    /// `v .. v + WIDTH` lie (`v` a multiple of `WIDTH`).
    fn cell(j: usize, v: usize) -> usize;

    /// The 16 lanes' vectors at `acc + l · lane` (each `WIDTH` rows' lane `l`) added in
    /// [`crate::matmul::reduce16`]'s tree: lane `l` plus lane `l + 8`, then `+ 4`, `+ 2`,
    /// `+ 1`, the lower lane the first operand. Returns the rows' sums (the first `WIDTH`).
    ///
    /// # Safety
    /// The CPU supports the tier; each of the 16 vectors is readable and on a cache line.
    unsafe fn reduce_lanes(acc: *const f32, lane: usize) -> [f32; 16];
}

/// Floats of one lane's accumulators for one token group: 64 rows × 6 tokens.
pub(crate) const CELLS: usize = ROWS * GROUP_TOKENS;

/// `emit(j, r, Σ_c W[r, c] · x[j, c])` for every `r` in `rows` and token `j` of `tokens`
/// (of the pack `p`; `j` handed relative to `tokens.start`), each sum in the canonical
/// order, on tier `T`, in the buffers `panel`, `acc` and `stage` of [`Buffers`]
/// ([`PANEL_FLOATS`], [`ACC_FLOATS`], [`STAGE_FLOATS`] floats, each on a cache line).
///
/// # Safety
/// The CPU supports `T`'s tier.
///
/// # Panics
/// If a buffer is too short or off a cache line, `p` is not `m`'s columns, `tokens` runs past
/// the pack or `rows` past `m`.
pub(crate) unsafe fn run<T: Tier, F: Format>(
    Buffers { panel, acc, stage }: Buffers<'_>,
    m: &Matrix<'_>,
    p: &Packed<'_>,
    tokens: Range<usize>,
    rows: Range<usize>,
    mut emit: impl FnMut(usize, usize, f32),
) {
    assert!(panel.len() >= PANEL_FLOATS && acc.len() >= ACC_FLOATS, "outer: scratch");
    assert!(stage.len() >= STAGE_FLOATS, "outer: stage");
    for b in [panel.as_ptr(), acc.as_ptr(), stage.as_ptr()] {
        assert!(b.addr().is_multiple_of(64), "outer: scratch alignment");
    }
    assert!(p.cols == m.cols() && tokens.end <= p.tokens, "outer: pack");
    assert!(tokens.start.is_multiple_of(GROUP_TOKENS), "outer: tokens off a group");
    assert!(rows.end <= m.rows(), "matmul: row range");
    let cols = m.cols();
    // Blocks of about equal size, of whole token groups, so that none is left with a few
    // tokens to decode the weights for.
    let size = tokens.len().div_ceil(tokens.len().div_ceil(BLOCK).max(1));
    let size = size.next_multiple_of(GROUP_TOKENS).min(BLOCK);
    for b0 in tokens.clone().step_by(size.max(1)) {
        let n = size.min(tokens.end - b0);
        let groups = n.div_ceil(GROUP_TOKENS);
        // Floats of one lane's accumulators: `groups` token groups.
        let lane_acc = groups * CELLS;
        for g0 in rows.clone().step_by(ROWS) {
            let gr = ROWS.min(rows.end - g0);
            for ch in 0..Packed::chunks(cols) {
                let c0 = ch * CHUNK;
                let len = CHUNK.min(cols - c0);
                // SAFETY: the caller guarantees the tier; the buffers' sizes are asserted
                // above.
                unsafe { T::decode_panel::<F>(m, g0, gr, c0, len, panel, stage) };
                let steps = len.div_ceil(16);
                let mut ahead = Ahead::new(m, &rows, g0, c0, 16 * groups);
                for l in 0..16 {
                    // Lane `l`'s micro-panels of this chunk, one per token group, in a row.
                    let lane = ((ch * 16 + l) * p.groups + b0 / GROUP_TOKENS) * MICRO;
                    let next_lane = lane + p.groups * MICRO;
                    for g in 0..groups {
                        ahead.name_upto(l * groups + g + 1);
                        // SAFETY: the caller guarantees the tier. Lane `l`'s slab lies inside
                        // the panel (`16 · PANEL_LANE`); the group's accumulators inside `acc`
                        // (`l · lane_acc + (g + 1) · CELLS <= 16 · lane_acc <= ACC_FLOATS`, as
                        // `groups <= BLOCK / 6`); its activations, the micro-panel at
                        // `lane + g · MICRO` (`MICRO` floats), inside the pack, as
                        // `b0 / 6 + g < p.groups`.
                        unsafe {
                            let w = panel.as_ptr().add(l * PANEL_LANE);
                            let x = p.data.as_ptr().add(lane + g * MICRO);
                            let a = acc.as_mut_ptr().add(l * lane_acc + g * CELLS);
                            // The activations the lane's next fold reads (the next group's in
                            // this lane, or the first group's in the next).
                            let next = if g + 1 < groups {
                                x.wrapping_add(MICRO)
                            } else {
                                p.data.as_ptr().wrapping_add(next_lane)
                            };
                            T::fold(w, x, next, steps, a, gr, ch == 0);
                        }
                    }
                }
            }
            let views = crate::wide::group_rows::<F>(m, g0, gr);
            for g in 0..groups {
                for j in 0..GROUP_TOKENS {
                    let tok = g * GROUP_TOKENS + j;
                    if tok >= n {
                        break;
                    }
                    for v in (0..gr).step_by(T::WIDTH) {
                        // SAFETY: the caller guarantees the tier; the 16 lanes' vectors of the
                        // cell block lie at `g · CELLS + cell(j, v) + l · lane_acc`, inside
                        // `acc` (as for the folds above) and on lines.
                        let sums = unsafe {
                            T::reduce_lanes(acc.as_ptr().add(g * CELLS + T::cell(j, v)), lane_acc)
                        };
                        for (i, &s) in sums.iter().enumerate().take(T::WIDTH.min(gr - v)) {
                            emit(b0 - tokens.start + tok, g0 + v + i, F::finish(views[v + i], s));
                        }
                    }
                }
            }
        }
    }
}

/// The stored bytes the nest decodes after a chunk (the group's next chunk, the next group's
/// first, or the first group's again for the next block), named to the prefetcher in shares
/// spread over the chunk's folds, so that they arrive under the FMAs.
struct Ahead<'m> {
    /// The span of each row of the next chunk (empty past the next group's rows).
    spans: [&'m [u8]; ROWS],
    /// Lines of a row's span (at least 1).
    row_lines: usize,
    /// Lines of all the spans.
    lines: usize,
    /// Folds the lines are spread over.
    units: usize,
    /// Lines named so far: line `q` of row `r` is the next.
    named: usize,
    r: usize,
    q: usize,
}

impl<'m> Ahead<'m> {
    /// The spans after chunk `c0` of the row group at `g0` (of the call's `rows`), to be
    /// named over `units` folds.
    fn new(m: &Matrix<'m>, rows: &Range<usize>, g0: usize, c0: usize, units: usize) -> Self {
        let (nr, nc) = crate::wide::next_span(rows, ROWS, g0, c0, CHUNK, m.cols());
        let nn = ROWS.min(rows.end - nr);
        let spans: [&[u8]; ROWS] =
            std::array::from_fn(|i| if i < nn { crate::wide::span(m, 0, nr + i, nc) } else { &[] });
        let row_lines = spans[0].len().div_ceil(64);
        let lines = nn * row_lines;
        Self { spans, row_lines: row_lines.max(1), lines, units, named: 0, r: 0, q: 0 }
    }

    /// Names the lines due by the end of fold `unit` (of `units`): `unit · lines / units`
    /// in all.
    fn name_upto(&mut self, unit: usize) {
        let upto = unit * self.lines / self.units.max(1);
        while self.named < upto {
            crate::arch::prefetch_line(self.spans[self.r].as_ptr().wrapping_add(64 * self.q));
            self.named += 1;
            self.q += 1;
            if self.q == self.row_lines {
                (self.r, self.q) = (self.r + 1, 0);
            }
        }
    }
}
