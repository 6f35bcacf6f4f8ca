//! Measuring what the kernels achieve on this machine, in one run: streaming memory read
//! bandwidth, the cores' FMA throughput, each weight format's matmul throughput at one and
//! eight activation rows (decode, verification) and at 64 and 256 (prefill chunks), and the
//! fixed costs of one `matmul` call (alone, and split over the pool).
//!
//! Everything runs in one [`Pool`] of the requested size, on matrices far larger than the
//! caches (weights come from memory, as they do in a pass), so the kernel rates can be read
//! directly against the memory rate: a format at half the memory rate is compute-bound. The
//! call overhead matters because a pass makes thousands of small calls (norm-sized
//! projections, routers, per-expert matrices); `sluice probe --kernels` reports it so a
//! pass's time can be accounted for.
//!
//! Rates are in GB/s (10^9 bytes per second) of weight bytes read, scales included: the
//! figure to compare with storage and memory bandwidth; and in GFLOP/s (two per weight per
//! activation row), the figure to compare with the FMA peak, which bounds the many-row calls.
//! Each figure is the median of as many timed repetitions as fit the time budget. The machine's
//! own bounds (memory read, FMA peak) and that timing rule are in `peaks`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::isa::isa;
use crate::matmul::{matmul, Matrix, WeightFormat};
use crate::pool::{Pool, PoolBusy, PoolError};

mod peaks;
pub use peaks::{fma_loop, fma_peak};
use peaks::{median, memory_read, timed};

/// Shape of the bf16 and int8 matrices measured (a large Kimi K3 spine projection,
/// `[out, in]`: 117 MB in bf16).
pub const DENSE_SHAPE: (usize, usize) = (8192, 7168);
/// Shape of the f32 matrix measured: half the rows of [`DENSE_SHAPE`], so the same 117 MB.
pub const F32_SHAPE: (usize, usize) = (4096, 7168);
/// Shape of one MXFP4 expert matrix measured (a Kimi K3 routed expert's gate or up).
pub const EXPERT_SHAPE: (usize, usize) = (3072, 3584);
/// MXFP4 experts cycled through, so that each call reads its weights from memory.
pub const EXPERTS: usize = 16;
/// Shape of one GPT-OSS-120B expert's `gate_up_proj` (`[2 · 2880, 2880]`), the MXFP4 layout
/// GPT-OSS publishes (the same kernel as K3's, at GPT-OSS's dimensions).
pub const GPT_OSS_EXPERT_SHAPE: (usize, usize) = (5760, 2880);
/// Shape of one DeepSeek-V3 routed expert's gate or up projection (`[2048, 7168]`), measured
/// in FP8 with 128 × 128 block scales.
pub const DEEPSEEK_EXPERT_SHAPE: (usize, usize) = (2048, 7168);
/// Shape of one Kimi K2 routed expert's gate or up projection (`[2048, 7168]`), measured in
/// INT4 pack-quantized form (group 32).
pub const KIMI_K2_EXPERT_SHAPE: (usize, usize) = (2048, 7168);
/// Activation rows measured: plain decode and an 8-row verification pass.
pub const TOKEN_COUNTS: [usize; 2] = [1, 8];
/// Activation rows of the prefill-sized calls measured, which are compute-bound.
pub const BATCH_COUNTS: [usize; 2] = [64, 256];
/// Shape of the bf16, int8 and f32 matrices measured at [`BATCH_COUNTS`] rows (the first
/// rows of the dense buffer: a call is 7.5 GFLOP at 256 rows, so a few fit any budget; they
/// are compute-bound, so where the weights come from does not matter).
pub const BATCH_SHAPE: (usize, usize) = (2048, 7168);

/// Everything [`measure`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelProbe {
    /// The SIMD tier the kernels ran on (`avx512`, `avx2`, `neon`, `scalar`).
    pub isa: String,
    /// Threads in the pool every measurement ran in.
    pub threads: usize,
    /// Streaming read bandwidth of a buffer far larger than the caches, GB/s.
    pub memory_read_gbps: f64,
    /// What the pool's threads together reach in a loop of independent FMAs on registers on
    /// this tier, GFLOP/s (two per lane per FMA): the compute bound of the many-row calls.
    #[serde(default)]
    pub fma_peak_gflops: f64,
    /// One entry per (format, activation rows).
    pub kernels: Vec<KernelRate>,
    /// What one call costs to bring every pool thread onto it and back, nanoseconds:
    /// [`Dispatch::join_ns`].
    pub dispatch_overhead_ns: f64,
    /// The call-overhead measurements in detail.
    pub dispatch: Dispatch,
}

