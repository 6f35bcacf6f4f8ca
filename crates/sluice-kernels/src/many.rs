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
//! A prefill's experts that receive at least [`MIN_TOKENS`] rows (GPT-OSS-20B's 32 experts at
//! a 256-token prompt, Qwen3-30B-A3B's 128 at 1,024) take the outer-product nest, as one
//! [`matmul`] of theirs would: their activations are packed side by side into the pool's one
//! pack buffer (in blocks of at most 264 rows, as [`matmul`] packs a call), as many as it
//! holds at a time, all of a turn's in one pool call, and the turn's chunks, small jobs among
//! them, are then one pool call with their packs. No memory beyond that buffer: jobs whose
//! packs do not fit run in further turns (`crate::packed::in_turns`). A call that finds the
//! buffer lent runs every job unpacked, in one call, with the same bits.
//!
//! Every cell is computed by [`matmul`]'s code (`run_cells`), so the results are bit for bit
//! those of one [`matmul`] (or [`matmul_pair`]) per job; how the jobs are batched changes no
//! bit. [`add_rows_many`] adds weighted rows into running sums in the order of its parts, each
//! cell with the two roundings of [`add_weighted`], split over columns, so each cell sees the
//! same operations in the same order as one [`matmul_add_rows`] per part in that order.
//! [`matmul_then_many`] is [`matmul_then`] for every job, each chunk finishing its cells with
//! its job's finish (GPT-OSS's interleaved gate/up rows with their bias into their activation,
//! its down rows with theirs).

use crate::cuts::{chunk_list, cut_guided, packed_chunks, slice_units, sliced_enough, slices};
use crate::finish::{add_weighted, Target};
use crate::isa::{self, Isa};
use crate::matmul::{run_cells, Matrix, OutPtr, MIN_CHUNK_ROWS, PAR_MIN_WORK};
use crate::packed::{in_turns, Acts, Packed, Part};
use std::ops::Range;

#[cfg(doc)]
use crate::cuts::split;
#[cfg(doc)]
use crate::{
    finish::matmul_add_rows, finish::matmul_pair, finish::matmul_then, finish::Finish,
    matmul::matmul, packed::MIN_TOKENS,
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

/// A chunk of a batched call: part, activation rows (of the part's), output rows.
type Chunk = (usize, Range<usize>, Range<usize>);

/// A part of a batched call as [`chunks`] cuts it: `t` activation rows on a matrix of `rows`
/// rows, weighed as `cols` columns; `grouped` where the rows are packed, so that it is cut as
/// a packed call is ([`cut_guided`]: whole row groups, then token slices of whole groups).
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    t: usize,
    grouped: bool,
}

/// The chunks of parts of shapes `shapes`, in part order. A call of at least as many parts as
/// threads, or of packed parts with enough slices among them ([`sliced_enough`], as one
/// packed call is weighed), is cut as one whole ([`guided`]); otherwise each part is cut as
/// [`matmul`] cuts a call of that shape on a pool of `threads` (one chunk of everything when
/// it would run on the calling thread). How a part is cut changes no bit: every cell's reduction is the same.
///
/// **Why packed parts are cut as one whole.** Cut part by part, a packed expert with fewer row
/// groups than threads (768 rows are 12 on 16 threads) was cut as [`split`] cuts a small
/// matrix: in 16-row chunks, each folding a tile of one vector of rows and reading the
/// expert's whole pack for its 16 rows. A layer batch of 8 or 16 such experts of 128–256 rows
/// ran 1.13–1.21× faster on the device host's 16 threads cut as one whole (issue 20,
/// session 30).
fn chunks(threads: usize, shapes: impl Iterator<Item = Shape>) -> Vec<Chunk> {
    let shapes: Vec<Shape> = shapes.collect();
    let work: usize = shapes.iter().map(|s| s.rows * s.cols * s.t).sum();
    let units: usize = shapes.iter().map(|s| slice_units(s.rows, s.t)).sum();
    let sliced = shapes.iter().all(|s| slices(s.grouped, s.t)) && sliced_enough(threads, units);
    if threads > 1 && (shapes.len() >= threads || sliced) && work >= PAR_MIN_WORK {
        return guided(threads, &shapes, work);
    }
    let mut all = Vec::new();
    for (j, &Shape { rows, cols, t, grouped }) in shapes.iter().enumerate() {
        // As `for_chunks` cuts a call of that shape.
        let cs = if grouped {
            packed_chunks(threads, rows, cols, t)
        } else {
            chunk_list(threads, rows, cols, t, false)
        };
        all.extend(cs.into_iter().map(|(tk, r)| (j, tk, r)));
    }
    all
}

