//! Weight matrices in their stored formats and the batch-invariant matmul over them.
//!
//! `out[t, r] = Σ_c W[r, c] · x[t, c]` for a weight `W [rows, cols]` stored row-major
//! (PyTorch `Linear` layout, `[out, in]`) and activations `x [t, cols]`.
//!
//! **Canonical reduction order** (every tier must reproduce it bit for bit):
//! 16 f32 accumulators `acc[0..16]` start at +0.0; element `c` is folded into lane `c % 16`
//! with a fused multiply-add, `acc[c % 16] = fma(W[r, c], x[t, c], acc[c % 16])`, in increasing
//! `c`; then the lanes are summed as a tree: `acc[l] += acc[l + 8]` for `l < 8`, then `+4`,
//! `+2`, `+1`; the result is `acc[0]`. This is exactly what one AVX-512 register (or two AVX2
//! registers, or four NEON registers) computes, so SIMD tiers equal the scalar reference.
//! Weight elements are widened to f32 before the FMA, each format by its own scalar decode
//! (`formats/`): bf16 → f32 and E2M1 × 2^(s−127) exactly, FP8 as `f32(e4m3) · s` rounded once,
//! INT4 as `(nibble − 8) · scale` exactly. **Row-int8 folds its integers**: `f32(q)` (exact) goes into the lanes and the row's
//! f16 scale multiplies the reduced sum once, `result = f32(scale) · acc[0]` (one f32
//! multiplication, rounded). A row scale is common to the whole row, so taking it out of the
//! sum is the natural int8 dot product, and it saves one multiplication per weight in every
//! kernel, which is what let int8 matvec reach the memory bound (docs/PERFORMANCE.md, issue 4).
//! [`Matrix::get`] still returns the dequantized element `f32(q) · f32(scale)` (exact: an 8-bit
//! integer times an 11-bit f16 significand fits the 24-bit f32 one).
//!
//! [`matmul`] runs on the tier chosen by [`crate::isa::isa`] and splits output rows (and, for
//! many activation rows against few output rows, activation rows; never a reduction) across
//! the current [`crate::pool`], so neither the tier nor the thread count nor the number of
//! activation rows changes a result bit; [`matmul_with`] picks the tier
//! explicitly. The variants whose chunks finish their own cells right after computing them (an
//! activation, a weighted add into running sums: [`crate::finish`]) split calls the same way,
//! and so do the calls that run several matmuls (a layer's experts) as one ([`crate::many`]).
//! The loop nest every tier shares (row blocks, token blocks, column chunks, register tiles)
//! is in the crate's `tiled` module.

use crate::arch;
use crate::formats::{Format, Visit};
use crate::isa::{self, Isa};
use crate::packed::{Packed, GROUP_TOKENS};
use crate::tiled::TOKEN_BLOCK;
use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

pub use crate::formats::{e4m3_to_f32, e8m0_to_f32, WeightFormat, E2M1, E4M3};

/// A borrowed weight matrix `[rows, cols]` in its stored format. Buffers are raw little-endian
/// bytes with no alignment requirement (safetensors offsets need not be aligned). Each format's
/// constructor (`Matrix::f32`, `bf16`, `mxfp4`, `int8_row`, `fp8_block`, `int4_group`) lives
/// in the format's file under `formats/` and checks the buffers against the shape.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) format: WeightFormat,
    pub(crate) data: &'a [u8],
    pub(crate) scales: &'a [u8],
}

/// Decodes a span of one row through the row's format ([`Format::widen`]).
struct Widen<'m, 'a, 'o> {
    m: &'m Matrix<'a>,
    r: usize,
    c0: usize,
    out: &'o mut [f32],
}

impl Visit for Widen<'_, '_, '_> {
    type Out = ();

    fn visit<F: Format>(self) {
        F::widen(F::row(self.m, self.r), self.c0, self.out);
    }
}

/// The scalar reference dot product of one row ([`dot_row_scalar`]).
struct Dot<'m, 'a, 'x> {
    m: &'m Matrix<'a>,
    r: usize,
    x: &'x [f32],
}

impl Visit for Dot<'_, '_, '_> {
    type Out = f32;

    fn visit<F: Format>(self) -> f32 {
        let row = F::row(self.m, self.r);
        let n = self.x.len().min(self.m.cols);
        let mut w = vec![0.0f32; n];
        F::fold_values(row, 0, &mut w);
        let mut acc = [0.0f32; 16];
        for (c, (&wc, &xc)) in w.iter().zip(self.x).enumerate() {
            acc[c % 16] = wc.mul_add(xc, acc[c % 16]);
        }
        F::finish(row, reduce16(acc))
    }
}