/// The fixed costs of a `matmul` call, measured from the thread that owns the pool (as the
/// engine calls it), medians over batches of calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    /// One pool call of one chunk per thread in which every chunk waits until all have
    /// started (for at most 200 µs): the time for a call to reach every thread and return,
    /// ns (the bare dispatch cost; 0 with one thread).
    pub join_ns: f64,
    /// Of those calls, the fraction in which some thread had not joined within 200 µs (it
    /// was parked, or the machine was busy).
    pub join_timeouts: f64,
    /// One call on a tiny matrix (16 × 64 bf16, one activation row), which runs on the
    /// calling thread alone: the cost every call pays, ns.
    pub serial_call_ns: f64,
    /// Shape of the matrix the split is measured on (bf16, one activation row): just above
    /// the size at which a call is split over the pool, and cache-resident.
    pub split_shape: [usize; 2],
    /// One call on `split_shape`, split over the pool, ns.
    pub split_call_ns: f64,
    /// The same call's work on one thread, ns.
    pub one_thread_ns: f64,
    /// `split_call_ns − one_thread_ns / threads`: what the split adds beyond a perfect
    /// division of the work, ns (0 with one thread).
    pub overhead_ns: f64,
}

/// The measured throughput of one format at one activation-row count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRate {
    /// Weight format name ([`WeightFormat::name`]: `bf16`, `int8`, `mxfp4`, `fp8`, ...).
    pub format: String,
    /// Which matrices were measured: `dense` (a large spine projection) or a model's routed
    /// experts (`k3`, `gpt-oss`, `deepseek-v3`, `kimi-k2`), cycled so each call reads memory.
    #[serde(default)]
    pub layout: String,
    /// Activation rows per call (T).
    pub rows: usize,
    /// Weight matrix shape `[out, in]`.
    pub shape: [usize; 2],
    /// Weight bytes (scales included) read per call.
    pub bytes_per_call: u64,
    /// Median rate, GB/s of weight bytes.
    pub gbps: f64,
    /// `gbps` over the memory read bandwidth measured in the same run.
    pub ratio_to_memory: f64,
    /// Median rate in GFLOP/s: `2 · out · in · rows` per call.
    #[serde(default)]
    pub gflops: f64,
    /// `gflops` over the FMA peak measured in the same run.
    #[serde(default)]
    pub ratio_to_fma_peak: f64,
    /// Timed calls the median was taken over.
    pub samples: usize,
}

impl KernelProbe {
    /// The rate measured for `format` at `rows` activation rows, if any.
    pub fn rate(&self, format: WeightFormat, rows: usize) -> Option<f64> {
        self.kernels.iter().find(|k| k.format == format.name() && k.rows == rows).map(|k| k.gbps)
    }
}

/// Why a probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The thread pool of the requested size could not be started.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The probe's own pool was taken by another call (it never is: the pool is the probe's).
    #[error(transparent)]
    Busy(#[from] PoolBusy),
}

