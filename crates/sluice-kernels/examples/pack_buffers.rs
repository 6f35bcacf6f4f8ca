//! How a many-thread prefill call's speed depends on how many buffers its pool rotates the
//! packed activations through ([`Pool::set_pack_buffers`], 1 to 8; `sluice_kernels::pack_buffers`
//! picks one for every two threads): one pool, one matrix, the count switched between runs of
//! calls in one process, so that a host whose speed drifts by more than the effect still gives
//! a ratio per round (docs/PERFORMANCE.md, issue 20, session 41). Every run's output is checked
//! equal, bit for bit, to the first.
//! `cargo run --release -p sluice-kernels --example pack_buffers -- THREADS [ROWS COLS T ROUNDS
//! FORMAT CALLS]` (defaults: 16 threads, 2,048 × 7,168, T = 256, 4 rounds, `bf16`, 15 calls a
//! run; the formats of `stored`). Prints each run's median call and GFLOP/s, the FMA peak
//! measured after each round, and each count's speed ÷ one buffer's, a round at a time.

use std::time::{Duration, Instant};

use sluice_kernels::probe::{fma_peak, random_bytes};
use sluice_kernels::{matmul, Pool};

mod stored;
use stored::{arg, matrix, stored, Error};

fn main() -> Result<(), Error> {
    let threads = arg(1, 16)?.max(1);
    let rows = arg(2, 2048)?;
    let cols = arg(3, 7168)?;
    let t = arg(4, 256)?;
    let rounds = arg(5, 4)?.max(1);
    let format = std::env::args().nth(6).unwrap_or_else(|| "bf16".to_owned());
    let calls = arg(7, 15)?.max(1);
    let x: Vec<f32> =
        random_bytes(t * cols, 11).into_iter().map(|b| f32::from(b) / 128.0 - 1.0).collect();
    let data = stored(&format, rows, cols, 1);
    let m = matrix(&format, rows, cols, &data.0, &data.1)?;
    let pool = Pool::new(threads)?;
    println!("{threads} threads, {rows} x {cols} {format}, T = {t}, medians of {calls} calls");
    let counts = [1usize, 2, 4, 8];
    let mut out = vec![0.0f32; t * rows];
    let mut first: Option<Vec<f32>> = None;
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    for round in 0..rounds {
        let mut line = format!("round {round}:");
        for (i, &n) in counts.iter().enumerate() {
            pool.set_pack_buffers(n);
            let median = pool.install(|| {
                // Every buffer written once before the timed calls.
                for _ in 0..n + 2 {
                    matmul(&m, &x, t, &mut out);
                }
                let mut v: Vec<f64> = (0..calls)
                    .map(|_| {
                        let s = Instant::now();
                        matmul(&m, &x, t, &mut out);
                        s.elapsed().as_secs_f64() * 1e3
                    })
                    .collect();
                v.sort_by(f64::total_cmp);
                v[calls / 2]
            });
            match &first {
                None => first = Some(out.clone()),
                Some(f) if f.iter().zip(&out).any(|(a, b)| a.to_bits() != b.to_bits()) => {
                    return Err(format!("{n} pack buffers changed the output").into());
                }
                Some(_) => {}
            }
            ms[i].push(median);
            let gflops = 2.0 * (rows * cols * t) as f64 / median / 1e6;
            line += &format!("  {n}: {median:.3} ms ({gflops:.0} GFLOP/s)");
        }
        let peak = fma_peak(&pool, Duration::from_millis(200))?;
        println!("{line}  peak {peak:.0} GFLOP/s");
    }
    for (i, &n) in counts.iter().enumerate() {
        let ratios: Vec<String> =
            ms[i].iter().zip(&ms[0]).map(|(a, one)| format!("{:.3}", one / a)).collect();
        println!("{n} buffers, speed ÷ one buffer's by round: {}", ratios.join(" "));
    }
    Ok(())
}