impl<'a> Matrix<'a> {
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Storage format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Raw weight bytes (packed nibbles for MXFP4 and INT4, signed bytes for int8, e4m3 codes
    /// for FP8).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Scale bytes: E8M0 per block for MXFP4, little-endian f16 per row for int8, f32 per
    /// 128 × 128 block for FP8, bf16 per 32-column group for INT4; empty for f32 and bf16.
    pub fn scales(&self) -> &'a [u8] {
        self.scales
    }

    /// Bytes of weights (and scales) this matrix occupies.
    pub fn byte_len(&self) -> usize {
        self.data.len() + self.scales.len()
    }

    /// Element `(r, c)` widened to f32 (slow; for references and tests).
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let mut v = [0.0f32];
        self.format.visit(Widen { m: self, r, c0: c, out: &mut v });
        v[0]
    }

    /// The stored bytes of rows `rows` (clamped to the matrix): weights, and scales (empty for
    /// formats without them), each at the buffer's bytes per row (rounded down; for FP8, whose
    /// scales serve 128 rows, an approximate span meant for prefetching only).
    #[inline]
    pub(crate) fn rows_bytes(&self, rows: std::ops::Range<usize>) -> [&'a [u8]; 2] {
        let (a, b) = (rows.start.min(self.rows), rows.end.min(self.rows));
        let per_row = |buf: &'a [u8]| {
            let n = buf.len().checked_div(self.rows).unwrap_or(0);
            &buf[a.min(b) * n..b * n]
        };
        [per_row(self.data), per_row(self.scales)]
    }

    /// Writes row `r` widened to f32 (the values [`Matrix::get`] gives) into the first
    /// `cols` elements of `out` (all of it when shorter).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let n = out.len().min(self.cols);
        self.format.visit(Widen { m: self, r, c0: 0, out: &mut out[..n] });
    }
}

/// Folds a finished 16-lane accumulator in the canonical tree order.
#[inline(always)]
pub fn reduce16(mut acc: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// Scalar reference dot product of row `r` with `x` in the canonical order: the row's folded
/// values (its format's scalar decode) folded element by element, then the format's finish.
pub fn dot_row_scalar(m: &Matrix<'_>, r: usize, x: &[f32]) -> f32 {
    m.format.visit(Dot { m, r, x })
}

/// Scalar reference for [`matmul`]: single-threaded, element by element.
pub fn matmul_scalar(m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    for ti in 0..t {
        let xr = &x[ti * m.cols..(ti + 1) * m.cols];
        for r in 0..m.rows {
            out[ti * m.rows + r] = dot_row_scalar(m, r, xr);
        }
    }
}

/// `out[t, r] = Σ_c W[r, c] · x[t, c]` in the canonical order (see the module docs), on the
/// process-wide tier [`isa::isa`] and the current [`crate::pool`].
///
/// # Panics
/// If `x` is not `t * cols` long or `out` is not `t * rows` long (callers size them from the
/// matrix shape, so a mismatch is a programming error).
pub fn matmul(m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    matmul_with(isa::isa(), m, x, t, out);
}

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
/// ([`packed_cuts`]), a multiple of the outer nest's token groups: each such chunk decodes
/// its row group's weights again.
pub(crate) const MIN_SLICE_TOKENS: usize = 48;
const _: () = assert!(MIN_SLICE_TOKENS.is_multiple_of(GROUP_TOKENS));
/// Each row chunk takes `1 / (GUIDED_SHARE · threads)` of the rows not yet handed out.
pub(crate) const GUIDED_SHARE: usize = 2;

/// [`matmul`] on an explicit tier (tests and benchmarks run every [`Isa::available`] tier).
///
/// # Panics
/// If the running CPU does not support `isa`, or on the length mismatches [`matmul`] panics on.
pub fn matmul_with(isa: Isa, m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    assert_eq!(x.len(), t * m.cols, "matmul: x length");
    assert_eq!(out.len(), t * m.rows, "matmul: out length");
    assert!(isa.is_available(), "matmul: the {isa} tier is not supported by this CPU");
    let out_ptr = OutPtr::new(out);
    for_chunks(isa, x, t, m.rows, m.cols, &|tk, r, pack| {
        // SAFETY: `isa` is available (asserted above); `out` is `t * rows` long and exclusively
        // borrowed until `for_chunks` returns, which is after every chunk has finished, and
        // the chunks' (token, row) ranges are disjoint, so each cell is written by exactly one
        // chunk and read by none.
        unsafe { run_cells(isa, m, x, tk, r, &out_ptr, pack) };
    });
}

/// What [`for_chunks`] runs for each chunk: `f(tokens, rows, pack)`.
pub(crate) type ChunkFn<'f> = dyn Fn(Range<usize>, Range<usize>, Option<&Packed<'_>>) + Sync + 'f;

