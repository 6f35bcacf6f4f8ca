//! The f64 sums of attention ([`sluice_kernels::latent`]) on one thread, every tier, against
//! the tier's f64 FMA peak (half its f32 FMA loop's rate: the same vectors hold half as many
//! values):
//! `cargo run --release -p sluice-kernels --example attention_sums -- [cold] [POSITIONS] [SETS...]`
//! (defaults 2,048 positions; 1, 2, 4, 8 sets of eight rows). `STRIDE=N` sets the floats
//! between two positions' values (default 512, a Qwen3-30B-A3B cache row).
//!
//! `cold` reads each call's keys and values from memory, as a decode step does (a step streams
//! the weights between two layers' attention): it walks [`COLD_CACHES`] separate caches of the
//! shape, one call each, and reports the best of 5 walks.
//!
//! The caches start on a cache line, as the engine's do. The shape is one KV head of Qwen3-30B-A3B's cache (head width 128 in rows of 512): the
//! scores of `SETS` heads of eight rows each over every position (`dot_sets_on`), and their
//! weighted sums (`weighted_rows_on`, rows of `POSITIONS - 7 ..= POSITIONS` weights, as a
//! causal block of eight rows has). Best of 20 calls each, GFLOP/s and the share of the peak.

use sluice_kernels::isa::Isa;
use sluice_kernels::latent::{dot_sets_on, weighted_rows_on, LANES};
use sluice_kernels::LineVec;
use std::time::Instant;

/// Separate caches a `cold` walk calls on in turn (256 MiB at 2,048 positions: more than a
/// last-level cache holds).
const COLD_CACHES: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    let cold = args.next_if(|a| a == "cold").is_some();
    let npos: usize = args.next().map_or(Ok(2048), |a| a.parse())?;
    let mut sets: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if sets.is_empty() {
        sets = vec![1, 2, 4, 8];
    }
    let npos = npos.max(LANES);
    let stride: usize = std::env::var("STRIDE").map_or(Ok(512), |s| s.parse())?;
    let hd = 128usize;
    let values = |n: usize, seed: usize| -> Vec<f32> {
        (0..n).map(|i| ((i * 7919 + seed) % 1000) as f32 / 1000.0 - 0.5).collect()
    };
    // Each cache from a cache line, as the engine's caches are (`LineVec`).
    let caches: Vec<LineVec> = (0..if cold { COLD_CACHES } else { 1 })
        .map(|c| LineVec::from(values(npos * stride, 1 + c)))
        .collect();
    println!("{npos} positions{}", if cold { ", cold" } else { "" });
    // The best of 20 calls on one cache, or (cold) the best of 5 walks over every cache, a
    // call's time being the walk's over the caches.
    let best = |f: &mut dyn FnMut(&[f32])| {
        (0..if cold { 5 } else { 20 })
            .map(|_| {
                let t = Instant::now();
                for m in &caches {
                    f(m);
                }
                t.elapsed().as_secs_f64() / caches.len() as f64
            })
            .fold(f64::MAX, f64::min)
    };
    for tier in Isa::available() {
        // The scalar tier's FMA loop is the C library's `fma`, no peak of the core.
        let start = Instant::now();
        let flops = sluice_kernels::probe::fma_loop(tier, 1 << 22);
        let peak = (tier != Isa::Scalar).then(|| flops / start.elapsed().as_secs_f64() / 2e9);
        match peak {
            Some(p) => println!("{tier}: f64 FMA peak {p:.1} GFLOP/s"),
            None => println!("{tier}:"),
        }
        let share = |g: f64| peak.map_or(String::new(), |p| format!(" ({:3.0}%)", g / p * 100.0));
        for &s in &sets {
            let q: Vec<[f32; LANES]> = values(hd * s * LANES, 2)
                .chunks_exact(LANES)
                .map(|c| std::array::from_fn(|l| c[l]))
                .collect();
            let mut dots = vec![[0.0f64; LANES]; s * npos];
            let dot = best(&mut |m| dot_sets_on(tier, &q, s, m, stride, npos, &mut dots));
            let probs: Vec<Vec<f32>> =
                (0..s * LANES).map(|r| values(npos - LANES + 1 + r % LANES, r)).collect();
            let p: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
            let mut out = vec![0.0f32; p.len() * hd];
            let sum = best(&mut |m| weighted_rows_on(tier, &p, m, stride, hd, &mut out));
            let gflops = |secs: f64| 2.0 * (npos * hd * LANES * s) as f64 / secs / 1e9;
            println!(
                "  {s} sets: scores {:6.1} GFLOP/s{}, weighted sums {:6.1} GFLOP/s{}",
                gflops(dot),
                share(gflops(dot)),
                gflops(sum),
                share(gflops(sum)),
            );
        }
    }
    Ok(())
}
