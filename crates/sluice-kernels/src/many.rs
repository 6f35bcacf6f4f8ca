//! Several matmuls in one pool call: a layer's routed experts, each on its own rows, as one
//! call for their gate and up projections (and activation), one for their down projections,
//! and one for adding their outputs into the rows' running sums.
//!
//! Small experts made one expert's pool call cost about what its work did: Qwen3-30B-A3B's
//! experts (768 × 2048 gate and up) carry ~10 µs per thread at 16 threads, about the cost of
//! handing a call to the helpers and waiting for its last chunk, and a layer made two such calls
//! per expert (16 for a decode token, 256 for a 256-row prompt). Here a call takes a list of
//! jobs, each a matrix (or a gate/up pair) with its own activation rows and outputs, and the
//! pool runs every job's chunks, flattened in job order, as one call. A call of at least as
//! many jobs as threads is cut as one guided schedule (whole experts first, small chunks last);
//! a call of fewer jobs cuts each as [`matmul`] would cut it alone.
//!
//! Every cell is computed by [`matmul`]'s code (`run_cells`), so the results are bit for bit
//! those of one [`matmul`] (or [`matmul_pair`]) per job; how the jobs are batched changes no
//! bit. [`add_rows_many`] adds weighted rows into running sums in the order of its parts, each
//! cell with the two roundings of [`add_weighted`], split over columns, so each cell sees the
//! same operations in the same order as one [`matmul_add_rows`] per part in that order.
//! [`matmul_then_many`] is [`matmul_then`] for every job, each chunk finishing its cells with
//! its job's finish (GPT-OSS's interleaved gate/up rows with their bias into their activation,
//! its down rows with theirs).

use crate::finish::{add_weighted, Target};
use crate::isa;
use crate::matmul::{run_cells, split, Matrix, OutPtr, GUIDED_SHARE, MIN_CHUNK_ROWS, PAR_MIN_WORK};
use crate::wide::GROUP;
use std::ops::Range;

#[cfg(doc)]
use crate::{
    finish::matmul_add_rows, finish::matmul_pair, finish::matmul_then, finish::Finish,
    matmul::matmul,
};

/// One job of [`matmul_many`]: `out = x · mᵀ` for `x [t, m.cols()]`, `out [t, m.rows()]`.
pub struct Job<'a> {
    /// The weight matrix.
    pub m: Matrix<'a>,
    /// The job's activation rows, `t × m.cols()`.
    pub x: &'a [f32],
    /// Activation rows.
    pub t: usize,
    /// The output, `t × m.rows()`.
    pub out: &'a mut [f32],
}

/// One job of [`matmul_pair_many`]: `out_a = x · aᵀ` and `out_b = x · bᵀ` for two matrices of
/// one shape (an expert's gate and up projections).
pub struct PairJob<'a> {
    /// The first matrix (the gate projection).
    pub a: Matrix<'a>,
    /// The second, of the same shape (the up projection).
    pub b: Matrix<'a>,
    /// The job's activation rows, `t × a.cols()`.
    pub x: &'a [f32],
    /// Activation rows.
    pub t: usize,
    /// `x · aᵀ`, `t × a.rows()`.
    pub out_a: &'a mut [f32],
    /// `x · bᵀ`, `t × a.rows()`.
    pub out_b: &'a mut [f32],
}

/// A chunk of a batched call: job, activation rows, output rows.
type Chunk = (usize, Range<usize>, Range<usize>);

