//! Matmuls whose chunks finish their own cells: each chunk of the pool call, right after it
//! has computed its cells of `y = x · Wᵀ`, hands them to an elementwise `finish` (an
//! activation, a bias, a weighted add into running sums).
//!
//! A routed expert used to be a pool call per projection plus passes over whole buffers on
//! the engine thread alone (the activation between the projections, the weighted add after
//! them); every pool call ends with the engine thread waiting on the helpers' last chunks, and
//! every such pass leaves the helpers idle, shares of a pass that grow with the thread count.
//! Here an expert is two pool calls: [`matmul_pair`] (a gated MLP's gate and up projections
//! and the activation) or [`matmul_then`] into [`Target::rows`] (GPT-OSS's interleaved
//! gate/up rows into their activation), then [`matmul_then`] into [`Target::scatter`] (the
//! down projection added into the running sums of the rows that chose the expert;
//! [`matmul_add_rows`]).
//!
//! Every cell is computed by the code [`matmul`] runs, split the way it splits, so the
//! results are bit for bit those of [`matmul`] followed by the same elementwise work in a
//! separate pass: a `finish` sees each cell once, and the chunks' (token, row) cells are
//! disjoint. Row chunks are cut at multiples of 16 rows (the last one ends at the matrix's
//! last row), so a chunk holds whole pairs of rows, and whole groups of any size dividing 16.

use crate::isa;
use crate::matmul::{for_chunks, run_cells, Matrix, OutPtr, MIN_CHUNK_ROWS};
use std::ops::Range;

#[cfg(doc)]
use crate::matmul::matmul;

/// Where the chunks of [`matmul_then`] finish their cells: the cells of activation row `ti`
/// and computed rows `r` go to row `to[ti]` of `out` (row `ti` for [`Target::rows`]), columns
/// `r.start / per .. r.end / per`, a row of `out` being `rows / per` wide.
pub struct Target<'o> {
    pub(crate) out: &'o mut [f32],
    pub(crate) to: Option<&'o [usize]>,
    pub(crate) per: usize,
}

impl<'o> Target<'o> {
    /// Activation row `ti` into row `ti` of `out`, each `per` computed rows into one cell (2
    /// for rows that interleave a gate and an up projection, finished into their activation).
    /// `per` must divide 16 (the granularity of the row chunks).
    pub fn rows(out: &'o mut [f32], per: usize) -> Self {
        Self { out, to: None, per }
    }

    /// Activation row `ti` into row `to[ti]` of `out`, one cell per computed row (an expert's
    /// output into the running sums of the prompt rows that chose it). `to` must be strictly
    /// increasing, so no two activation rows finish into the same row of `out`.
    pub fn scatter(out: &'o mut [f32], to: &'o [usize]) -> Self {
        Self { out, to: Some(to), per: 1 }
    }

    /// The width of a row of `out` for a call of `t` activation rows on `rows` computed rows.
    ///
    /// # Panics
    /// As [`matmul_then`] on its target.
    pub(crate) fn check(&self, rows: usize, t: usize) -> usize {
        let per = self.per;
        assert!(
            per > 0 && MIN_CHUNK_ROWS.is_multiple_of(per) && rows.is_multiple_of(per),
            "matmul_then: {per} rows to a cell do not divide the row chunks of {rows} rows"
        );
        let width = rows / per;
        match self.to {
            None => assert_eq!(self.out.len(), t * width, "matmul_then: target length"),
            Some(to) => {
                assert_eq!(to.len(), t, "matmul_then: one target row per activation row");
                assert!(
                    to.windows(2).all(|w| w[0] < w[1]),
                    "matmul_then: target rows not increasing"
                );
                assert!(
                    to.last().is_none_or(|&l| (l + 1) * width <= self.out.len()),
                    "matmul_then: target row past the end"
                );
            }
        }
        width
    }
}

/// What a chunk hands its cells to: `finish(ti, r, y, out)` with `y = y[ti, r]`, just
/// computed, and `out` the [`Target`]'s cells for them.
pub type Finish<'f> = dyn Fn(usize, Range<usize>, &mut [f32], &mut [f32]) + Sync + 'f;