/// Measures memory read bandwidth, every format's matmul rate at [`TOKEN_COUNTS`] activation
/// rows, and the per-call overheads, in a pool of `threads` threads (the calling thread
/// included), spending about `budget_secs` seconds (at least three timed repetitions of each
/// measurement run whatever the budget). Allocates about 140 MB of weights for the duration
/// of the call.
pub fn measure(threads: usize, budget_secs: f64) -> Result<KernelProbe, ProbeError> {
    let pool = Pool::new(threads)?;
    let data = Weights::new();
    // Memory, the FMA peak, seven (format, layout) lines at four row counts, and the call
    // overheads share the budget.
    let slots = 3 + 7 * (TOKEN_COUNTS.len() + BATCH_COUNTS.len());
    let per = Duration::from_secs_f64((budget_secs.max(0.0) / slots as f64).min(3600.0));
    pool.install(|| {
        let memory_read_gbps = memory_read(&pool, &data.bytes, per);
        let fma_peak_gflops = fma_peak(&pool, per)?;
        let mut kernels = Vec::new();
        for t in TOKEN_COUNTS.into_iter().chain(BATCH_COUNTS) {
            for f in [WeightFormat::Int8Row, WeightFormat::Bf16, WeightFormat::F32] {
                kernels.push(data.dense_rate(f, t, per));
            }
            kernels.push(data.mxfp4_rate(EXPERT_SHAPE, "k3", t, per));
            kernels.push(data.mxfp4_rate(GPT_OSS_EXPERT_SHAPE, "gpt-oss", t, per));
            kernels.push(data.fp8_rate(t, per));
            kernels.push(data.int4_rate(t, per));
        }
        for k in &mut kernels {
            k.ratio_to_memory = k.gbps / memory_read_gbps;
            k.ratio_to_fma_peak = k.gflops / fma_peak_gflops;
        }
        let dispatch = dispatch(&pool, per);
        Ok(KernelProbe {
            isa: isa().name().to_owned(),
            threads,
            memory_read_gbps,
            fma_peak_gflops,
            kernels,
            dispatch_overhead_ns: dispatch.join_ns,
            dispatch,
        })
    })
}

/// One buffer of random bytes serves every format (bf16 with a finite, moderate exponent;
/// int8, MXFP4 and INT4 nibbles and FP8 codes take the same bytes as they are), plus
/// per-format scales.
struct Weights {
    bytes: Vec<u8>,
    int8_scales: Vec<u8>,
    mxfp4_scales: Vec<u8>,
    fp8_scales: Vec<u8>,
    int4_scales: Vec<u8>,
}

/// Experts of `bytes_per_expert` that fit the shared buffer of `len` bytes, at most
/// [`EXPERTS`].
fn experts_in(len: usize, bytes_per_expert: usize) -> usize {
    (len / bytes_per_expert.max(1)).clamp(1, EXPERTS)
}

impl Weights {
    fn new() -> Self {
        let (rows, cols) = DENSE_SHAPE;
        let mut bytes = random_bytes(2 * rows * cols, 7);
        // bf16 high bytes: keep sign and two exponent bits, so |w| lies in about [2^-7, 2).
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
        // f16 0x2000 = 2^-7 for every int8 row; E8M0 scales 2^-8 .. 2^-1.
        let int8_scales = [0x00, 0x20].repeat(rows);
        // One E8M0 scale per 16 packed bytes of the buffer: enough for the experts of any
        // shape that fit it.
        let mxfp4_scales =
            random_bytes(bytes.len() / 16, 5).into_iter().map(|s| 119 + s % 8).collect();
        // f32 block scales 2^-12 .. 2^-9 with random significands (DeepSeek's are ~1e-4..1e-3).
        let (fr, fc) = DEEPSEEK_EXPERT_SHAPE;
        let fp8_scales = random_bytes(EXPERTS * fr.div_ceil(128) * fc.div_ceil(128) * 4, 3)
            .chunks_exact(4)
            .flat_map(|b| {
                let m = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x007F_FFFF;
                f32::from_bits(m | (115 + u32::from(b[3] % 4)) << 23).to_le_bytes()
            })
            .collect();
        // bf16 group scales 2^-9 .. 2^-6 with random significands.
        // Two bytes per 16 packed bytes of the buffer, as for MXFP4.
        let int4_scales = random_bytes(bytes.len() / 8, 9)
            .chunks_exact(2)
            .flat_map(|b| (u16::from(b[0] & 0x7F) | u16::from(118 + b[1] % 4) << 7).to_le_bytes())
            .collect();
        Self { bytes, int8_scales, mxfp4_scales, fp8_scales, int4_scales }
    }