/// The chunks of jobs of shapes `(rows, cols, t)`, in job order. A call of at least as many
/// jobs as threads is cut as one whole ([`guided`]); otherwise each job is cut as [`matmul`]
/// cuts a call of that shape on a pool of `threads` (one chunk of everything when it would run
/// on the calling thread). How a job is cut changes no bit: every cell's reduction is the same.
fn chunks(threads: usize, shapes: impl Iterator<Item = (usize, usize, usize)>) -> Vec<Chunk> {
    let shapes: Vec<(usize, usize, usize)> = shapes.collect();
    let work: usize = shapes.iter().map(|&(r, c, t)| r * c * t).sum();
    if threads > 1 && shapes.len() >= threads && work >= PAR_MIN_WORK {
        return guided(threads, &shapes, work);
    }
    let mut all = Vec::new();
    for (j, &(rows, cols, t)) in shapes.iter().enumerate() {
        let Some((cuts, token_chunks)) = split(threads, rows, cols, t) else {
            all.push((j, 0..t, 0..rows));
            continue;
        };
        let tc = t.div_ceil(token_chunks);
        for ti in 0..token_chunks {
            for r in cuts.windows(2) {
                all.push((j, (ti * tc).min(t)..t.min((ti + 1) * tc), r[0]..r[1]));
            }
        }
    }
    all
}

/// The chunks of a call of many jobs (`work` flops / 2 in all), cut across the call as one
/// guided schedule: each chunk takes about `1 / (GUIDED_SHARE · threads)` of the work left
/// after it, in whole row groups of the prefill nest while that is at least one, then in
/// 16-row steps, never past its job's end. The first chunks are whole experts, so a thread
/// reads an expert's rows in one run, and its prefetch of the next column chunk and row
/// group carries it from panel to panel; the last chunks are small, so the call ends evenly.
/// (Cut job by job, a 256-row prefill of Qwen3-30B-A3B's layer made ~18,000 chunks of 16
/// rows on 16 threads, each starting cold: docs/PERFORMANCE.md, session 19.)
fn guided(threads: usize, shapes: &[(usize, usize, usize)], work: usize) -> Vec<Chunk> {
    let mut left = work;
    let mut all = Vec::new();
    for (j, &(rows, cols, t)) in shapes.iter().enumerate() {
        let per_row = (cols * t).max(1);
        let mut r0 = 0;
        while r0 < rows {
            let want = left / (GUIDED_SHARE * threads) / per_row;
            let size = if want >= GROUP {
                want / GROUP * GROUP
            } else {
                (want / MIN_CHUNK_ROWS * MIN_CHUNK_ROWS).max(MIN_CHUNK_ROWS)
            };
            let size = size.min(rows - r0);
            all.push((j, 0..t, r0..r0 + size));
            r0 += size;
            left = left.saturating_sub(size * per_row);
        }
    }
    all
}

/// Runs `f(i)` for every chunk index below `n` on the current pool, in one call (or on the
/// calling thread for a single-thread pool or a single chunk, as [`matmul`] runs a call it
/// does not split).
fn run(n: usize, f: &(dyn Fn(usize) + Sync)) {
    crate::pool::with_current(|pool| {
        if pool.threads() <= 1 || n <= 1 {
            (0..n).for_each(f);
        } else {
            pool.run(n, f);
        }
    });
}

/// [`matmul`] for every job, in one pool call: each job's chunks are the ones [`matmul`]
/// would cut for it alone, and every cell is computed by the same code, so each `out` is bit
/// for bit what [`matmul`] gives.
///
/// # Panics
/// If a job's `x` is not `t * m.cols()` long or its `out` not `t * m.rows()` long.
pub fn matmul_many(jobs: &mut [Job<'_>]) {
    let isa = isa::isa();
    let mut ins = Vec::with_capacity(jobs.len());
    let mut outs = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        assert_eq!(j.x.len(), j.t * j.m.cols(), "matmul: x length");
        assert_eq!(j.out.len(), j.t * j.m.rows(), "matmul: out length");
        ins.push((j.m, j.x, j.t));
        outs.push(OutPtr::new(j.out));
    }
    let threads = crate::pool::with_current(crate::pool::Pool::threads);
    let cs = chunks(threads, ins.iter().map(|(m, _, t)| (m.rows(), m.cols(), *t)));
    run(cs.len(), &|i| {
        let (j, tk, r) = cs[i].clone();
        let (m, x, _) = &ins[j];
        // SAFETY: `isa` is the process's tier, which the CPU supports. Job `j`'s `out` is
        // `t * rows` long (asserted) and exclusively borrowed through `jobs` until `run`
        // returns, after every chunk has finished. The chunks of one job are its cuts of
        // `0..t × 0..rows` as `matmul` makes them, so disjoint, and the chunks of different
        // jobs write different buffers (each job holds its own `&mut`, so they never overlap).
        unsafe { run_cells(isa, m, x, tk, r, &outs[j], None) };
    });
}

