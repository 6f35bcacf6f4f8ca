//! One MoE layer's routed experts in a prefill, as a layer batch runs them (`many.rs`): every
//! expert's gate and up projections in one pool call, every down projection in another, each
//! expert on its own few rows. Prints wall-clock GFLOP/s and the ratio to the FMA peak of all
//! the pool's threads, measured in the same run:
//! `cargo run --release -p sluice-kernels --example layer_batch -- THREADS [EXPERTS ROWS INTER HIDDEN REPS]`
//! (defaults: Qwen3-30B-A3B's layer at a 256-token prefill, 128 bf16 experts of 768 × 2048 with
//! 16 rows each, 5 reps). The weights are 1.2 GB, read from memory once per layer, as a layer
//! of a model in memory is.

use std::time::Instant;

use sluice_kernels::probe::{fma_loop, random_bytes};
use sluice_kernels::{isa, matmul_many, matmul_pair_many, Job, Matrix, PairJob, Pool};

fn arg(i: usize, default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    std::env::args().nth(i).map_or(Ok(default), |a| Ok(a.parse()?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = arg(1, 2)?;
    let experts = arg(2, 128)?;
    let rows = arg(3, 16)?;
    let inter = arg(4, 768)?;
    let hidden = arg(5, 2048)?;
    let reps = arg(6, 5)?;
    let isa = isa();
    let pool = Pool::new(threads)?;
    // One thread's FMA loop, timed on the wall clock, times the threads.
    let t0 = Instant::now();
    let mut flops = 0.0;
    while t0.elapsed().as_secs_f64() < 0.3 {
        flops += fma_loop(isa, 1 << 22);
    }
    let peak = flops / t0.elapsed().as_secs_f64() / 1e9 * threads as f64;
    // Three matrices an expert (gate, up: inter × hidden; down: hidden × inter), bf16 with
    // bounded exponents, distinct bytes for every expert so that each is read from memory.
    let per = inter * hidden * 2;
    let mut w = random_bytes(3 * per * experts, 3);
    for hi in w.iter_mut().skip(1).step_by(2) {
        *hi = (*hi & 0x83) | 0x3C;
    }
    let mats: Vec<[Matrix<'_>; 3]> = w
        .chunks_exact(3 * per)
        .map(|e| {
            Ok([
                Matrix::bf16(inter, hidden, &e[..per])?,
                Matrix::bf16(inter, hidden, &e[per..2 * per])?,
                Matrix::bf16(hidden, inter, &e[2 * per..])?,
            ])
        })
        .collect::<Result<_, sluice_kernels::KernelError>>()?;
    let x: Vec<f32> = random_bytes(experts * rows * hidden, 11)
        .into_iter()
        .map(|b| f32::from(b) / 128.0 - 1.0)
        .collect();
    let mut g = vec![0.0f32; experts * rows * inter];
    let mut u = vec![0.0f32; experts * rows * inter];
    let mut y = vec![0.0f32; experts * rows * hidden];
    let work = 2.0 * 3.0 * (experts * rows * inter * hidden) as f64;
    println!(
        "{isa}, {threads} threads: FMA peak {peak:.1} GFLOP/s; {experts} experts of {inter} x {hidden} bf16, {rows} rows each"
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
