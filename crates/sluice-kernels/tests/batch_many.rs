//! A layer's batched experts (`matmul_many` and its kin) whose jobs of at least 33 activation
//! rows take the outer nest: packed side by side in the pool's pack buffer, in turns where
//! they overflow it, or unpacked where the buffer is lent, each batched stage equals one call
//! per job bit for bit, in every format and in pools of 1 to 16 threads.
//!
//! Tiers as in `tests/matmul.rs`: every tier the CPU supports, or the one `SLUICE_ISA` forces.

// Not every helper of the shared test module is used here.
#[allow(dead_code)]
mod common;

use common::{bits, pair_and_plain_stages_equal_one_call_per_job, values, Mode, Rng, Weights};
use sluice_kernels::{
    matmul, matmul_many, matmul_then, matmul_then_many, Job, Pool, Target, ThenJob,
};

/// Pool sizes.
const THREADS: [usize; 4] = [1, 2, 3, 16];

/// Job rows around the outer nest's threshold (33), mixed with small ones: 0 to 32 rows run
/// unpacked, 33 and more packed, 300 in two blocks of 150.
const OUTER_TS: [usize; 9] = [33, 5, 40, 0, 70, 16, 300, 1, 32];

/// A layer's prefill experts of 33 rows or more, which one call per expert packs for the outer
/// nest, ran the older nests in a batched call; packed there too now, mixed with small jobs,
/// each batched stage still equals one call per job bit for bit, in every format and on pools
/// of 1 to 16 threads (16: fewer jobs than threads, so each packed job is cut on its own, its
/// token chunks on whole groups of 6; 20 rows: a job is split by activation rows).
#[test]
fn batched_prefill_experts_ran_the_older_nests_now_packed_for_the_outer_nest_same_bits() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    let shapes = [
        ("f32", 70, 1041),
        ("bf16", 70, 1100),
        ("int8", 20, 2100),
        ("mxfp4", 70, 1056),
        ("fp8", 70, 1152),
        ("int4", 20, 1024),
    ];
    for (k, &(format, rows, cols)) in shapes.iter().enumerate() {
        let mut rng = Rng::new(0x0B47_0000 + u64::try_from(k).expect("small"));
        let ws: Vec<(Weights, Weights)> = OUTER_TS
            .iter()
            .map(|_| {
                let mut w = || {
                    Weights::gen(format, rows, cols, &mut Rng::new(rng.next_u64()), Mode::Normal)
                };
                (w(), w())
            })
            .collect();
        for (pool, threads) in pools.iter().zip(THREADS) {
            let what = format!("{format} {rows}x{cols} rows {OUTER_TS:?} threads={threads}");
            batched_stages_equal_one_call_per_job(pool, &ws, &OUTER_TS, &mut rng, &what);
        }
    }
}

/// Jobs whose packs overflow the pool's 8 MiB pack buffer (4,096 to 9,024 columns, in three
/// formats, blocks of 150 to 264 rows) are packed and run in turns of what the buffer holds,
/// small jobs among them; each batched stage still equals one call per job bit for bit.
#[test]
fn batched_prefill_experts_past_the_pack_buffer_run_in_turns_same_bits() {
    let pools: Vec<Pool> = THREADS.iter().map(|&n| Pool::new(n).expect("kernel pool")).collect();
    let jobs = [
        (300, 4096),
        (5, 4096),
        (264, 7168),
        (40, 9024),
        (33, 320),
        (100, 4096),
        (2, 7168),
        (300, 9024),
    ];
    let formats = ["bf16", "mxfp4", "int8"];
    let mut rng = Rng::new(0x7042_0000);
    let ws: Vec<(Weights, Weights)> = jobs
        .iter()
        .enumerate()
        .map(|(j, &(_, cols))| {
            let mut w = || {
                Weights::gen(formats[j % 3], 32, cols, &mut Rng::new(rng.next_u64()), Mode::Normal)
            };
            (w(), w())
        })
        .collect();
    let ts: Vec<usize> = jobs.iter().map(|&(t, _)| t).collect();
    for (pool, threads) in pools.iter().zip(THREADS) {
        let what = format!("jobs {jobs:?} threads={threads}");
        batched_stages_equal_one_call_per_job(pool, &ws, &ts, &mut rng, &what);
    }
}