/// Runs `f(tokens, rows, pack)` over the chunks of a call of `t` activation rows `x` on a
/// matrix of `rows` rows ([`split`], which weighs the call as `work_cols` columns) on the
/// current pool, or once over everything on the calling thread. Where the tier packs a
/// prefill's activations ([`crate::packed`]), they are packed first, in blocks of tokens if
/// need be, each block cut into chunks on its own and its chunks handed the pack.
pub(crate) fn for_chunks(
    isa: Isa,
    x: &[f32],
    t: usize,
    rows: usize,
    work_cols: usize,
    f: &ChunkFn<'_>,
) {
    let cols = x.len().checked_div(t).unwrap_or(0);
    crate::packed::in_blocks(isa, x, t, cols, &mut |tokens, pack| {
        let (t0, n) = (tokens.start, tokens.len());
        crate::pool::with_current(|pool| {
            if pack.is_some() {
                let cs = packed_chunks(pool.threads(), rows, work_cols, n);
                let run = |i: usize| {
                    let (tk, r) = cs[i].clone();
                    f(t0 + tk.start..t0 + tk.end, r, pack);
                };
                if cs.len() > 1 {
                    pool.run(cs.len(), &run);
                } else {
                    run(0);
                }
                return;
            }
            let Some((cuts, token_chunks)) = split(pool.threads(), rows, work_cols, n) else {
                f(tokens.clone(), 0..rows, pack);
                return;
            };
            let cuts: &[usize] = &cuts;
            let row_chunks = cuts.len() - 1;
            let tc = token_chunk(n, token_chunks, false);
            pool.run(row_chunks * token_chunks, &|i| {
                let (ri, ti) = (i % row_chunks, i / row_chunks);
                let tokens = token_range(ti, tc, n);
                f(t0 + tokens.start..t0 + tokens.end, cuts[ri]..cuts[ri + 1], pack);
            });
        });
    });
}

/// Activation rows per chunk when a call's `n` rows are cut into `token_chunks` chunks: whole
/// token groups where the chunks fold a pack (`grouped`: the outer nest folds whole groups, so
/// a pack's chunks start on them). [`for_chunks`] and [`crate::many`] cut calls alike.
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
/// `threads`: [`packed_cuts`] over the whole call where it has at least a row group per
/// thread and twice [`MIN_SLICE_TOKENS`] activation rows; otherwise as [`split`] cuts it (a
/// small matrix also by activation rows, on whole token groups), or one chunk of everything
/// where the call runs on the calling thread.
pub(crate) fn packed_chunks(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
) -> Vec<(Range<usize>, Range<usize>)> {
    let mut chunks = Vec::new();
    if rows.div_ceil(crate::wide::GROUP) >= threads && t >= 2 * MIN_SLICE_TOKENS {
        if threads > 1 && rows * cols * t >= PAR_MIN_WORK {
            let mut left = rows * cols * t;
            packed_cuts(threads, rows, cols, t, &mut left, |tk, r| chunks.push((tk, r)));
            return chunks;
        }
    } else if let Some((cuts, token_chunks)) = split(threads, rows, cols, t) {
        let tc = token_chunk(t, token_chunks, true);
        for ti in 0..token_chunks {
            let tokens = token_range(ti, tc, t);
            if !tokens.is_empty() {
                chunks.extend(cuts.windows(2).map(|r| (tokens.clone(), r[0]..r[1])));
            }
        }
        return chunks;
    }
    chunks.push((0..t, 0..rows));
    chunks
}

