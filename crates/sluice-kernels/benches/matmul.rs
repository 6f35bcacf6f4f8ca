//! Matmul throughput in GB/s of weight bytes (scales included) on matrices far larger than the
//! caches, at 1 activation row (decode) and 8 (verification of a speculative draft):
//!
//! - bf16 and row-int8 `8192 × 7168` (a large Kimi K3 spine projection: 117 MB and 59 MB);
//! - MXFP4 `3072 × 3584` (a K3 routed expert's gate or up, 5.8 MB), cycling through 16 of them
//!   (94 MB) so that every call reads its expert from memory, as a pass does.
//!
//! Runs on the tier `SLUICE_ISA` / detection picks and the process-wide kernel pool (all
//! cores; set `SLUICE_THREADS` to change it): `cargo bench -p sluice-kernels --bench matmul`.
//! `sluice_kernels::probe::measure` (and `sluice probe --kernels`) measures the same shapes
//! next to memory bandwidth.
//!
//! The `dispatch` group times one split call from the benchmark's own thread, as the engine
//! makes them: eight chunks of a small matmul each (16 × 1024 bf16, about a microsecond), run
//! on the calling thread alone, on the kernel pool, and on rayon's global pool.

use criterion::{Criterion, Throughput};
use rayon::prelude::*;
use sluice_kernels::probe::{
    random_bytes as bytes, DENSE_SHAPE, EXPERTS, EXPERT_SHAPE, TOKEN_COUNTS,
};
use sluice_kernels::Pool;
use sluice_kernels::{isa, matmul, Matrix};
use std::hint::black_box;
use std::sync::Mutex;
use std::time::Duration;

/// bf16 weights with finite values of moderate magnitude: random mantissas and signs, exponent
/// byte forced into [0x3C, 0x3F] (|w| in about [2^-7, 2)).
fn bf16_weights(n: usize) -> Vec<u8> {
    let mut b = bytes(2 * n, 7);
    for hi in b.iter_mut().skip(1).step_by(2) {
        *hi = (*hi & 0x83) | 0x3C;
    }
    b
}

/// Activations in about [−1, 1).
fn activations(n: usize) -> Vec<f32> {
    bytes(n, 11).into_iter().map(|b| f32::from(b) / 128.0 - 1.0).collect()
}

/// Benchmarks `matmul` over `ms` in turn (one matrix per iteration) at each row count.
fn run(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    ms: &[Matrix<'_>],
) {
    let (rows, cols) = (ms[0].rows(), ms[0].cols());
    for t in TOKEN_COUNTS {
        let x = activations(t * cols);
        let mut out = vec![0.0f32; t * rows];
        g.throughput(Throughput::Bytes(u64::try_from(ms[0].byte_len()).expect("fits u64")));
        let mut i = 0;
        g.bench_function(format!("{name}_{rows}x{cols}_t{t}"), |b| {
            b.iter(|| {
                i += 1;
                matmul(black_box(&ms[i % ms.len()]), black_box(&x), t, &mut out);
            });
        });
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("matmul/{}", isa()));
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);

    let (rows, cols) = DENSE_SHAPE;
    let data = bf16_weights(rows * cols);
    run(&mut g, "bf16", &[Matrix::bf16(rows, cols, &data).expect("bf16 shape")]);

    // f16 0x2000 = 2^-7 for every row; the values are the first half of the bf16 bytes.
    let scales = [0x00, 0x20].repeat(rows);
    let m = Matrix::int8_row(rows, cols, &data[..rows * cols], &scales).expect("int8 shape");
    run(&mut g, "int8", &[m]);

    let (rows, cols) = EXPERT_SHAPE;
    let packed = bytes(EXPERTS * rows * cols / 2, 3);
    // Scales 2^-8 .. 2^-1: finite, typical of trained experts.
    let scales: Vec<u8> =
        bytes(EXPERTS * rows * cols / 32, 5).into_iter().map(|s| 119 + s % 8).collect();
    let (p, s) = (rows * cols / 2, rows * cols / 32);
    let experts: Vec<Matrix<'_>> = (0..EXPERTS)
        .map(|e| {
            Matrix::mxfp4(rows, cols, &packed[e * p..(e + 1) * p], &scales[e * s..(e + 1) * s])
                .expect("mxfp4 shape")
        })
        .collect();
    run(&mut g, "mxfp4", &experts);
    g.finish();
}

/// One split call of eight small matmuls: serially, on the kernel pool, on rayon's pool.
fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    let (rows, cols, chunks) = (16, 1024, 8);
    let data = bf16_weights(chunks * rows * cols);
    let ms: Vec<Matrix<'_>> = data
        .chunks_exact(2 * rows * cols)
        .map(|d| Matrix::bf16(rows, cols, d).expect("bf16 shape"))
        .collect();
    let x = activations(cols);
    let outs: Vec<Mutex<Vec<f32>>> = (0..chunks).map(|_| Mutex::new(vec![0.0; rows])).collect();
    let chunk = |i: usize| {
        let mut out = outs[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        matmul(black_box(&ms[i]), black_box(&x), 1, &mut out);
    };
    g.bench_function("serial_8x16x1024", |b| b.iter(|| (0..chunks).for_each(chunk)));
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let pool = Pool::new(threads).expect("kernel pool");
    g.bench_function("kernel_pool_8x16x1024", |b| b.iter(|| pool.run(chunks, &chunk)));
    g.bench_function("rayon_8x16x1024", |b| {
        b.iter(|| (0..chunks).into_par_iter().for_each(chunk));
    });
    g.finish();
}

// Written out instead of `criterion_group!`/`criterion_main!`, whose generated `pub fn` has no
// doc comment for the workspace's `missing_docs` lint.
fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    dispatch(&mut c);
    c.final_summary();
}
