//! Prefill-sized calls (many activation rows): a T-row call equals T one-row calls bit for bit
//! at T up to 512 and in pools of 1 to 16 threads, on every tier; and the wide register tiles
//! equal the scalar reference at awkward shapes (every remainder of the 4-row × 6-token tiles,
//! AVX2's 3-row × 4-token half tiles, and the 64-row token blocks).
//!
//! Tiers as in `tests/matmul.rs`: every tier the CPU supports, or the one `SLUICE_ISA` forces.

// Not every helper of the shared test module is used here.
#[allow(dead_code)]
mod common;

use common::{
    bits, mode, pair_and_plain_stages_equal_one_call_per_job, tiers, values, Mode, Rng, Weights,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_kernels::matmul::matmul_scalar;
use sluice_kernels::{
    add_rows_many, matmul, matmul_add_rows, matmul_pair, matmul_then, matmul_then_many,
    matmul_with, AddRows, Pool, Target, ThenJob,
};

/// Activation-row counts: small, around the 8-row and 64-row token blocks and the 6-row
/// tiles, and prefill chunk sizes.
const TS: [usize; 11] = [1, 2, 3, 7, 8, 9, 17, 64, 255, 256, 512];
/// Pool sizes.
const THREADS: [usize; 4] = [1, 2, 3, 16];

/// Every T of [`TS`] in every pool of [`THREADS`] equals one-row calls, which equal the scalar
/// reference, for each format; shapes with tails in every dimension, one with too few output
/// rows to split by rows (so the pool splits activation rows).
#[test]
fn t_rows_equal_one_row_calls_at_any_t_and_thread_count() {
    // 70 rows: a full 64-row group and one of 6 (packed tiles of 4 + 2 on AVX-512, row
    // triples on AVX2); 65 rows: a group of one row, at 17 columns (one step and a partial
    // one).
    let shapes = [
        ("bf16", 70, 300),
        ("int8", 70, 529),
        ("mxfp4", 70, 1056),
        ("bf16", 20, 300),
        ("f32", 65, 17),
        // Enough rows that a 2-thread prefill's last chunks are partial row groups (48, 32
        // and 16 rows after whole groups of 64), and a 16-thread one's are all 16 rows; where
        // the tier packs (T >= 33 on AVX-512 and AVX2), row groups cut by activation rows.
        ("int8", 400, 40),
    ];
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    let t_max = TS[TS.len() - 1];
    for (k, &(format, rows, cols)) in shapes.iter().enumerate() {
        let mut rng = Rng::new(0x7E57_0000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
        let m = w.matrix();
        let x = values(&mut rng, Mode::Normal, t_max * cols);
        let mut want = vec![0.0f32; t_max * rows];
        matmul_scalar(&m, &x, t_max, &mut want);
        let want = bits(&want);
        for isa in tiers() {
            // One-row calls on this tier, one thread.
            let mut single = vec![f32::NAN; t_max * rows];
            pools[0].install(|| {
                for (xr, o) in x.chunks_exact(cols).zip(single.chunks_exact_mut(rows)) {
                    matmul_with(isa, &m, xr, 1, o);
                }
            });
            assert_eq!(bits(&single), want, "{isa} {format} {rows}x{cols}: one-row calls");
            for (pool, threads) in pools.iter().zip(THREADS) {
                for t in TS {
                    let mut got = vec![f32::NAN; t * rows];
                    pool.install(|| matmul_with(isa, &m, &x[..t * cols], t, &mut got));
                    if let Some(i) = bits(&got).iter().zip(&want).position(|(g, w)| g != w) {
                        panic!(
                            "{isa} {format} {rows}x{cols} t={t} threads={threads}: cell \
                             (t={}, r={}) differs from the one-row call",
                            i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }
}

/// A gated MLP's gate and up projections in one call ([`matmul_pair`]) equal two [`matmul`]
/// calls bit for bit at every T and thread count, and its `finish` (here an elementwise
/// function, as an activation is) sees each cell exactly once, right after the cell's chunk
/// computed it.
#[test]
fn gate_and_up_in_one_call_equal_two_calls_and_the_activation_sees_each_cell_once() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    for (k, &(format, rows, cols)) in
        [("mxfp4", 200, 96), ("bf16", 70, 300), ("int8", 20, 33)].iter().enumerate()
    {
        let mut rng = Rng::new(0x9A1B_0000 + u64::try_from(k).expect("small"));
        let (wa, wb) = (
            Weights::gen(format, rows, cols, &mut rng, Mode::Normal),
            Weights::gen(format, rows, cols, &mut rng, Mode::Normal),
        );
        let (a, b) = (wa.matrix(), wb.matrix());
        let t_max = TS[TS.len() - 1];
        let x = values(&mut rng, Mode::Normal, t_max * cols);
        let finish = |ca: &mut [f32], cb: &mut [f32]| {
            for (va, vb) in ca.iter_mut().zip(cb.iter_mut()) {
                *va = *va * 0.5 + *vb;
                *vb = -*vb;
            }
        };
        for (pool, threads) in pools.iter().zip(THREADS) {
            for t in TS {
                let xs = &x[..t * cols];
                let (mut want_a, mut want_b) = (vec![0.0f32; t * rows], vec![0.0f32; t * rows]);
                let (mut got_a, mut got_b) = (vec![f32::NAN; t * rows], vec![f32::NAN; t * rows]);
                pool.install(|| {
                    matmul(&a, xs, t, &mut want_a);
                    matmul(&b, xs, t, &mut want_b);
                    matmul_pair(&a, &b, xs, t, &mut got_a, &mut got_b, &finish);
                });
                finish(&mut want_a, &mut want_b);
                let what = format!("{format} {rows}x{cols} t={t} threads={threads}");
                assert_eq!(bits(&got_a), bits(&want_a), "{what}: gate cells");
                assert_eq!(bits(&got_b), bits(&want_b), "{what}: up cells");
            }
        }
    }
}

/// An expert's output added into its rows' running sums by the down projection's own chunks
/// ([`matmul_add_rows`]) equals a [`matmul`] and then `acc += y · w` per row, bit for bit, at
/// every T and thread count; the other rows are untouched.
#[test]
fn an_experts_output_added_on_the_engine_thread_alone_now_added_by_each_chunk() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    for (k, &(format, rows, cols)) in [("mxfp4", 200, 96), ("int8", 20, 33)].iter().enumerate() {
        let mut rng = Rng::new(0xADD0_0000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
        let m = w.matrix();
        let t_max = TS[TS.len() - 1];
        let x = values(&mut rng, Mode::Normal, t_max * cols);
        let weights = values(&mut rng, Mode::Normal, t_max);
        let base = values(&mut rng, Mode::Normal, (2 * t_max + 1) * rows);
        for (pool, threads) in pools.iter().zip(THREADS) {
            for t in TS {
                let xs = &x[..t * cols];
                // Every other prompt row, from row 1.
                let to: Vec<usize> = (0..t).map(|i| 2 * i + 1).collect();
                let mut want = base.clone();
                let mut y = vec![0.0f32; t * rows];
                let mut got = base.clone();
                let mut y2 = vec![f32::NAN; t * rows];
                pool.install(|| {
                    matmul(&m, xs, t, &mut y);
                    matmul_add_rows(&m, xs, t, &mut y2, &to, &weights[..t], &mut got);
                });
                for (ti, &row) in to.iter().enumerate() {
                    let acc = &mut want[row * rows..(row + 1) * rows];
                    for (a, &v) in acc.iter_mut().zip(&y[ti * rows..(ti + 1) * rows]) {
                        *a += v * weights[ti];
                    }
                }
                let what = format!("{format} {rows}x{cols} t={t} threads={threads}");
                assert_eq!(bits(&got), bits(&want), "{what}");
                assert_eq!(bits(&y2), bits(&y), "{what}: the projection itself");
            }
        }
    }
}

/// A layer's experts as jobs of one pool call each ([`matmul_pair_many`], [`matmul_many`],
/// [`add_rows_many`]) equal one call per expert ([`matmul_pair`], [`matmul`],
/// [`matmul_add_rows`] in job order) bit for bit, whatever each job's rows (0 to 40, so some
/// jobs split and some run whole) and on pools of 1 to 16 threads: small experts made two
/// pool calls each.
#[test]
fn a_layers_small_experts_made_two_pool_calls_each_now_one_per_stage() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    for (k, &(format, rows, cols)) in [("mxfp4", 96, 256), ("bf16", 70, 300)].iter().enumerate() {
        let mut rng = Rng::new(0x3A11_0000 + u64::try_from(k).expect("small"));
        let ws: Vec<_> = (0..6)
            .map(|_| {
                let mut w = || {
                    Weights::gen(format, rows, cols, &mut Rng::new(rng.next_u64()), Mode::Normal)
                };
                (w(), w())
            })
            .collect();
        let act = |ca: &mut [f32], cb: &mut [f32]| {
            for (va, vb) in ca.iter_mut().zip(cb.iter_mut()) {
                *va = *va * 0.5 + *vb;
            }
        };
        for (pool, threads) in pools.iter().zip(THREADS) {
            for round in 0..8 {
                let ts: Vec<usize> = (0..ws.len()).map(|_| rng.below(41)).collect();
                let xs: Vec<Vec<f32>> =
                    ts.iter().map(|&t| values(&mut rng, Mode::Normal, t * cols)).collect();
                let what = format!("{format} rows {ts:?} threads={threads} round {round}");
                // One call per job against the batched pair and plain stages (the plain
                // stage: the first matrix again).
                let want = pair_and_plain_stages_equal_one_call_per_job(
                    pool,
                    &ws,
                    &xs,
                    &ts,
                    &act,
                    |w| &w.0,
                    &what,
                );
                // Each job's rows into some of 81 running sums, in job order (rows of
                // different jobs overlap), the jobs eight times over (enough cells that the
                // call is split over the pool).
                let n_out = 81;
                let base = values(&mut rng, Mode::Normal, n_out * rows);
                let tos: Vec<Vec<usize>> = ts
                    .iter()
                    .map(|&t| {
                        let mut to: Vec<usize> = (0..n_out).collect();
                        for i in 0..t {
                            to.swap(i, i + rng.below(n_out - i));
                        }
                        to.truncate(t);
                        to.sort_unstable();
                        to
                    })
                    .collect();
                let wts: Vec<Vec<f32>> =
                    ts.iter().map(|&t| values(&mut rng, Mode::Normal, t)).collect();
                let mut each = base.clone();
                let mut all = base.clone();
                pool.install(|| {
                    for _ in 0..8 {
                        for ((((wa, _), x), (t, to)), wt) in
                            ws.iter().zip(&xs).zip(ts.iter().zip(&tos)).zip(&wts)
                        {
                            let mut y = vec![0.0f32; t * rows];
                            matmul_add_rows(&wa.matrix(), x, *t, &mut y, to, wt, &mut each);
                        }
                    }
                    let parts: Vec<AddRows<'_>> = (0..8)
                        .flat_map(|_| want.iter().zip(&tos).zip(&wts))
                        .map(|(([_, _, y], to), wt)| AddRows { y, to, weight: wt })
                        .collect();
                    add_rows_many(&parts, rows, &mut all);
                });
                assert_eq!(bits(&all), bits(&each), "{what}: running sums");
            }
        }
    }
}

/// Rows that interleave two projections (GPT-OSS's gate even, up odd), finished pair by pair
/// into their activation by the chunks of one call ([`matmul_then`] into [`Target::rows`]),
/// equal a [`matmul`] and then a pass over whole rows, bit for bit, at every T and thread
/// count: no chunk splits a pair, and each pair is finished once. Before, the pass ran on the
/// engine thread alone.
#[test]
fn interleaved_row_pairs_finished_on_the_engine_thread_alone_now_finished_by_each_chunk() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    // 200 rows: a 2-thread prefill ends in partial row groups; 70: the last chunk is 6 rows.
    for (k, &(format, rows, cols)) in [("mxfp4", 200, 96), ("bf16", 70, 300)].iter().enumerate() {
        let mut rng = Rng::new(0x9A12_0000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
        let m = w.matrix();
        let t_max = TS[TS.len() - 1];
        let x = values(&mut rng, Mode::Normal, t_max * cols);
        let bias = values(&mut rng, Mode::Normal, rows);
        // A bias in place, then an elementwise function of each pair.
        let pairs = |r: std::ops::Range<usize>, y: &mut [f32], o: &mut [f32]| {
            for (v, &b) in y.iter_mut().zip(&bias[r]) {
                *v += b;
            }
            for (o, p) in o.iter_mut().zip(y.chunks_exact(2)) {
                *o = p[0].min(2.0) * (p[1] + 1.0);
            }
        };
        for (pool, threads) in pools.iter().zip(THREADS) {
            for t in TS {
                let xs = &x[..t * cols];
                let (mut y, mut want) = (vec![0.0f32; t * rows], vec![0.0f32; t * rows / 2]);
                let (mut y2, mut got) = (vec![f32::NAN; t * rows], vec![f32::NAN; t * rows / 2]);
                pool.install(|| {
                    matmul(&m, xs, t, &mut y);
                    let finish = |_: usize, r, y: &mut [f32], o: &mut [f32]| pairs(r, y, o);
                    matmul_then(&m, xs, t, &mut y2, Target::rows(&mut got, 2), &finish);
                });
                for (yr, wr) in y.chunks_exact_mut(rows).zip(want.chunks_exact_mut(rows / 2)) {
                    pairs(0..rows, yr, wr);
                }
                let what = format!("{format} {rows}x{cols} t={t} threads={threads}");
                assert_eq!(bits(&got), bits(&want), "{what}");
                assert_eq!(bits(&y2), bits(&y), "{what}: the projection and its bias");
            }
        }
    }
}

/// GPT-OSS's experts as jobs of one pool call ([`matmul_then_many`]): each job's gate_up rows
/// finished pair by pair into their activation ([`Target::rows`]) with the job's own bias,
/// its down rows finished in place (no target), and its rows added into running sums
/// ([`Target::scatter`]), equal one [`matmul_then`] per job bit for bit, whatever each job's
/// rows (0 to 40) and on pools of 1 to 16 threads: GPT-OSS's experts made two pool calls each.
#[test]
fn gpt_oss_experts_made_two_pool_calls_each_now_one_per_stage() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    for (k, &(format, rows, cols)) in [("mxfp4", 96, 256), ("bf16", 70, 300)].iter().enumerate() {
        let mut rng = Rng::new(0x6055_0000 + u64::try_from(k).expect("small"));
        let ws: Vec<_> = (0..6)
            .map(|_| Weights::gen(format, rows, cols, &mut Rng::new(rng.next_u64()), Mode::Normal))
            .collect();
        let biases: Vec<Vec<f32>> =
            (0..ws.len()).map(|_| values(&mut rng, Mode::Normal, rows)).collect();
        // The job's bias in place, then an elementwise function of each pair into a target of
        // half the width, or of each cell into a target of the same width (running sums), or
        // none. (A finish must not depend on where a chunk's rows start or end: the many-job
        // call cuts jobs differently from one call per job.)
        let finish = |j: usize, r: std::ops::Range<usize>, y: &mut [f32], o: &mut [f32]| {
            for (v, &b) in y.iter_mut().zip(&biases[j][r]) {
                *v += b;
            }
            if o.len() == y.len() {
                for (o, &v) in o.iter_mut().zip(y.iter()) {
                    *o += v.min(2.0);
                }
            } else {
                for (o, p) in o.iter_mut().zip(y.chunks_exact(2)) {
                    *o = p[0].min(2.0) * (p[1] + 1.0);
                }
            }
        };
        let n_out = 81;
        for (pool, threads) in pools.iter().zip(THREADS) {
            for round in 0..8 {
                let ts: Vec<usize> = (0..ws.len()).map(|_| rng.below(41)).collect();
                let xs: Vec<Vec<f32>> =
                    ts.iter().map(|&t| values(&mut rng, Mode::Normal, t * cols)).collect();
                let tos: Vec<Vec<usize>> = ts
                    .iter()
                    .map(|&t| {
                        let mut to: Vec<usize> = (0..n_out).collect();
                        for i in 0..t {
                            to.swap(i, i + rng.below(n_out - i));
                        }
                        to.truncate(t);
                        to.sort_unstable();
                        to
                    })
                    .collect();
                let what = format!("{format} rows {ts:?} threads={threads} round {round}");
                let z = |n: usize| vec![f32::NAN; n];
                for stage in ["pairs", "in place", "scatter"] {
                    let out = |t: usize| match stage {
                        "pairs" => z(t * rows / 2),
                        "in place" => Vec::new(),
                        _ => values(&mut Rng::new(7), Mode::Normal, n_out * rows),
                    };
                    let mut want: Vec<(Vec<f32>, Vec<f32>)> =
                        ts.iter().map(|&t| (z(t * rows), out(t))).collect();
                    let mut got = want.clone();
                    pool.install(|| {
                        for (j, ((w, x), ((t, to), (y, o)))) in
                            ws.iter().zip(&xs).zip(ts.iter().zip(&tos).zip(&mut want)).enumerate()
                        {
                            let f = |_: usize, r, cy: &mut [f32], co: &mut [f32]| {
                                finish(j, r, cy, co);
                            };
                            match target(stage, o, to) {
                                Some(tg) => matmul_then(&w.matrix(), x, *t, y, tg, &f),
                                // In place: a target of `y`'s own width the finish ignores.
                                None => {
                                    let mut o = vec![0.0f32; t * rows];
                                    let f = |_: usize, r, cy: &mut [f32], _: &mut [f32]| {
                                        finish(j, r, cy, &mut []);
                                    };
                                    matmul_then(&w.matrix(), x, *t, y, Target::rows(&mut o, 1), &f);
                                }
                            }
                        }
                        let mut jobs: Vec<ThenJob<'_>> = ws
                            .iter()
                            .zip(&xs)
                            .zip(ts.iter().zip(&tos).zip(&mut got))
                            .map(|((w, x), ((&t, to), (y, o)))| ThenJob {
                                m: w.matrix(),
                                x,
                                t,
                                y,
                                target: target(stage, o, to),
                            })
                            .collect();
                        matmul_then_many(&mut jobs, &|j, _, r, cy, co| finish(j, r, cy, co));
                    });
                    for (w, g) in want.iter().zip(&got) {
                        assert_eq!(bits(&g.0), bits(&w.0), "{what} {stage}: cells and bias");
                        assert_eq!(bits(&g.1), bits(&w.1), "{what} {stage}: finished cells");
                    }
                }
            }
        }
    }
}

/// The target of a job of [`gpt_oss_experts_made_two_pool_calls_each_now_one_per_stage`].
fn target<'a>(stage: &str, o: &'a mut [f32], to: &'a [usize]) -> Option<Target<'a>> {
    match stage {
        "pairs" => Some(Target::rows(o, 2)),
        "in place" => None,
        _ => Some(Target::scatter(o, to)),
    }
}

/// A group of rows that does not divide the 16-row cuts could be split between chunks; the
/// call refuses it before any work, whatever the pool.
#[test]
#[should_panic(expected = "do not divide the row chunks")]
fn a_finish_over_groups_the_cuts_could_split_is_refused() {
    let w = [0u8; 48 * 4 * 4];
    let m = sluice_kernels::Matrix::f32(48, 4, &w).expect("matrix");
    let (x, mut y, mut out) = ([0.0f32; 4], [0.0f32; 48], [0.0f32; 16]);
    matmul_then(&m, &x, 1, &mut y, Target::rows(&mut out, 3), &|_, _, _, _| {});
}

/// Calls of more than eight rows reuse their thread's scratch (the weight panel, accumulators,
/// padded activation tails): a call after a larger or differently shaped one on the same
/// thread still equals the scalar reference, whatever the earlier call left in the buffers,
/// including a row group, chunk or token block smaller than the last one's and a partial
/// 16-column tail after full ones.
#[test]
fn wide_scratch_reused_across_calls_of_different_t_and_shape() {
    let calls = [
        ("mxfp4", 70, 1056, 256),
        ("f32", 33, 17, 9),
        ("bf16", 5, 3, 130),
        ("int8", 40, 529, 65),
        ("bf16", 70, 300, 512),
        ("f32", 1, 1, 10),
        ("mxfp4", 3, 544, 64),
        ("f32", 33, 17, 9),
    ];
    let pool = Pool::new(1).expect("kernel pool");
    for isa in tiers() {
        for (k, &(format, rows, cols, t)) in calls.iter().enumerate() {
            let mut rng = Rng::new(0x5C2A_7C00 + u64::try_from(k).expect("small"));
            let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
            let m = w.matrix();
            let x = values(&mut rng, Mode::Normal, t * cols);
            let mut want = vec![0.0f32; t * rows];
            matmul_scalar(&m, &x, t, &mut want);
            let mut got = vec![f32::NAN; t * rows];
            pool.install(|| matmul_with(isa, &m, &x, t, &mut got));
            assert_eq!(bits(&got), bits(&want), "{isa} call {k}: {format} {rows}x{cols} t={t}");
        }
    }
}

/// The edges of AVX2's half tiles (3 weight rows × 4 activation rows, each 8-lane half folded
/// over the whole span from a half-split panel) equal the scalar reference on every tier:
/// widths 1–17 (no whole step, one step, a step and a partial one), 33, a chunk plus a
/// partial step (1041) and two chunks plus a step (2064); row counts around the 3-row tiles;
/// T around the 4-row token groups (just past the few-row nest, 65–71 rows in one block, and
/// 128-row token blocks split in two), with mixed values (±0.0, subnormal and large products) in either operand.
#[test]
fn half_tiles_equal_the_scalar_reference_at_every_edge() {
    let widths: Vec<usize> = (1..=17).chain([33, 1041, 2064]).collect();
    let rows = [1, 2, 3, 4, 5, 7, 35];
    let ts = [9, 10, 11, 12, 13, 16, 65, 68, 71, 129, 135];
    let mut k = 0u64;
    for &cols in &widths {
        for (i, &r) in rows.iter().enumerate() {
            // Long rows with every T; short ones cycle through the formats and modes.
            for &t in &ts {
                k += 1;
                if cols > 64 && (i + t) % 3 != 0 {
                    continue;
                }
                let format = ["f32", "bf16", "int8"][usize::try_from(k % 3).expect("small")];
                let (wm, xm) = if k.is_multiple_of(2) {
                    (Mode::Mixed, Mode::Normal)
                } else {
                    (Mode::Normal, Mode::Mixed)
                };
                if let Err(e) = check(format, r, cols, t, 0x4A1F_0000 + k, wm, xm) {
                    panic!("{e}");
                }
            }
        }
    }
    for cols in [32, 1056, 2080] {
        for (k, t) in [9u64, 12, 65, 71].into_iter().enumerate() {
            if let Err(e) = check(
                "mxfp4",
                35,
                cols,
                usize::try_from(t).expect("small"),
                0x4A1F_8000 + t,
                Mode::Mixed,
                Mode::Mixed,
            ) {
                panic!("mxfp4 case {k}: {e}");
            }
        }
    }
}

/// Activations that start 16 bytes past a cache line (as a large `Vec<f32>` does) made every
/// 64-byte AVX-512 load of them straddle two lines (and AVX2's high-half loads); a token
/// group's activations are now read from an aligned copy its first tile makes. At every start
/// offset within a line (0–15 floats), each tier equals the scalar reference bit for bit: row
/// counts below, at and past a tile of 3 or 4 rows (a sweep shorter than one tile is not
/// staged), token groups of 1–6 rows and two token blocks, spans with a partial 16-column
/// step and past a chunk, mixed values.
#[test]
fn activations_16_bytes_past_a_line_split_every_avx512_load_the_staged_copy_is_exact() {
    let cases = [
        ("f32", 35, 1041, 135),
        ("bf16", 70, 300, 256),
        ("mxfp4", 5, 1056, 13),
        ("int8", 3, 2064, 11),
        ("bf16", 4, 33, 130),
    ];
    let pool = Pool::new(1).expect("kernel pool");
    for (k, &(format, rows, cols, t)) in cases.iter().enumerate() {
        let mut rng = Rng::new(0x57A6_E000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Normal);
        let m = w.matrix();
        let xm = if k.is_multiple_of(2) { Mode::Mixed } else { Mode::Normal };
        let x = values(&mut rng, xm, t * cols);
        let mut want = vec![0.0f32; t * rows];
        matmul_scalar(&m, &x, t, &mut want);
        let want = bits(&want);
        let mut buf = vec![0.0f32; t * cols + 16];
        for off in 0..16 {
            buf[off..off + t * cols].copy_from_slice(&x);
            let xs = &buf[off..off + t * cols];
            for isa in tiers() {
                let mut got = vec![f32::NAN; t * rows];
                pool.install(|| matmul_with(isa, &m, xs, t, &mut got));
                assert_eq!(
                    bits(&got),
                    want,
                    "{isa} {format} {rows}x{cols} t={t}: activations {off} floats in"
                );
            }
        }
    }
}

/// Calls of 2 to 32 activation rows on bf16 rows of a multiple of 16 columns used to widen
/// every chunk into a buffer (8 rows or fewer) or a panel before folding it, waiting on memory
/// first; the AVX-512 tier now folds them straight from the stored bytes (`stored.rs`), and
/// so does the AVX2 tier (session 26: `arch/avx2/stored.rs`, bf16, int8 and f32). Every
/// result still equals the scalar reference bit for bit, on every tier, at every token count
/// of the range (whole and partial 6-token groups), row counts around the 4-row tiles and the
/// 64-row groups, one to three column chunks and a partial one, activations on and off a
/// cache line, and in a pool of three threads (row chunks split between them).
#[test]
fn few_row_bf16_calls_widened_each_chunk_before_folding_now_fold_the_stored_bytes_same_bits() {
    let shapes = [(1, 16), (5, 1024), (70, 1040), (130, 2064), (3, 3072)];
    few_row_calls_same_bits("bf16", &shapes, &[Mode::Mixed], 0x5704_ED00);
}

/// As the bf16 test above, on MXFP4 rows: the AVX-512 tile decodes each half block of its
/// rows in a register from the packed nibbles and scales (`formats/mxfp4_avx512.rs`); the
/// weights alternate the generator's modes, so scales range over 100..150 and over its set of
/// edge bytes (2^-127, the subnormal one, included) and codes over every nibble and ±0 only.
#[test]
fn few_row_mxfp4_calls_fold_the_packed_nibbles_same_bits() {
    let shapes = [(1, 32), (5, 1024), (70, 1056), (130, 2080), (3, 3072), (9, 64)];
    let modes = [Mode::Mixed, Mode::Normal, Mode::Zeros];
    few_row_calls_same_bits("mxfp4", &shapes, &modes, 0x5704_ED10);
}

/// As the bf16 test above, on INT4 group rows: MXFP4's tile over the table `nibble − 8` and
/// the bf16 group scales (`formats/int4_group.rs`).
#[test]
fn few_row_int4_calls_fold_the_packed_nibbles_same_bits() {
    let shapes = [(1, 32), (5, 1024), (70, 1056), (130, 2080), (3, 3072), (9, 64)];
    let modes = [Mode::Mixed, Mode::Normal, Mode::Tiny, Mode::Large, Mode::Zeros];
    few_row_calls_same_bits("int4", &shapes, &modes, 0x5704_ED20);
}

/// As the bf16 test above, on row-int8 rows, which widened each chunk into a buffer or a
/// panel too: the AVX-512 tile sign-extends and converts 16 stored bytes in a register and
/// folds the integers, the row scale multiplying the reduced sum as before; the weights
/// alternate the generator's modes (scales from f16 subnormals to 65504, all-zero rows).
#[test]
fn few_row_int8_calls_widened_each_chunk_before_folding_now_fold_the_stored_bytes_same_bits() {
    let shapes = [(1, 16), (5, 1024), (70, 1040), (130, 2064), (3, 3072), (9, 48)];
    let modes = [Mode::Mixed, Mode::Normal, Mode::Large, Mode::Tiny, Mode::Zeros];
    few_row_calls_same_bits("int8", &shapes, &modes, 0x5704_ED30);
}

/// As the bf16 test above, on f32 rows, which were copied chunk by chunk into a buffer or a
/// panel before folding: the AVX-512 tile loads them as they are stored.
#[test]
fn few_row_f32_calls_copied_each_chunk_before_folding_now_fold_the_stored_bytes_same_bits() {
    let shapes = [(1, 16), (5, 1024), (70, 1040), (130, 2064), (3, 3072), (9, 48)];
    let modes = [Mode::Mixed, Mode::Normal, Mode::Large, Mode::Tiny, Mode::Zeros];
    few_row_calls_same_bits("f32", &shapes, &modes, 0x5704_ED40);
}

/// As the bf16 test above, on FP8 block rows, which were widened chunk by chunk into a buffer
/// or a panel before folding: the AVX-512 tile widens 16 stored codes in a register per step
/// (through halves, the scale's product fused, NaN codes masked) and folds them into every
/// token's accumulators; the weights alternate the generator's modes (every finite code,
/// scales from f32 subnormals to 1e30).
#[test]
fn few_row_fp8_calls_widened_each_chunk_before_folding_now_fold_the_stored_codes_same_bits() {
    let shapes = [(1, 16), (5, 1024), (70, 1040), (130, 2064), (3, 3072), (9, 144)];
    let modes = [Mode::Mixed, Mode::Normal, Mode::Large, Mode::Tiny, Mode::Zeros];
    few_row_calls_same_bits("fp8", &shapes, &modes, 0x5704_ED50);
}

/// Every call of 2 to 33 activation rows on `format` rows of `shapes` (weights of
/// `modes[k % modes.len()]` for shape `k`) equals the scalar reference bit for bit, on every
/// tier, activations off a cache line, in pools of one and three threads.
fn few_row_calls_same_bits(
    format: &'static str,
    shapes: &[(usize, usize)],
    modes: &[Mode],
    seed: u64,
) {
    let pools = [Pool::new(1).expect("kernel pool"), Pool::new(3).expect("kernel pool")];
    for (k, &(rows, cols)) in shapes.iter().enumerate() {
        let mut rng = Rng::new(seed + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, modes[k % modes.len()]);
        let m = w.matrix();
        let t_max = 33;
        let x = values(
            &mut rng,
            if k.is_multiple_of(2) { Mode::Mixed } else { Mode::Normal },
            t_max * cols,
        );
        let mut want = vec![0.0f32; t_max * rows];
        matmul_scalar(&m, &x, t_max, &mut want);
        let want = bits(&want);
        let mut buf = vec![0.0f32; t_max * cols + 4];
        for t in 2..=t_max {
            let off = t % 5;
            buf[off..off + t * cols].copy_from_slice(&x[..t * cols]);
            let xs = &buf[off..off + t * cols];
            for isa in tiers() {
                for (pool, threads) in pools.iter().zip([1, 3]) {
                    let mut got = vec![f32::NAN; t * rows];
                    pool.install(|| matmul_with(isa, &m, xs, t, &mut got));
                    assert_eq!(
                        bits(&got),
                        want[..t * rows],
                        "{isa} {format} {rows}x{cols} t={t} threads={threads}, activations {off} floats in"
                    );
                }
            }
        }
    }
}

/// `matmul_with` on every tier equals `matmul_scalar` bit for bit.
fn check(
    format: &'static str,
    rows: usize,
    cols: usize,
    t: usize,
    seed: u64,
    wm: Mode,
    xm: Mode,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let w = Weights::gen(format, rows, cols, &mut rng, wm);
    let m = w.matrix();
    let x = values(&mut rng, xm, t * cols);
    let mut want = vec![0.0f32; t * rows];
    matmul_scalar(&m, &x, t, &mut want);
    for isa in tiers() {
        let mut got = vec![f32::from_bits(0x7FA5_5A5A); t * rows];
        matmul_with(isa, &m, &x, t, &mut got);
        if let Some(i) = bits(&got).iter().zip(bits(&want)).position(|(g, w)| *g != w) {
            return Err(TestCaseError::fail(format!(
                "{isa} {format} {rows}x{cols} t={t}: cell (t={}, r={}) got {:#010x} want {:#010x}",
                i / rows,
                i % rows,
                got[i].to_bits(),
                want[i].to_bits()
            )));
        }
    }
    Ok(())
}

/// Dense widths: below one 16-column step, a step plus one, a chunk minus one, past a chunk,
/// exactly two of the wide nest's chunks, and several chunks and a partial step.
const DENSE_COLS: [usize; 8] = [1, 3, 17, 255, 513, 1023, 2048, 4097];
/// MXFP4 widths: one block, a chunk plus a block, past a 1024-column span.
const MXFP4_COLS: [usize; 3] = [32, 544, 1056];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn many_rows_f32_bf16_int8_bit_exact(
        format in prop::sample::select(vec!["f32", "bf16", "int8"]),
        cols in prop::sample::select(DENSE_COLS.to_vec()),
        rows in 1usize..=19, t in 9usize..=75, seed in any::<u64>(), wm in mode(), xm in mode(),
    ) {
        check(format, rows, cols, t, seed, wm, xm)?;
    }

    #[test]
    fn many_rows_mxfp4_bit_exact(
        cols in prop::sample::select(MXFP4_COLS.to_vec()),
        rows in 1usize..=19, t in 9usize..=75, seed in any::<u64>(), wm in mode(), xm in mode(),
    ) {
        check("mxfp4", rows, cols, t, seed, wm, xm)?;
    }
}

/// Prefill tiles folded 16 columns of one weight row per FMA and streamed their weights from
/// L2 (about half the FMA peak at T = 256 on one thread); the outer-product nest (AVX-512)
/// holds lane `l` of 16 rows per register against one broadcast activation, over activations
/// packed once per call. Every format equals the scalar reference bit for bit at its edges:
/// 1 to 4 vectors of rows and a partial one, token groups of 6 and a partial one, blocks of
/// 128 tokens and an uneven split, columns with a partial 16-column step and past a
/// 1,024-column chunk, rows wide enough that a pack holds fewer than 128 tokens, and pools
/// that split a call by activation rows (chunks that start inside a pack).
#[test]
fn prefill_tiles_streamed_their_weights_from_l2_now_a_lanes_weights_stay_in_l1_same_bits() {
    let cases = [
        ("f32", 17, 1041, 33),
        ("bf16", 70, 300, 129),
        ("int8", 130, 2100, 40),
        ("mxfp4", 48, 1056, 200),
        ("fp8", 33, 1152, 47),
        ("int4", 64, 1024, 257),
        ("bf16", 5, 40_000, 100),
    ];
    let pools = [Pool::new(1).expect("pool"), Pool::new(3).expect("pool")];
    for (k, &(format, rows, cols, t)) in cases.iter().enumerate() {
        let mut rng = Rng::new(0x0E7E_0000 + u64::try_from(k).expect("small"));
        let w = Weights::gen(format, rows, cols, &mut rng, Mode::Mixed);
        let m = w.matrix();
        let x = values(&mut rng, Mode::Mixed, t * cols);
        for (pool, threads) in pools.iter().zip([1, 3]) {
            pool.install(|| {
                common::assert_tiers_equal_scalar_nan_as_one(
                    &m,
                    &x,
                    t,
                    &format!("{format} {rows}x{cols} t={t} threads={threads}"),
                );
            });
        }
    }
}

/// Two threads calling prefill-sized `matmul`s on one pool at once: the pool lends its one
/// pack buffer to one call at a time (each calling thread kept a buffer of its own before,
/// charged per kernel thread), so the other call runs unpacked, in the other nests; every
/// result is the scalar reference's, bit for bit, whichever call held the buffer.
#[test]
fn each_thread_kept_its_own_pack_buffer_now_the_pool_lends_one_to_a_call_at_a_time_same_bits() {
    let pool = Pool::new(2).expect("kernel pool");
    sluice_kernels::reserve_scratch(&pool).expect("nothing else runs on the pool");
    let calls = [("bf16", 70, 1100, 64), ("int8", 130, 2100, 264), ("f32", 64, 1024, 300)];
    let cases: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(k, &(format, rows, cols, t))| {
            let mut rng = Rng::new(0x9A0C_0000 + u64::try_from(k).expect("small"));
            let w = Weights::gen(format, rows, cols, &mut rng, Mode::Mixed);
            let x = values(&mut rng, Mode::Mixed, t * cols);
            let mut want = vec![0.0f32; t * rows];
            matmul_scalar(&w.matrix(), &x, t, &mut want);
            (format, w, x, t, rows, want)
        })
        .collect();
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for caller in 0..2 {
            let (cases, pool, start) = (&cases, &pool, &start);
            s.spawn(move || {
                start.wait();
                for round in 0..4 {
                    for (format, w, x, t, rows, want) in cases {
                        let mut got = vec![f32::NAN; t * rows];
                        pool.install(|| matmul(&w.matrix(), x, *t, &mut got));
                        assert_eq!(
                            common::bits_nan_as_one(&got),
                            common::bits_nan_as_one(want),
                            "caller {caller} round {round}: {format} {rows} rows t={t}"
                        );
                    }
                }
            });
        }
    });
}