/// The chunks of a call of many parts (`work` flops / 2 in all), cut across the call as one
/// guided schedule: each chunk takes about `1 / (GUIDED_SHARE · threads)` of the work left
/// after it, in whole row groups of the prefill nest while that is at least one, then in
/// 16-row steps (a packed part: one row group at a time, by activation rows,
/// [`cut_guided`]), never past its part's end. The first chunks are whole experts, so a thread
/// reads an expert's rows in one run, and its prefetch of the next column chunk and row
/// group carries it from panel to panel; the last chunks are small, so the call ends evenly.
/// (Cut job by job, a 256-row prefill of Qwen3-30B-A3B's layer made ~18,000 chunks of 16
/// rows on 16 threads, each starting cold: docs/PERFORMANCE.md, session 19.)
fn guided(threads: usize, shapes: &[Shape], work: usize) -> Vec<Chunk> {
    let mut left = work;
    let mut all = Vec::new();
    for (j, &Shape { rows, cols, t, grouped }) in shapes.iter().enumerate() {
        let slice = slices(grouped, t);
        cut_guided(threads, rows, cols, t, slice, &mut left, |tk, r| all.push((j, tk, r)));
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

/// A job of a batched call as [`for_jobs`] cuts it: its activation rows, and its matrix's
/// rows and columns, the columns it is weighed as (both matrices' for a pair).
#[derive(Clone, Copy)]
struct JobShape<'x> {
    acts: Acts<'x>,
    rows: usize,
    work_cols: usize,
}

/// What [`for_jobs`] runs for each chunk: `f(job, tokens, rows, pack)`.
type JobChunkFn<'f> = dyn Fn(usize, Range<usize>, Range<usize>, Option<&Packed<'_>>) + Sync + 'f;

