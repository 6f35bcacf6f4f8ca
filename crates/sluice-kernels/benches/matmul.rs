//! Matmul throughput in GB/s of weight bytes (scales included), for the shapes that dominate
//! decode: a bf16 attention projection (4096 × 7168) and an MXFP4 expert matrix
//! (3072 × 3584), at 1 activation row (decode) and 8 (verification of a speculative draft).
//!
//! Runs on the tier `SLUICE_ISA` / detection picks and the global rayon pool (all cores; set
//! `RAYON_NUM_THREADS` to change it): `cargo bench -p sluice-kernels --bench matmul`.

use criterion::{Criterion, Throughput};
use sluice_kernels::{isa, matmul, Matrix};
use std::hint::black_box;
use std::time::Duration;

/// Deterministic pseudo-random bytes (xorshift64).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s.to_le_bytes()[0]
        })
        .collect()
}

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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("matmul/{}", isa()));
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);

    let (rows, cols) = (4096, 7168);
    let data = bf16_weights(rows * cols);
    let m = Matrix::bf16(rows, cols, &data).expect("bf16 shape");
    for t in [1, 8] {
        let x = activations(t * cols);
        let mut out = vec![0.0f32; t * rows];
        g.throughput(Throughput::Bytes(u64::try_from(m.byte_len()).expect("fits u64")));
        g.bench_function(format!("bf16_{rows}x{cols}_t{t}"), |b| {
            b.iter(|| matmul(black_box(&m), black_box(&x), t, &mut out));
        });
    }

    let (rows, cols) = (3072, 3584);
    let packed = bytes(rows * cols / 2, 3);
    // Scales 2^-8 .. 2^-1: finite, typical of trained experts.
    let scales: Vec<u8> = bytes(rows * cols / 32, 5).into_iter().map(|s| 119 + s % 8).collect();
    let m = Matrix::mxfp4(rows, cols, &packed, &scales).expect("mxfp4 shape");
    for t in [1, 8] {
        let x = activations(t * cols);
        let mut out = vec![0.0f32; t * rows];
        g.throughput(Throughput::Bytes(u64::try_from(m.byte_len()).expect("fits u64")));
        g.bench_function(format!("mxfp4_{rows}x{cols}_t{t}"), |b| {
            b.iter(|| matmul(black_box(&m), black_box(&x), t, &mut out));
        });
    }
    g.finish();
}

// Written out instead of `criterion_group!`/`criterion_main!`, whose generated `pub fn` has no
// doc comment for the workspace's `missing_docs` lint.
fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
