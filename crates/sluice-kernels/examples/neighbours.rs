//! Why a prefill-sized call on many threads can run below one thread's share of the FMA peak:
//! the same kind of call (`T` activation rows on a `ROWS × COLS` matrix) timed on the wall
//! clock under four conditions, each read against the FMA rate of a thread under the same
//! load, so that a lower clock under an all-core load is not counted against the kernels:
//!
//! - **alone**: one thread, every other core idle;
//! - **beside FMA**: one thread while every other pool thread runs the FMA loop (the clock of
//!   an all-core vector load, but no memory or cache traffic from the neighbours);
//! - **independent**: `THREADS` one-thread calls at once, each on its own matrix and
//!   activations (every core busy with the nest, nothing shared, no cuts);
//! - **pool**: one call of `THREADS` threads on one matrix, cut as the engine cuts it;
//!   then the FMA peak `sluice probe` reads against (`probe::fma_peak`) on the same pool.
//!
//! alone ≈ beside FMA ≈ independent > pool points at the cutting and the shared pack;
//! independent < beside FMA at what the cores share (L3, memory); beside FMA < alone at
//! what the neighbours' vector load takes from one core that the FMA loop alone does not show.
//! `cargo run --release -p sluice-kernels --example neighbours -- THREADS [ROWS COLS T REPS FORMAT]`
//! (defaults: 2,048 × 7,168, T = 256, 5 reps, `bf16`; `mxfp4` too).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use sluice_kernels::probe::{fma_loop, fma_peak, random_bytes};
use sluice_kernels::{isa, matmul, Isa, Matrix, Pool};

mod stored;
use stored::{arg, matrix, stored, Error};

/// The FMA loop on the calling thread for about `secs`: GFLOP/s.
fn fma_rate(isa: Isa, secs: f64) -> f64 {
    let t0 = Instant::now();
    let mut flops = 0.0;
    while t0.elapsed().as_secs_f64() < secs {
        flops += fma_loop(isa, 1 << 20);
    }
    flops / t0.elapsed().as_secs_f64() / 1e9
}

/// `reps` calls of `m` on `x` on the calling thread's current pool: the median GFLOP/s.
fn call_rate(m: &Matrix<'_>, x: &[f32], t: usize, reps: usize) -> f64 {
    let mut out = vec![0.0f32; t * m.rows()];
    matmul(m, x, t, &mut out);
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            matmul(m, x, t, &mut out);
            s.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * (m.rows() * m.cols() * t) as f64 / times[reps / 2] / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let threads = arg(1, 2)?.max(1);
    let rows = arg(2, 2048)?;
    let cols = arg(3, 7168)?;
    let t = arg(4, 256)?;
    let reps = arg(5, 5)?.max(1);
    let format = std::env::args().nth(6).unwrap_or_else(|| "bf16".to_owned());
    let isa = isa();
    let x: Vec<f32> =
        random_bytes(t * cols, 11).into_iter().map(|b| f32::from(b) / 128.0 - 1.0).collect();
    let one = Pool::new(1)?;
    println!("{isa}, {threads} threads, {rows} x {cols} {format}, T = {t}, medians of {reps}");

    // Alone.
    let fma1 = fma_rate(isa, 0.3);
    let data = stored(&format, rows, cols, 1);
    let m = matrix(&format, rows, cols, &data.0, &data.1)?;
    let alone = one.install(|| call_rate(&m, &x, t, reps));
    println!("alone         {alone:7.1} GFLOP/s, FMA {fma1:6.1}: {:5.1}%", 100.0 * alone / fma1);

    // Every thread on the FMA loop, then one thread's call beside the others' FMA loops.
    let barrier = Barrier::new(threads);
    let mut each_fma: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    fma_rate(isa, 0.5)
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    each_fma.sort_by(f64::total_cmp);
    let sum_fma: f64 = each_fma.iter().sum();
    // A thread's share of what all of them reach side by side.
    let all_fma = sum_fma / threads as f64;
    let list: Vec<String> = each_fma.iter().map(|r| format!("{r:.0}")).collect();
    println!("FMA side by side: {sum_fma:.0} GFLOP/s in all; a thread: {}", list.join(" "));
    let stop = AtomicBool::new(false);
    let beside = std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    fma_loop(isa, 1 << 20);
                }
            });
        }
        // Let the neighbours reach their clock before timing.
        fma_rate(isa, 0.1);
        let r = one.install(|| call_rate(&m, &x, t, reps));
        stop.store(true, Ordering::Relaxed);
        r
    });
    println!(
        "beside FMA    {beside:7.1} GFLOP/s, FMA {all_fma:6.1}: {:5.1}%  (a thread's FMA under the all-core load: {:.1}% of alone)",
        100.0 * beside / all_fma,
        100.0 * all_fma / fma1
    );

    // Independent calls, one per thread, each on its own matrix and activations.
    let datas: Vec<_> = (0..threads).map(|i| stored(&format, rows, cols, 100 + i as u64)).collect();
    let xs: Vec<Vec<f32>> = (0..threads)
        .map(|i| {
            random_bytes(t * cols, 200 + i as u64)
                .into_iter()
                .map(|b| f32::from(b) / 128.0 - 1.0)
                .collect()
        })
        .collect();
    let barrier = Barrier::new(threads);
    let rates: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = datas
            .iter()
            .zip(&xs)
            .map(|(d, x)| {
                let barrier = &barrier;
                let format = &format;
                s.spawn(move || -> Result<f64, Error> {
                    let m = matrix(format, rows, cols, &d.0, &d.1)?;
                    let pool = Pool::new(1)?;
                    barrier.wait();
                    Ok(pool.install(|| call_rate(&m, x, t, reps)))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| Error::from("a thread panicked"))?)
            .collect::<Result<_, _>>()
    })?;
    let each = median(rates.clone());
    let sum: f64 = rates.iter().sum();
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let list: Vec<String> = sorted.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "independent   {each:7.1} GFLOP/s a thread, {sum:.0} in all, FMA {sum_fma:6.1}: {:5.1}%  ({})",
        100.0 * sum / sum_fma,
        list.join(" ")
    );

    // One pool call.
    let pool = Pool::new(threads)?;
    let whole = pool.install(|| call_rate(&m, &x, t, reps.max(3)));
    println!(
        "pool          {whole:7.1} GFLOP/s, FMA {:6.1}: {:5.1}%  ({:.1} a thread)",
        sum_fma,
        100.0 * whole / sum_fma,
        whole / threads as f64
    );
    // The peak `sluice probe --kernels` reads its ratios against, on the same pool.
    let peak = fma_peak(&pool, std::time::Duration::from_millis(300))?;
    println!(
        "probe's peak  {peak:7.1} GFLOP/s ({:.1}% of the side-by-side sum above)",
        100.0 * peak / sum_fma
    );
    Ok(())
}