/// [`matmul_pair`] for every job, in one pool call: each job's chunks are the ones
/// [`matmul_pair`] would cut for it alone, each computing its cells of both outputs, then
/// handing them to `finish(&mut out_a[ti, rows], &mut out_b[ti, rows])` one activation row
/// at a time (an elementwise activation sees each cell once). Every cell is computed by
/// [`matmul`]'s code, so the results are bit for bit those of one [`matmul_pair`] per job.
///
/// # Panics
/// If a job's matrices differ in shape, or on the length mismatches [`matmul_pair`] panics on.
pub fn matmul_pair_many(
    jobs: &mut [PairJob<'_>],
    finish: &(dyn Fn(&mut [f32], &mut [f32]) + Sync),
) {
    let isa = isa::isa();
    let mut ins = Vec::with_capacity(jobs.len());
    let mut outs = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        let (rows, cols) = (j.a.rows(), j.a.cols());
        assert_eq!((rows, cols), (j.b.rows(), j.b.cols()), "matmul_pair: shapes");
        assert_eq!(j.x.len(), j.t * cols, "matmul: x length");
        assert_eq!(j.out_a.len(), j.t * rows, "matmul: out length");
        assert_eq!(j.out_b.len(), j.t * rows, "matmul: out length");
        ins.push((j.a, j.b, j.x, j.t));
        outs.push((OutPtr::new(j.out_a), OutPtr::new(j.out_b)));
    }
    let threads = crate::pool::with_current(crate::pool::Pool::threads);
    // Cut as `matmul_pair` cuts: both matrices' columns count as the call's work.
    let cs = chunks(threads, ins.iter().map(|(a, _, _, t)| (a.rows(), 2 * a.cols(), *t)));
    run(cs.len(), &|i| {
        let (j, tk, r) = cs[i].clone();
        let (a, b, x, _) = &ins[j];
        let (pa, pb) = &outs[j];
        let rows = a.rows();
        // SAFETY: as in `matmul_many`, for each of job `j`'s two outputs (`t * rows` long,
        // asserted; two exclusive borrows, so they never overlap each other or another job's).
        unsafe {
            run_cells(isa, a, x, tk.clone(), r.clone(), pa, None);
            run_cells(isa, b, x, tk.clone(), r.clone(), pb, None);
        }
        for ti in tk {
            let at = ti * rows + r.start;
            // SAFETY: `ti < t` and `r` lies inside `0..rows`, so both ranges are inside job
            // `j`'s buffers; this chunk owns these cells (disjoint from every other chunk's)
            // and has just written them, and no other reference to them exists until the call
            // returns.
            let (ca, cb) = unsafe { (pa.cells(at, r.len()), pb.cells(at, r.len())) };
            finish(ca, cb);
        }
    });
}

/// One job of [`matmul_then_many`]: `y = x · mᵀ` for `x [t, m.cols()]`, `y [t, m.rows()]`,
/// its chunks finishing their cells into `target` ([`matmul_then`]'s), or in `y` alone.
pub struct ThenJob<'a> {
    /// The weight matrix.
    pub m: Matrix<'a>,
    /// The job's activation rows, `t × m.cols()`.
    pub x: &'a [f32],
    /// Activation rows.
    pub t: usize,
    /// The computed cells, `t × m.rows()`.
    pub y: &'a mut [f32],
    /// Where the chunks finish their cells, as in [`matmul_then`]; `None`: in `y` alone (the
    /// `out` that `finish` sees is empty).
    pub target: Option<Target<'a>>,
}

/// What a chunk of [`matmul_then_many`] hands its cells to: `finish(job, ti, r, y, out)`, as
/// [`Finish`] with the job's index first (so each job can have its own bias).
pub type ManyFinish<'f> = dyn Fn(usize, usize, Range<usize>, &mut [f32], &mut [f32]) + Sync + 'f;