/// `y = x · Wᵀ` for `x [t, cols]` into `y [t, rows]`, each chunk of the pool call handing
/// its cells to `finish` right after computing them, one activation row `ti` at a time:
/// `finish(ti, r, &mut y[ti, r], &mut out[to[ti], r / per])` (see [`Target`]). One pool call
/// for a projection and the elementwise work after it, which a separate pass would run on the
/// engine thread alone; the cells are [`matmul`]'s bit for bit, and an elementwise `finish`
/// sees each once, so no result depends on the split.
///
/// # Panics
/// If `per` does not divide both 16 and `rows`; if `out` is not `t` rows of `rows / per`
/// ([`Target::rows`]); if `to` is not `t` strictly increasing rows inside `out`
/// ([`Target::scatter`]); or on the length mismatches [`matmul`] panics on.
pub fn matmul_then(
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    y: &mut [f32],
    target: Target<'_>,
    finish: &Finish<'_>,
) {
    let rows = m.rows();
    assert_eq!(x.len(), t * m.cols(), "matmul: x length");
    assert_eq!(y.len(), t * rows, "matmul: out length");
    let width = target.check(rows, t);
    let Target { out, to, per } = target;
    let isa = isa::isa();
    let (py, po) = (OutPtr::new(y), OutPtr::new(out));
    for_chunks(isa, x, t, rows, m.cols(), &|tk, r, pack| {
        // SAFETY: `isa` is the process's tier, which the CPU supports; `y` is `t * rows` long
        // (asserted) and exclusively borrowed until `for_chunks` returns, after every chunk
        // has finished, and the chunks' (token, row) ranges are disjoint.
        unsafe { run_cells(isa, m, x, tk.clone(), r.clone(), &py, pack) };
        // Cuts are multiples of MIN_CHUNK_ROWS (or `rows`), both multiples of `per` (asserted).
        assert!(
            r.start.is_multiple_of(per) && r.end.is_multiple_of(per),
            "matmul_then: a chunk splits a group"
        );
        let cols = r.start / per..r.end / per;
        for ti in tk {
            let row = to.map_or(ti, |to| to[ti]);
            // SAFETY: `ti < t` and `r` is inside `0..rows`, so the `y` cells are inside `y`,
            // this chunk's alone and just written. `row * width + cols.end <= out.len()`
            // (asserted: `row` is `ti < t`, or `to[ti] <= to[t - 1]`). No other chunk touches
            // these `out` cells: another activation row has another target row (`to` is
            // strictly increasing), and the same row in another chunk has a disjoint row range
            // whose ends are multiples of `per`, so disjoint columns. `y` and `out` are two
            // exclusive borrows (so never overlap), held until the call returns.
            let (cy, co) = unsafe {
                (
                    py.cells(ti * rows + r.start, r.len()),
                    po.cells(row * width + cols.start, cols.len()),
                )
            };
            finish(ti, r.clone(), cy, co);
        }
    });
}

/// `out_a = x · Aᵀ` and `out_b = x · Bᵀ` for two matrices of one shape in a single pool call
/// (a gated MLP's gate and up projections), each chunk then handing `finish` its cells of
/// both, one activation row at a time: `finish(&mut out_a[ti, rows], &mut out_b[ti, rows])`
/// for each activation row `ti` and row range `rows` of the chunk, right after it computed
/// them. Every cell is computed as [`matmul`] computes it, so the results are bit for bit
/// those of two calls of it; an elementwise `finish` (an activation) sees each cell once, so
/// its results do not depend on the split either. One call instead of three (gate, up, the
/// activation) per expert.
///
/// # Panics
/// If the shapes differ, or on the length mismatches [`matmul`] panics on.
pub fn matmul_pair(
    a: &Matrix<'_>,
    b: &Matrix<'_>,
    x: &[f32],
    t: usize,
    out_a: &mut [f32],
    out_b: &mut [f32],
    finish: &(dyn Fn(&mut [f32], &mut [f32]) + Sync),
) {
    assert_eq!((a.rows(), a.cols()), (b.rows(), b.cols()), "matmul_pair: shapes");
    assert_eq!(x.len(), t * a.cols(), "matmul: x length");
    assert_eq!(out_a.len(), t * a.rows(), "matmul: out length");
    assert_eq!(out_b.len(), t * a.rows(), "matmul: out length");
    let isa = isa::isa();
    let rows = a.rows();
    let (pa, pb) = (OutPtr::new(out_a), OutPtr::new(out_b));
    for_chunks(isa, x, t, rows, 2 * a.cols(), &|tk, r, pack| {
        // SAFETY: as in `matmul_then`, for each of the two outputs.
        unsafe {
            run_cells(isa, a, x, tk.clone(), r.clone(), &pa, pack);
            run_cells(isa, b, x, tk.clone(), r.clone(), &pb, pack);
        }
        for ti in tk {
            let at = ti * rows + r.start;
            // SAFETY: `ti < t` and `r` lies inside `0..rows`, so both ranges are inside their
            // buffers; this chunk owns these cells (disjoint from every other chunk's) and has
            // just written them, and no other reference to them exists until the call returns.
            let (ca, cb) = unsafe { (pa.cells(at, r.len()), pb.cells(at, r.len())) };
            finish(ca, cb);
        }
    });
}

/// `out[to[ti], r] += weight[ti] · y[ti, r]` for `y = x · Wᵀ` (computed into `y`, a
/// `t × rows` buffer): an expert's output added into the running sums of the prompt rows that
/// chose it, each chunk adding its own cells as soon as it has computed them ([`matmul_then`]
/// into [`Target::scatter`], finished by [`add_weighted`]: the same two roundings per cell as
/// a separate pass, so the same bits). `to` must be strictly increasing (an expert's rows, in
/// prompt order), so no two activation rows add into the same output row.
///
/// # Panics
/// If `to` or `weight` is not `t` long, `to` is not strictly increasing or names a row past
/// `out`, or on the length mismatches [`matmul`] panics on.
pub fn matmul_add_rows(
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    y: &mut [f32],
    to: &[usize],
    weight: &[f32],
    out: &mut [f32],
) {
    assert_eq!(weight.len(), t, "matmul_add_rows: one weight per activation row");
    matmul_then(m, x, t, y, Target::scatter(out, to), &|ti, _, cy, co| {
        add_weighted(co, cy, weight[ti]);
    });
}

/// `acc += y · weight`, elementwise: an expert's output row added into a prompt row's running
/// sum (`v · weight` rounded, then added; no fused multiply-add, which would round once and
/// change the bits the goldens hold).
pub fn add_weighted(acc: &mut [f32], y: &[f32], weight: f32) {
    for (a, &v) in acc.iter_mut().zip(y) {
        *a += v * weight;
    }
}