    fn dense_rate(&self, format: WeightFormat, t: usize, budget: Duration) -> KernelRate {
        let (rows, cols) = if t > TOKEN_COUNTS[1] { BATCH_SHAPE } else { DENSE_SHAPE };
        let (f32_rows, f32_cols) = if t > TOKEN_COUNTS[1] { BATCH_SHAPE } else { F32_SHAPE };
        let m = match format {
            WeightFormat::Int8Row => Matrix::int8_row(
                rows,
                cols,
                &self.bytes[..rows * cols],
                &self.int8_scales[..2 * rows],
            ),
            // The bf16 bytes read as f32 have a bf16 value's high byte on top: finite, with
            // |w| in about [2^-7, 2).
            WeightFormat::F32 => {
                Matrix::f32(f32_rows, f32_cols, &self.bytes[..4 * f32_rows * f32_cols])
            }
            _ => Matrix::bf16(rows, cols, &self.bytes[..2 * rows * cols]),
        }
        .expect("invariant: buffers are sized from DENSE_SHAPE");
        rate(format, "dense", t, &[m], budget)
    }

    /// MXFP4 experts of `shape` (K3's or GPT-OSS's).
    fn mxfp4_rate(
        &self,
        (rows, cols): (usize, usize),
        layout: &str,
        t: usize,
        budget: Duration,
    ) -> KernelRate {
        let (p, s) = (rows * cols / 2, rows * cols / 32);
        let experts: Vec<Matrix<'_>> = (0..experts_in(self.bytes.len(), p))
            .map(|e| {
                let packed = &self.bytes[e * p..(e + 1) * p];
                Matrix::mxfp4(rows, cols, packed, &self.mxfp4_scales[e * s..(e + 1) * s])
                    .expect("invariant: buffers are sized from the expert shapes")
            })
            .collect();
        rate(WeightFormat::Mxfp4, layout, t, &experts, budget)
    }

    /// DeepSeek-V3 experts in FP8 with block scales.
    fn fp8_rate(&self, t: usize, budget: Duration) -> KernelRate {
        let (rows, cols) = DEEPSEEK_EXPERT_SHAPE;
        let (p, s) = (rows * cols, rows.div_ceil(128) * cols.div_ceil(128) * 4);
        let experts: Vec<Matrix<'_>> = (0..experts_in(self.bytes.len(), p))
            .map(|e| {
                let codes = &self.bytes[e * p..(e + 1) * p];
                Matrix::fp8_block(rows, cols, codes, &self.fp8_scales[e * s..(e + 1) * s])
                    .expect("invariant: buffers are sized from DEEPSEEK_EXPERT_SHAPE")
            })
            .collect();
        rate(WeightFormat::Fp8Block, "deepseek-v3", t, &experts, budget)
    }

    /// Kimi K2 experts in INT4 pack-quantized form.
    fn int4_rate(&self, t: usize, budget: Duration) -> KernelRate {
        let (rows, cols) = KIMI_K2_EXPERT_SHAPE;
        let (p, s) = (rows * cols / 2, rows * cols / 32 * 2);
        let experts: Vec<Matrix<'_>> = (0..experts_in(self.bytes.len(), p))
            .map(|e| {
                let packed = &self.bytes[e * p..(e + 1) * p];
                Matrix::int4_group(rows, cols, packed, &self.int4_scales[e * s..(e + 1) * s])
                    .expect("invariant: buffers are sized from KIMI_K2_EXPERT_SHAPE")
            })
            .collect();
        rate(WeightFormat::Int4Group, "kimi-k2", t, &experts, budget)
    }
}