/// [`matmul_then`] for every job, in one pool call: each job's chunks are the ones [`matmul`]
/// would cut for it alone, each computing its cells, then handing them to
/// `finish(j, ti, r, &mut y[ti, r], out)` one activation row at a time, with `out` the job's
/// [`Target`] cells for them (empty without a target). Every cell is computed by [`matmul`]'s
/// code and an elementwise `finish` sees each once, so the results are bit for bit those of
/// one [`matmul_then`] per job: a layer's GPT-OSS experts' gate_up projections (bias and
/// clamped SwiGLU into their activations), or their down projections (and bias).
///
/// # Panics
/// On what [`matmul_then`] panics on, for any job.
pub fn matmul_then_many(jobs: &mut [ThenJob<'_>], finish: &ManyFinish<'_>) {
    let isa = isa::isa();
    let mut ins = Vec::with_capacity(jobs.len());
    let mut outs = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        let rows = j.m.rows();
        assert_eq!(j.x.len(), j.t * j.m.cols(), "matmul: x length");
        assert_eq!(j.y.len(), j.t * rows, "matmul: out length");
        let target = j.target.as_mut().map(|tg| {
            let width = tg.check(rows, j.t);
            (OutPtr::new(tg.out), tg.to, tg.per, width)
        });
        ins.push((j.m, j.x, j.t));
        outs.push((OutPtr::new(j.y), target));
    }
    let threads = crate::pool::with_current(crate::pool::Pool::threads);
    let cs = chunks(threads, ins.iter().map(|(m, _, t)| (m.rows(), m.cols(), *t)));
    run(cs.len(), &|i| {
        let (j, tk, r) = cs[i].clone();
        let (m, x, _) = &ins[j];
        let (py, target) = &outs[j];
        let rows = m.rows();
        // SAFETY: as in `matmul_many`, for job `j`'s `y` (`t * rows` long, asserted).
        unsafe { run_cells(isa, m, x, tk.clone(), r.clone(), py, None) };
        for ti in tk {
            // SAFETY: `ti < t` and `r` lies inside `0..rows`, so the range is inside job `j`'s
            // `y`; this chunk owns these cells and has just written them, and no other
            // reference to them exists until the call returns.
            let cy = unsafe { py.cells(ti * rows + r.start, r.len()) };
            let Some((po, to, per, width)) = target else {
                finish(j, ti, r.clone(), cy, &mut []);
                continue;
            };
            // Cuts are multiples of MIN_CHUNK_ROWS (or `rows`), both multiples of `per`
            // (checked).
            assert!(
                r.start.is_multiple_of(*per) && r.end.is_multiple_of(*per),
                "matmul_then: a chunk splits a group"
            );
            let cols = r.start / per..r.end / per;
            let row = to.map_or(ti, |to| to[ti]);
            // SAFETY: as in `matmul_then`: `row * width + cols.end` is inside the job's target
            // (checked), whose cells for this (row, columns) no other chunk touches; the
            // target is its own exclusive borrow, held until the call returns, so it
            // overlaps neither `y` nor another job's buffers.
            let co = unsafe { po.cells(row * width + cols.start, cols.len()) };
            finish(j, ti, r.clone(), cy, co);
        }
    });
}

/// One part of [`add_rows_many`]: `out[to[j], ..] += weight[j] · y[j, ..]` for each of its
/// rows `j` (an expert's outputs for the prompt rows that chose it).
pub struct AddRows<'a> {
    /// The part's rows, `to.len() × width`.
    pub y: &'a [f32],
    /// The row of `out` each row of `y` is added into, strictly increasing.
    pub to: &'a [usize],
    /// The weight of each row of `y`.
    pub weight: &'a [f32],
}