/// Every batched stage on `pool` ([`matmul_pair_many`], [`matmul_many`], [`matmul_then_many`]
/// into pairs and into running sums) equals one call per job ([`matmul_pair`], [`matmul`],
/// [`matmul_then`]) bit for bit, for job `j` on the matrices `ws[j]` (of an even number of
/// rows) and `ts[j]` activation rows.
fn batched_stages_equal_one_call_per_job(
    pool: &Pool,
    ws: &[(Weights, Weights)],
    ts: &[usize],
    rng: &mut Rng,
    what: &str,
) {
    let xs: Vec<Vec<f32>> =
        ws.iter().zip(ts).map(|((a, _), &t)| values(rng, Mode::Normal, t * a.cols)).collect();
    let z = |n: usize| vec![f32::NAN; n];
    let act = |ca: &mut [f32], cb: &mut [f32]| {
        for (va, vb) in ca.iter_mut().zip(cb.iter_mut()) {
            *va = *va * 0.5 + *vb;
        }
    };
    let cells = |j: usize| ts[j] * ws[j].0.rows;
    pair_and_plain_stages_equal_one_call_per_job(pool, ws, &xs, ts, &act, |w| &w.1, what);
    // Each job's cells scaled by a factor of its own in place, then finished into pairs of half
    // the width, or added into running sums (every other row, from row `j % 2`).
    let then = |j: usize, _: usize, _: std::ops::Range<usize>, y: &mut [f32], o: &mut [f32]| {
        let k = 1.0 + 0.25 * f32::from(u8::try_from(j % 8).expect("small"));
        y.iter_mut().for_each(|v| *v *= k);
        if o.len() == y.len() {
            o.iter_mut().zip(y.iter()).for_each(|(o, &v)| *o += v.min(2.0));
        } else {
            for (o, p) in o.iter_mut().zip(y.chunks_exact(2)) {
                *o = p[0].min(2.0) * (p[1] + 1.0);
            }
        }
    };
    let tos: Vec<Vec<usize>> =
        ts.iter().enumerate().map(|(j, &t)| (0..t).map(|i| 2 * i + j % 2).collect()).collect();
    for pairs in [true, false] {
        // Job `j`'s target: its pairs, or its running sums.
        fn target<'a>(pairs: bool, o: &'a mut [f32], to: &'a [usize]) -> Target<'a> {
            if pairs {
                Target::rows(o, 2)
            } else {
                Target::scatter(o, to)
            }
        }
        let mut want: Vec<(Vec<f32>, Vec<f32>)> = (0..ts.len())
            .map(|j| {
                let rows = ws[j].0.rows;
                let out = if pairs {
                    z(cells(j) / 2)
                } else {
                    values(&mut Rng::new(7), Mode::Normal, (2 * ts[j] + 2) * rows)
                };
                (z(cells(j)), out)
            })
            .collect();
        let mut got = want.clone();
        pool.install(|| {
            for (j, (y, o)) in want.iter_mut().enumerate() {
                let f = |ti: usize, r, cy: &mut [f32], co: &mut [f32]| then(j, ti, r, cy, co);
                matmul_then(&ws[j].0.matrix(), &xs[j], ts[j], y, target(pairs, o, &tos[j]), &f);
            }
            let mut jobs: Vec<ThenJob<'_>> = got
                .iter_mut()
                .enumerate()
                .map(|(j, (y, o))| ThenJob {
                    m: ws[j].0.matrix(),
                    x: &xs[j],
                    t: ts[j],
                    y,
                    target: Some(target(pairs, o, &tos[j])),
                })
                .collect();
            matmul_then_many(&mut jobs, &then);
        });
        for (j, (w, g)) in want.iter().zip(&got).enumerate() {
            let stage = if pairs { "then into pairs" } else { "then into sums" };
            assert_eq!(bits(&g.0), bits(&w.0), "{what}: job {j} ({} rows), {stage}: cells", ts[j]);
            assert_eq!(
                bits(&g.1),
                bits(&w.1),
                "{what}: job {j} ({} rows), {stage}: finished",
                ts[j]
            );
        }
    }
}

/// Two threads on one pool at once, one making batched calls of prefill experts, the other
/// prefill-sized [`matmul`]s: the pool lends its one pack buffer to one call at a time, so
/// a batched call that finds it lent runs every job unpacked; every result is one call per
/// job's, bit for bit, whichever call held the buffer.
#[test]
fn a_batched_call_that_finds_the_pack_buffer_lent_runs_unpacked_same_bits() {
    let pool = Pool::new(2).expect("kernel pool");
    sluice_kernels::reserve_scratch(&pool).expect("nothing else runs on the pool");
    let mut rng = Rng::new(0x1E47_0000);
    let (rows, cols) = (70, 1100);
    let ws: Vec<Weights> = OUTER_TS
        .iter()
        .map(|_| Weights::gen("bf16", rows, cols, &mut Rng::new(rng.next_u64()), Mode::Normal))
        .collect();
    let xs: Vec<Vec<f32>> =
        OUTER_TS.iter().map(|&t| values(&mut rng, Mode::Normal, t * cols)).collect();
    let big = Weights::gen("int8", 130, 2100, &mut rng, Mode::Normal);
    let big_x = values(&mut rng, Mode::Normal, 264 * 2100);
    let mut want: Vec<Vec<f32>> = OUTER_TS.iter().map(|&t| vec![0.0; t * rows]).collect();
    let mut big_want = vec![0.0f32; 264 * 130];
    pool.install(|| {
        for ((w, x), (&t, o)) in ws.iter().zip(&xs).zip(OUTER_TS.iter().zip(&mut want)) {
            matmul(&w.matrix(), x, t, o);
        }
        matmul(&big.matrix(), &big_x, 264, &mut big_want);
    });
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let (pool, start, ws, xs, want) = (&pool, &start, &ws, &xs, &want);
        s.spawn(move || {
            start.wait();
            for round in 0..6 {
                let mut got: Vec<Vec<f32>> =
                    OUTER_TS.iter().map(|&t| vec![f32::NAN; t * rows]).collect();
                pool.install(|| {
                    let mut jobs: Vec<Job<'_>> = ws
                        .iter()
                        .zip(xs)
                        .zip(OUTER_TS.iter().zip(&mut got))
                        .map(|((w, x), (&t, out))| Job { m: w.matrix(), x, t, out })
                        .collect();
                    matmul_many(&mut jobs);
                });
                for (j, (g, w)) in got.iter().zip(want).enumerate() {
                    assert_eq!(bits(g), bits(w), "round {round}: job {j}");
                }
            }
        });
        let (big, big_x, big_want) = (&big, &big_x, &big_want);
        s.spawn(move || {
            start.wait();
            for round in 0..6 {
                let mut got = vec![f32::NAN; 264 * 130];
                pool.install(|| matmul(&big.matrix(), big_x, 264, &mut got));
                assert_eq!(bits(&got), bits(big_want), "round {round}: the prefill matmul");
            }
        });
    });
}
