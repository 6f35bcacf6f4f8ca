//! One MoE layer's routed experts in a prefill, as a layer batch runs them (`many.rs`): every
//! expert's gate and up projections in one pool call, every down projection in another, each
//! expert on its own few rows. Prints wall-clock GFLOP/s and the ratio to the FMA peak of all
//! the pool's threads (each thread's loop side by side, summed), measured in the same run:
//! `cargo run --release -p sluice-kernels --example layer_batch -- THREADS [EXPERTS ROWS INTER HIDDEN REPS FORMAT]`
//! (defaults: Qwen3-30B-A3B's layer at a 256-token prefill, 128 bf16 experts of 768 × 2048 with
//! 16 rows each, 5 reps). The weights are 1.2 GB in bf16, read from memory once per layer, as a
//! layer of a model in memory is. FORMAT (`bf16`, `mxfp4`, `fp8`, `int4`, `int8`, `f32`) stores
//! the same shapes in that format, with random bytes and scales of the magnitudes
//! `sluice_kernels::probe` uses.

use std::time::{Duration, Instant};

mod stored;
use stored::{arg, matrix, stored, Error};

use sluice_kernels::probe::{fma_peak, random_bytes};
use sluice_kernels::{isa, matmul_many, matmul_pair_many, Job, Matrix, PairJob, Pool};

fn main() -> Result<(), Error> {
    let threads = arg(1, 2)?;
    let experts = arg(2, 128)?;
    let rows = arg(3, 16)?;
    let inter = arg(4, 768)?;
    let hidden = arg(5, 2048)?;
    let reps = arg(6, 5)?;
    let isa = isa();
    let pool = Pool::new(threads)?;
    // The FMA loop on every pool thread side by side, each timed on the wall clock, summed
    // (`sluice_kernels::probe::fma_peak`): the threads of a virtual machine may share cores,
    // so one thread's rate times the threads overstates them.
    let peak = fma_peak(&pool, Duration::from_millis(300))?;
    let format = std::env::args().nth(7).unwrap_or_else(|| "bf16".to_owned());
    // Three matrices an expert (gate, up: inter × hidden; down: hidden × inter), distinct
    // bytes for every expert so that each is read from memory.
    let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
    let stores: Vec<[(Vec<u8>, Vec<u8>); 3]> = (0..experts)
        .map(|e| {
            let mut k = 0;
            shapes.map(|(r, c)| {
                k += 1;
                stored(&format, r, c, 3 * e as u64 + k)
            })
        })
        .collect();
    let mats: Vec<[Matrix<'_>; 3]> = stores
        .iter()
        .map(|s| {
            let mut it = s.iter().zip(shapes);
            let mut next = || {
                let ((d, sc), (r, c)) = it.next().expect("three matrices");
                matrix(&format, r, c, d, sc)
            };
            Ok([next()?, next()?, next()?])
        })
        .collect::<Result<_, Error>>()?;
    let per: usize = stores[0].iter().map(|(d, s)| d.len() + s.len()).sum::<usize>() / 3;
    let x: Vec<f32> = random_bytes(experts * rows * hidden, 11)
        .into_iter()
        .map(|b| f32::from(b) / 128.0 - 1.0)
        .collect();
    let mut g = vec![0.0f32; experts * rows * inter];
    let mut u = vec![0.0f32; experts * rows * inter];
    let mut y = vec![0.0f32; experts * rows * hidden];
    let work = 2.0 * 3.0 * (experts * rows * inter * hidden) as f64;
    println!(
        "{isa}, {threads} threads: FMA peak {peak:.1} GFLOP/s; {experts} experts of {inter} x {hidden} {format}, {rows} rows each"
    );
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        pool.install(|| {
            let mut jobs: Vec<PairJob<'_>> = mats
                .iter()
                .zip(x.chunks_exact(rows * hidden))
                .zip(g.chunks_exact_mut(rows * inter).zip(u.chunks_exact_mut(rows * inter)))
                .map(|((m, x), (out_a, out_b))| PairJob {
                    a: m[0],
                    b: m[1],
                    x,
                    t: rows,
                    out_a,
                    out_b,
                })
                .collect();
            matmul_pair_many(&mut jobs, &|a, b| {
                for (a, b) in a.iter_mut().zip(b.iter()) {
                    *a *= *b;
                }
            });
            let mut jobs: Vec<Job<'_>> = mats
                .iter()
                .zip(g.chunks_exact(rows * inter))
                .zip(y.chunks_exact_mut(rows * hidden))
                .map(|((m, x), out)| Job { m: m[2], x, t: rows, out })
                .collect();
            matmul_many(&mut jobs);
        });
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let rate = work / med / 1e9;
    println!(
        "layer {:.2} ms (median of {reps}; min {:.2}): {rate:.1} GFLOP/s, {:.1}% of peak, {:.1} GB/s of weights",
        med * 1e3,
        times[0] * 1e3,
        100.0 * rate / peak,
        (3 * per * experts) as f64 / med / 1e9
    );
    Ok(())
}