/// `out[to[j], c] += weight[j] · y[j, c]` for every part, **in the order of `parts`**, each
/// cell as [`add_weighted`] adds it (the product rounded, then the sum), in one pool call over
/// column ranges of `out` (`width` columns a row): each cell receives its parts' terms in the
/// order of `parts`, whatever the split, so the sums are bit for bit those of one
/// [`matmul_add_rows`] per part, in that order. A call of less work than [`matmul`] hands to
/// the pool runs on the calling thread.
///
/// # Panics
/// If `width` is 0 and `out` is not empty, `out` is not whole rows, or a part's `to` is not
/// strictly increasing, names a row past `out`, or does not match its `y` and `weight`.
pub fn add_rows_many(parts: &[AddRows<'_>], width: usize, out: &mut [f32]) {
    assert!(width > 0 || out.is_empty(), "add_rows_many: zero width");
    let n_out = out.len().checked_div(width).unwrap_or(0);
    assert_eq!(n_out * width, out.len(), "add_rows_many: out is not whole rows");
    let mut cells = 0usize;
    for p in parts {
        assert_eq!(p.y.len(), p.to.len() * width, "add_rows_many: y length");
        assert_eq!(p.weight.len(), p.to.len(), "add_rows_many: one weight per row");
        assert!(p.to.windows(2).all(|w| w[0] < w[1]), "add_rows_many: rows not increasing");
        assert!(p.to.last().is_none_or(|&l| l < n_out), "add_rows_many: row past the end");
        cells += p.y.len();
    }
    let threads = crate::pool::with_current(crate::pool::Pool::threads);
    // Column ranges of whole 16-column steps, about two a thread; one for a small call.
    let steps = width.div_ceil(MIN_CHUNK_ROWS);
    let n = if cells < PAR_MIN_WORK { 1 } else { (2 * threads).min(steps).max(1) };
    let po = OutPtr::new(out);
    let range = |i: usize| {
        let at = |k: usize| (steps * k / n * MIN_CHUNK_ROWS).min(width);
        at(i)..at(i + 1)
    };
    run(n, &|i| {
        let cols = range(i);
        for p in parts {
            for ((&row, &w), y) in p.to.iter().zip(p.weight).zip(p.y.chunks_exact(width)) {
                // SAFETY: `row < n_out` (asserted) and `cols` lies inside `0..width`, so the
                // cells are inside `out`, which is exclusively borrowed until `run` returns.
                // The chunks' column ranges are disjoint, and within this chunk the slice is
                // dropped before the next one is made, so no two references to a cell exist.
                let o = unsafe { po.cells(row * width + cols.start, cols.len()) };
                add_weighted(o, &y[cols.clone()], w);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_layer_batch_cut_each_expert_in_sixteen_row_chunks_that_all_started_cold() {
        // Qwen3-30B-A3B's gate/up call at a 256-row prompt: 128 experts of 768 rows, ~16 rows
        // each, 16 threads. Cut job by job it was ~6,000 chunks of 16 rows.
        let shapes: Vec<(usize, usize, usize)> =
            (0..128).map(|e| (768, 2 * 2048, 12 + e % 9)).collect();
        for threads in [2, 16] {
            let cs = chunks(threads, shapes.iter().copied());
            assert!(cs.len() < 4 * shapes.len(), "{threads} threads: {} chunks", cs.len());
            // Every (job, row) once, in job order, and every chunk whole 16-row steps unless it
            // ends its job.
            let mut next = vec![0usize; shapes.len()];
            let mut last_job = 0;
            for (j, tk, r) in &cs {
                assert!(*j >= last_job);
                last_job = *j;
                assert_eq!(*tk, 0..shapes[*j].2);
                assert_eq!(r.start, next[*j]);
                assert!(r.len() % MIN_CHUNK_ROWS == 0 || r.end == shapes[*j].0, "{r:?}");
                next[*j] = r.end;
            }
            assert!(next.iter().zip(&shapes).all(|(&n, s)| n == s.0));
            // Whole experts first; the call ends in chunks of a row step.
            assert_eq!(cs[0].2, 0..768);
            assert_eq!(cs[cs.len() - 1].2.len(), MIN_CHUNK_ROWS);
        }
        // A decode's few experts on many threads are still cut expert by expert.
        let few: Vec<(usize, usize, usize)> = (0..8).map(|_| (768, 4096, 1)).collect();
        assert!(chunks(16, few.iter().copied()).len() > 8);
    }
}