/// Runs `f(job, tokens, rows, pack)` over the chunks of the jobs `jobs` ([`chunks`]), in one
/// pool call per turn of the pool's pack buffer ([`in_turns`]): where the tier packs a
/// prefill's activations, the jobs of at least [`MIN_TOKENS`] rows are packed (in blocks as
/// [`matmul`] packs a call, as many as the buffer holds a turn) and their chunks handed their
/// block's pack, the other jobs' chunks none; else one call over every job, unpacked. Each
/// job's chunks cover its (token, row) cells once, disjoint, so every cell is computed once,
/// by [`matmul`]'s code.
fn for_jobs(isa: Isa, jobs: &[JobShape<'_>], f: &JobChunkFn<'_>) {
    let threads = crate::pool::with_current(crate::pool::Pool::threads);
    let acts: Vec<Acts<'_>> = jobs.iter().map(|j| j.acts).collect();
    in_turns(isa, &acts, &mut |parts| {
        let shape = |p: &Part<'_>| Shape {
            rows: jobs[p.job].rows,
            cols: jobs[p.job].work_cols,
            t: p.tokens.len(),
            grouped: p.pack.is_some(),
        };
        let cs = chunks(threads, parts.iter().map(shape));
        run(cs.len(), &|i| {
            let (k, tk, r) = cs[i].clone();
            let p = &parts[k];
            let t0 = p.tokens.start;
            f(p.job, t0 + tk.start..t0 + tk.end, r, p.pack.as_ref());
        });
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
    let (mut mats, mut shapes, mut outs) = (vec![], vec![], vec![]);
    for j in jobs.iter_mut() {
        let (rows, cols) = (j.m.rows(), j.m.cols());
        assert_eq!(j.x.len(), j.t * cols, "matmul: x length");
        assert_eq!(j.out.len(), j.t * rows, "matmul: out length");
        mats.push(j.m);
        shapes.push(JobShape { acts: Acts { x: j.x, t: j.t, cols }, rows, work_cols: cols });
        outs.push(OutPtr::new(j.out));
    }
    for_jobs(isa, &shapes, &|j, tk, r, pack| {
        // SAFETY: `isa` is the process's tier, which the CPU supports. Job `j`'s `out` is
        // `t * rows` long (asserted) and exclusively borrowed through `jobs` until `for_jobs`
        // returns, after every chunk has finished. The chunks of one job cover its
        // `0..t × 0..rows` cells once, disjoint, and the chunks of different jobs write
        // different buffers (each job holds its own `&mut`, so they never overlap).
        unsafe { run_cells(isa, &mats[j], shapes[j].acts.x, tk, r, &outs[j], pack) };
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
    let (mut mats, mut shapes, mut outs) = (vec![], vec![], vec![]);
    for j in jobs.iter_mut() {
        let (rows, cols) = (j.a.rows(), j.a.cols());
        assert_eq!((rows, cols), (j.b.rows(), j.b.cols()), "matmul_pair: shapes");
        assert_eq!(j.x.len(), j.t * cols, "matmul: x length");
        assert_eq!(j.out_a.len(), j.t * rows, "matmul: out length");
        assert_eq!(j.out_b.len(), j.t * rows, "matmul: out length");
        mats.push((j.a, j.b));
        // Cut as `matmul_pair` cuts: both matrices' columns count as the call's work.
        let acts = Acts { x: j.x, t: j.t, cols };
        shapes.push(JobShape { acts, rows, work_cols: 2 * cols });
        outs.push((OutPtr::new(j.out_a), OutPtr::new(j.out_b)));
    }
    for_jobs(isa, &shapes, &|j, tk, r, pack| {
        let ((a, b), x, rows) = (&mats[j], shapes[j].acts.x, shapes[j].rows);
        let (pa, pb) = &outs[j];
        // SAFETY: as in `matmul_many`, for each of job `j`'s two outputs (`t * rows` long,
        // asserted; two exclusive borrows, so they never overlap each other or another job's).
        unsafe {
            run_cells(isa, a, x, tk.clone(), r.clone(), pa, pack);
            run_cells(isa, b, x, tk.clone(), r.clone(), pb, pack);
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
    let (mut mats, mut shapes, mut outs) = (vec![], vec![], vec![]);
    for j in jobs.iter_mut() {
        let (rows, cols) = (j.m.rows(), j.m.cols());
        assert_eq!(j.x.len(), j.t * cols, "matmul: x length");
        assert_eq!(j.y.len(), j.t * rows, "matmul: out length");
        let target = j.target.as_mut().map(|tg| {
            let width = tg.check(rows, j.t);
            (OutPtr::new(tg.out), tg.to, tg.per, width)
        });
        mats.push(j.m);
        shapes.push(JobShape { acts: Acts { x: j.x, t: j.t, cols }, rows, work_cols: cols });
        outs.push((OutPtr::new(j.y), target));
    }
    for_jobs(isa, &shapes, &|j, tk, r, pack| {
        let (m, x, rows) = (&mats[j], shapes[j].acts.x, shapes[j].rows);
        let (py, target) = &outs[j];
        // SAFETY: as in `matmul_many`, for job `j`'s `y` (`t * rows` long, asserted).
        unsafe { run_cells(isa, m, x, tk.clone(), r.clone(), py, pack) };
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
        let shape = |t| Shape { rows: 768, cols: 2 * 2048, t, grouped: false };
        let shapes: Vec<Shape> = (0..128).map(|e| shape(12 + e % 9)).collect();
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
                assert_eq!(*tk, 0..shapes[*j].t);
                assert_eq!(r.start, next[*j]);
                assert!(r.len() % MIN_CHUNK_ROWS == 0 || r.end == shapes[*j].rows, "{r:?}");
                next[*j] = r.end;
            }
            assert!(next.iter().zip(&shapes).all(|(&n, s)| n == s.rows));
            // Whole experts first; the call ends in chunks of a row step.
            assert_eq!(cs[0].2, 0..768);
            assert_eq!(cs[cs.len() - 1].2.len(), MIN_CHUNK_ROWS);
        }
        // A decode's few experts on many threads are still cut expert by expert.
        let few: Vec<Shape> =
            (0..8).map(|_| Shape { rows: 768, cols: 4096, t: 1, grouped: false }).collect();
        assert!(chunks(16, few.iter().copied()).len() > 8);
    }

    #[test]
    fn a_batch_of_fewer_packed_experts_than_threads_was_cut_in_16_row_chunks_now_whole_row_groups()
    {
        // 8 experts' gate/up pairs of 768 rows (12 row groups), 128 rows each, on 16 threads.
        let shapes: Vec<Shape> =
            (0..8).map(|_| Shape { rows: 768, cols: 2 * 2048, t: 128, grouped: true }).collect();
        let cs = chunks(16, shapes.iter().copied());
        let mut seen = vec![0u8; 8 * 768 * 128];
        for (j, tk, r) in &cs {
            // Whole row groups; token slices of whole token groups.
            assert!(r.start % 64 == 0 && r.len() % 64 == 0, "{j} {tk:?} {r:?}");
            assert!(tk.start % crate::packed::GROUP_TOKENS == 0, "{j} {tk:?} {r:?}");
            for k in tk.clone() {
                for i in r.clone() {
                    seen[(j * 128 + k) * 768 + i] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "every cell once");
        // Spread over the threads, and ending in token slices of the last row groups.
        assert!(cs.len() >= 16 && cs.len() < 8 * 12 * 2, "{} chunks", cs.len());
        assert!(cs[cs.len() - 1].1.len() < 128, "{:?}", cs[cs.len() - 1]);
    }
}