/// Cuts a packed call's `rows` × `t` activation rows (weighed as `cols` columns) on a guided
/// schedule, `left` the work (`rows · cols · t` summed) not yet handed out, updated: each
/// chunk takes about `1 / (GUIDED_SHARE · threads)` of it, in whole row groups of the outer
/// nest ([`crate::wide::GROUP`], all the activation rows) while that is at least one, then
/// one row group at a time, cut by activation rows in whole token groups of at least
/// [`MIN_SLICE_TOKENS`], so that the call still ends evenly. A call of fewer than twice that
/// many activation rows ends in 16-row steps instead, as [`split`] cuts the others: cut only
/// in whole row groups, a 64-token call's last chunks left threads idle (T = 64 at 16 threads
/// 60–69% of the peak against 63–73%, session 28).
///
/// **Why.** Cut as the other nests' calls are, the last chunks shrank to 16 rows: on 16
/// threads half of a 2,048-row call's rows were folded in 16-row chunks, whose tiles hold
/// one vector of rows (one weight load per six broadcast activations) and each of which
/// read the call's whole pack for its 16 rows, four times a row group's activation bytes per
/// FMA, from the L3 that the 16 cores share (docs/PERFORMANCE.md, issue 20, session 28).
/// A row group cut by activation rows keeps its tiles whole and reads only its tokens' share
/// of the pack; it decodes its weights once per chunk, which a chunk of at least
/// [`MIN_SLICE_TOKENS`] amortises.
pub(crate) fn packed_cuts(
    threads: usize,
    rows: usize,
    cols: usize,
    t: usize,
    left: &mut usize,
    mut push: impl FnMut(Range<usize>, Range<usize>),
) {
    let group = crate::wide::GROUP;
    let share = GUIDED_SHARE * threads.max(1);
    let min = MIN_SLICE_TOKENS;
    let mut r0 = 0;
    while r0 < rows {
        let want = *left / share / (cols * t).max(1);
        if want >= group {
            let size = (want / group * group).min(rows - r0);
            push(0..t, r0..r0 + size);
            *left = left.saturating_sub(size * cols * t);
            r0 += size;
            continue;
        }
        if t < 2 * min {
            // Too few activation rows to cut: 16-row steps, as the other nests' calls end.
            let size = (want / MIN_CHUNK_ROWS * MIN_CHUNK_ROWS).max(MIN_CHUNK_ROWS);
            let size = size.min(rows - r0);
            push(0..t, r0..r0 + size);
            *left = left.saturating_sub(size * cols * t);
            r0 += size;
            continue;
        }
        let gr = group.min(rows - r0);
        let mut k0 = 0;
        while k0 < t {
            let want = *left / share / (gr * cols).max(1);
            let mut n = (want / GROUP_TOKENS * GROUP_TOKENS).max(min).min(t - k0);
            if t - k0 - n < min {
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
        let size =
            if want >= coarse { want / coarse * coarse } else { (want / fine * fine).max(fine) };
        start += size.min(left);
        cuts.push(start);
    }
    cuts
}

/// An output buffer shared by the chunks of one call ([`matmul_with`], and the variants in
/// [`crate::finish`], whose chunks finish their cells into a second buffer too).
pub(crate) struct OutPtr(*mut f32);

// SAFETY: the pointer is only dereferenced through `OutPtr::write` and `OutPtr::cells`, at
// cells that one chunk owns (the chunks' (token, row) ranges are disjoint), while the
// `&mut [f32]` it came from is held by the call.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The buffer `out`, which the caller holds exclusively until its chunks have finished.
    pub(crate) fn new(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr())
    }

    /// Writes `v` at element `i`.
    ///
    /// # Safety
    /// `i` is inside the buffer, and no other thread accesses element `i` during the call.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { self.0.add(i).write(v) };
    }

    /// Elements `i..i + len` as a slice.
    ///
    /// # Safety
    /// The range is inside the buffer, and no other reference to it exists while the slice lives.
    pub(crate) unsafe fn cells<'a>(&self, i: usize, len: usize) -> &'a mut [f32] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(i), len) }
    }
}

/// Computes the cells `(ti, r)` for `ti` in `tokens` and `r` in `rows` on `isa` (see
/// [`crate::tiled`]), from the call's packed activations `pack` if it has them (which hold
/// `tokens`: see [`for_chunks`]).
///
/// # Safety
/// The CPU supports `isa`; `out` points to `x.len() / m.cols() * m.rows()` f32 whose cells
/// `(ti, r)` for `ti` in `tokens` and `r` in `rows` no other thread accesses during the call.
pub(crate) unsafe fn run_cells(
    isa: Isa,
    m: &Matrix<'_>,
    x: &[f32],
    tokens: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    out: &OutPtr,
    pack: Option<&Packed<'_>>,
) {
    assert!(rows.end <= m.rows, "matmul: row range");
    assert!(tokens.end * m.cols <= x.len(), "matmul: token range");
    let (t0, t) = (tokens.start, tokens.len());
    let emit = |ti: usize, r: usize, v: f32| {
        assert!(ti < t && r < m.rows, "matmul: output cell");
        // SAFETY: `t0 + ti < tokens.end` and `r < m.rows` (asserted), so the cell is inside
        // the buffer, and the caller gives this call sole access to these cells.
        unsafe { out.write((t0 + ti) * m.rows + r, v) };
    };
    let x = &x[t0 * m.cols..tokens.end * m.cols];
    let pack = pack.map(|p| {
        assert!(
            t0 >= p.first && tokens.end <= p.first + p.tokens,
            "matmul: chunk outside its pack"
        );
        (p, t0 - p.first)
    });
    arch::run(isa, m, x, t, rows, pack, emit);
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
            if t < 2 * min || rows.div_ceil(64) < threads {
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
            assert!(chunks.len() >= threads.min(rows.div_ceil(64) * t / min), "{chunks:?}");
            assert!(chunks.iter().all(|(_, r)| r.len() >= 64.min(rows - r.start)));
            assert!(chunks.iter().any(|(tk, _)| tk.len() < t), "cut by tokens: {chunks:?}");
        }
        assert_eq!(packed_chunks(1, 2048, 7168, 264), vec![(0..264, 0..2048)]);
    }
}