/// Times `matmul` over `ms` in turn (one matrix per call) until `budget` is spent.
fn rate(
    format: WeightFormat,
    layout: &str,
    t: usize,
    ms: &[Matrix<'_>],
    budget: Duration,
) -> KernelRate {
    let (rows, cols) = (ms[0].rows(), ms[0].cols());
    let x: Vec<f32> =
        random_bytes(t * cols, 11).into_iter().map(|b| f32::from(b) / 128.0 - 1.0).collect();
    let mut out = vec![0.0f32; t * rows];
    let bytes = ms[0].byte_len();
    // One untimed call per matrix would warm every cache with weights; one in total only
    // faults in the output and activation pages.
    matmul(&ms[0], &x, t, &mut out);
    let mut i = 1;
    let rates = timed(budget, || {
        let m = &ms[i % ms.len()];
        i += 1;
        let start = Instant::now();
        matmul(black_box(m), black_box(&x), t, &mut out);
        bytes as f64 / start.elapsed().as_secs_f64() / 1e9
    });
    let gbps = median(&rates);
    // Weights per byte (an MXFP4 weight is half a byte plus a 32nd of a scale byte).
    let weights_per_byte = (rows * cols) as f64 / bytes as f64;
    KernelRate {
        format: format.name().to_owned(),
        layout: layout.to_owned(),
        rows: t,
        shape: [rows, cols],
        bytes_per_call: u64::try_from(bytes).unwrap_or(u64::MAX),
        gbps,
        ratio_to_memory: f64::NAN,
        gflops: gbps * weights_per_byte * 2.0 * t as f64,
        ratio_to_fma_peak: f64::NAN,
        samples: rates.len(),
    }
}

/// A bf16 matrix of `rows × cols` with finite values.
fn bf16_matrix_bytes(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    random_bytes(2 * rows * cols, seed)
        .chunks_exact(2)
        .flat_map(|b| [b[0], (b[1] & 0x83) | 0x3C])
        .collect()
}

/// Median time of one call, ns, over batches of `batch` calls (so the clock's own cost is
/// negligible).
fn per_call(budget: Duration, batch: u32, mut call: impl FnMut()) -> f64 {
    call();
    median(&timed(budget, || {
        let start = Instant::now();
        for _ in 0..batch {
            call();
        }
        start.elapsed().as_secs_f64() * 1e9 / f64::from(batch)
    }))
}

/// The call overheads (see [`Dispatch`]), measured on `pool` from the calling thread.
fn dispatch(pool: &Pool, budget: Duration) -> Dispatch {
    let third = budget / 4;
    let (join_ns, join_timeouts) = join(pool, third);
    let (rows, cols) = (16, 64);
    let data = bf16_matrix_bytes(rows, cols, 13);
    let m = Matrix::bf16(rows, cols, &data).expect("invariant: sized from the shape");
    let x = vec![0.5f32; cols];
    let mut out = vec![0.0f32; rows];
    let serial_call_ns =
        per_call(third, 1000, || matmul(black_box(&m), black_box(&x), 1, &mut out));

    // 128 rows × 1024 columns: 131,072 multiply-adds, twice the split threshold; 256 KiB.
    let (rows, cols) = (128, 1024);
    let data = bf16_matrix_bytes(rows, cols, 17);
    let m = Matrix::bf16(rows, cols, &data).expect("invariant: sized from the shape");
    let x = vec![0.5f32; cols];
    let mut out = vec![0.0f32; rows];
    let split_call_ns = per_call(third, 50, || matmul(black_box(&m), black_box(&x), 1, &mut out));
    let one = Pool::new(1).expect("invariant: a one-thread pool starts no thread");
    let one_thread_ns =
        one.install(|| per_call(third, 50, || matmul(black_box(&m), black_box(&x), 1, &mut out)));
    let overhead_ns = if pool.threads() > 1 {
        split_call_ns - one_thread_ns / pool.threads() as f64
    } else {
        0.0
    };
    Dispatch {
        join_ns,
        join_timeouts,
        serial_call_ns,
        split_shape: [rows, cols],
        split_call_ns,
        one_thread_ns,
        overhead_ns,
    }
}

/// Median time of a call that every pool thread must join (see [`Dispatch::join_ns`]), ns,
/// and the fraction of calls in which some thread did not join in time.
fn join(pool: &Pool, budget: Duration) -> (f64, f64) {
    let n = pool.threads();
    if n <= 1 {
        return (0.0, 0.0);
    }
    let arrived = AtomicU64::new(0);
    let late = AtomicU64::new(0);
    let calls = AtomicU64::new(0);
    let ns = per_call(budget, 100, || {
        arrived.store(0, Ordering::SeqCst);
        calls.fetch_add(1, Ordering::Relaxed);
        pool.run(n, &|_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            while arrived.load(Ordering::SeqCst) < n as u64 {
                if start.elapsed() > Duration::from_micros(200) {
                    late.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                std::hint::spin_loop();
            }
        });
    });
    let (late, calls) = (late.load(Ordering::Relaxed), calls.load(Ordering::Relaxed).max(1));
    (ns, late.min(calls) as f64 / calls as f64)
}

/// Deterministic pseudo-random bytes (xorshift64, eight bytes per step): the weights and
/// activations of the probe, and of the `matmul` bench, which measures the same shapes.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_refused() {
        assert!(matches!(measure(0, 0.0), Err(ProbeError::Pool(PoolError::NoThreads))));
    }
}
