//! Many-row matmul rates against the FMA peak on one thread, timed in on-CPU time (Linux
//! `/proc/thread-self/schedstat`), so that a shared, oversubscribed machine still gives
//! comparable figures: `cargo run --release -p sluice-kernels --example batch_cpu -- [REPS]
//! [T,T,...] [FORMAT,FORMAT,...]` (defaults: 5 reps, T = 1, 8, 64, 256, every format: `int8`,
//! `bf16`, `f32`, `mxfp4`, `mxfp4-gptoss`, `fp8`, `int4`; tier from `SLUICE_ISA` or
//! detection). Prints one line per format and row count: GFLOP/s
//! per on-CPU second, the ratio to the FMA loop's, and GB/s of weight bytes (at T=1 the
//! decode rate of a matrix that fits the last-level cache: what the kernel can consume, the
//! figure to hold against storage bandwidth).

use sluice_kernels::probe::{
    fma_loop, random_bytes, BATCH_SHAPE, DEEPSEEK_EXPERT_SHAPE, EXPERT_SHAPE, GPT_OSS_EXPERT_SHAPE,
    KIMI_K2_EXPERT_SHAPE,
};
use sluice_kernels::{isa, matmul, Matrix, Pool};

/// Nanoseconds this thread has spent on a CPU.
fn on_cpu_ns() -> Result<u64, Box<dyn std::error::Error>> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    Ok(s.split_whitespace().next().ok_or("empty schedstat")?.parse()?)
}

/// Median of on-CPU GFLOP/s over `reps` runs of `f`, which returns its flops.
fn rate(reps: usize, mut f: impl FnMut() -> f64) -> Result<f64, Box<dyn std::error::Error>> {
    let mut v = Vec::new();
    for _ in 0..reps {
        // Calls until 50 ms on a CPU have passed (the counter moves at scheduler events).
        let t0 = on_cpu_ns()?;
        let mut flops = 0.0;
        let mut dt = 0;
        while dt < 50_000_000 {
            flops += f();
            dt = on_cpu_ns()? - t0;
        }
        v.push(flops / dt as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps = std::env::args().nth(1).map_or(Ok(5), |a| a.parse())?;
    let ts: Vec<usize> = match std::env::args().nth(2) {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 8, 64, 256],
    };
    let formats = std::env::args().nth(3);
    let wanted = |name: &str| formats.as_ref().is_none_or(|f| f.split(',').any(|f| f == name));
    let isa = isa();
    let peak = rate(reps, || fma_loop(isa, 1 << 22))?;
    println!("{isa}: FMA peak {peak:.1} GFLOP/s per on-CPU second");
    let (rows, cols) = BATCH_SHAPE;
    let (er, ec) = EXPERT_SHAPE;
    let mut bytes = random_bytes(4 * rows * cols, 7);
    for hi in bytes.iter_mut().skip(1).step_by(2) {
        *hi = (*hi & 0x83) | 0x3C;
    }
    // FP8 codes as checkpoints publish them: no NaN code (0x7F, 0xFF; a span that holds one
    // decodes with a NaN mask, which costs the FP8 kernels a fifth of their rate).
    for lo in bytes.iter_mut().step_by(2) {
        if *lo & 0x7F == 0x7F {
            *lo -= 1;
        }
    }
    let int8_scales = [0x00, 0x20].repeat(rows);
    let (gr, gc) = GPT_OSS_EXPERT_SHAPE;
    let mx_scales: Vec<u8> =
        random_bytes((er * ec).max(gr * gc) / 32, 5).into_iter().map(|s| 119 + s % 8).collect();
    // FP8 block scales around 2^-10; INT4 bf16 group scales 2^-7.
    let (fr, fc) = DEEPSEEK_EXPERT_SHAPE;
    let fp8_scales: Vec<u8> =
        (0..fr.div_ceil(128) * fc.div_ceil(128)).flat_map(|_| 0.001f32.to_le_bytes()).collect();
    let (ir, ic) = KIMI_K2_EXPERT_SHAPE;
    let int4_scales = [0x00, 0x3C].repeat(ir * ic / 32);
    let ms = [
        ("int8", Matrix::int8_row(rows, cols, &bytes[..rows * cols], &int8_scales)?),
        ("bf16", Matrix::bf16(rows, cols, &bytes[..2 * rows * cols])?),
        ("f32", Matrix::f32(rows, cols, &bytes[..4 * rows * cols])?),
        ("mxfp4", Matrix::mxfp4(er, ec, &bytes[..er * ec / 2], &mx_scales[..er * ec / 32])?),
        ("mxfp4-gptoss", Matrix::mxfp4(gr, gc, &bytes[..gr * gc / 2], &mx_scales[..gr * gc / 32])?),
        ("fp8", Matrix::fp8_block(fr, fc, &bytes[..fr * fc], &fp8_scales)?),
        ("int4", Matrix::int4_group(ir, ic, &bytes[..ir * ic / 2], &int4_scales)?),
    ];
    let pool = Pool::new(1)?;
    for &t in &ts {
        for (name, m) in ms.iter().filter(|(name, _)| wanted(name)) {
            let x: Vec<f32> = random_bytes(t * m.cols(), 11)
                .into_iter()
                .map(|b| f32::from(b) / 128.0 - 1.0)
                .collect();
            let mut out = vec![0.0f32; t * m.rows()];
            let flops = 2.0 * (m.rows() * m.cols() * t) as f64;
            let r = pool.install(|| {
                rate(reps, || {
                    matmul(m, &x, t, &mut out);
                    flops
                })
            })?;
            // Weight bytes per flop, for the one-row figure in GB/s (of weights, scales included).
            let gbps = r * m.byte_len() as f64 / flops;
            println!(
                "{name:<12} T={t:<4} {r:7.1} GFLOP/s  {:5.1}% of peak  {gbps:6.2} GB/s of weights",
                100.0 * r / peak
            );
        }
    }
    Ok(())
}
