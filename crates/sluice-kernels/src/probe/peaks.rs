//! The machine's own bounds, against which [`super::measure`] reads every kernel rate: the
//! streaming memory read bandwidth (several interleaved streams per thread) and the FMA peak of
//! the selected SIMD tier on every pool thread; and the timing rule every probe figure shares
//! (repetitions until the budget is spent, then the median).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::isa::isa;
use crate::pool::{Pool, PoolBusy};

/// Rounds of the FMA loop each thread times: 12 vector FMAs each, about 10 ms on any
/// current core, so that a helper that comes late to the call (woken from its park) still
/// runs beside the others for nearly all of it.
const FMA_ROUNDS: u64 = 1 << 22;

/// The FMA loop of the selected tier on every thread of `pool` at once, each thread timing its
/// own loop, repeated for at least `budget` (three times at least): the median of the sums of
/// the threads' rates, GFLOP/s. That sum is what a call whose threads claim chunks as they
/// free up can reach, whichever threads are slower.
///
/// **Why each thread times itself.** Timed as one pool call of a chunk per thread, the
/// call's wall time is its slowest thread's. The device host's 16 vCPUs are not 16 whole
/// cores: run side by side, 6–8 of them ran the loop at 79–105 GFLOP/s and the rest at
/// 136–163, so the one call read 1,303–1,422 GFLOP/s for all 16 against a sum of 1,885–2,287,
/// and the kernels' share of that "peak" read 83–106% (docs/PERFORMANCE.md, issue 20,
/// session 29).
///
/// # Errors
/// [`PoolBusy`] if `pool` is running another call.
pub fn fma_peak(pool: &Pool, budget: Duration) -> Result<f64, PoolBusy> {
    let n = pool.threads();
    let rates: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let isa = isa();
    let flops = crate::arch::peak::fma_loop_flops(isa, FMA_ROUNDS);
    let mut sums = Vec::new();
    let start = Instant::now();
    while sums.len() < 3 || start.elapsed() < budget {
        pool.on_every_thread(&|i| {
            let t0 = Instant::now();
            black_box(crate::arch::peak::fma_loop(isa, black_box(FMA_ROUNDS)));
            let rate = flops / t0.elapsed().as_secs_f64() / 1e9;
            rates[i % n].store(rate.to_bits(), Ordering::Relaxed);
        })?;
        sums.push(rates.iter().map(|r| f64::from_bits(r.load(Ordering::Relaxed))).sum());
    }
    Ok(median(&sums))
}

/// Runs `rounds` rounds of the FMA loop [`super::measure`] takes the peak from on the calling thread,
/// on tier `isa`; returns the floating-point operations done (for tools that time it
/// themselves, e.g. in on-CPU time on a shared machine).
///
/// # Panics
/// If the running CPU does not support `isa`.
pub fn fma_loop(isa: crate::Isa, rounds: u64) -> f64 {
    black_box(crate::arch::peak::fma_loop(isa, black_box(rounds)));
    crate::arch::peak::fma_loop_flops(isa, rounds)
}

/// Concurrent sequential streams per thread the memory read tries: one stream per core
/// leaves bandwidth unused on many machines (a core's line-fill buffers and prefetchers track
/// several streams, and the kernels read four to eight rows at once), so the probe reports the
/// best of these, a bound the kernels are fairly compared with.
const MEMORY_STREAMS: [usize; 3] = [1, 4, 8];

/// Streaming read of `buf` split across the pool's threads, each part read as 1, 4 or 8
/// interleaved sequential streams: the best median over repetitions, GB/s.
pub(super) fn memory_read(pool: &Pool, buf: &[u8], budget: Duration) -> f64 {
    let parts = pool.threads();
    let part = buf.len().div_ceil(parts).next_multiple_of(64);
    let sums: Vec<AtomicU64> = (0..parts).map(|_| AtomicU64::new(0)).collect();
    let per = budget / u32::try_from(MEMORY_STREAMS.len()).unwrap_or(1);
    MEMORY_STREAMS
        .iter()
        .map(|&streams| {
            let rates = timed(per, || {
                let start = Instant::now();
                pool.run(parts, &|i| {
                    let bytes = &buf[(i * part).min(buf.len())..((i + 1) * part).min(buf.len())];
                    sums[i].store(xor_streams(bytes, streams), Ordering::Relaxed);
                });
                black_box(&sums);
                buf.len() as f64 / start.elapsed().as_secs_f64() / 1e9
            });
            median(&rates)
        })
        .fold(0.0, f64::max)
}

/// [`xor_fold`] of `bytes` read as `streams` equal sequential parts advanced together, 256
/// bytes of each in turn.
fn xor_streams(bytes: &[u8], streams: usize) -> u64 {
    const STEP: usize = 256;
    let len = bytes.len() / (streams * STEP) * STEP;
    let parts: Vec<&[u8]> = (0..streams).map(|k| &bytes[k * len..(k + 1) * len]).collect();
    let mut acc = 0u64;
    for off in (0..len).step_by(STEP) {
        for p in &parts {
            acc ^= xor_fold(&p[off..off + STEP]);
        }
    }
    acc ^ xor_fold(&bytes[streams * len..])
}

/// XOR of every 8-byte word (four independent chains, so the loads, not the XORs, limit it;
/// the compiler turns it into 16-byte vector loads).
#[inline]
fn xor_fold(bytes: &[u8]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
            *a ^= u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |a, &b| a.rotate_left(8) ^ u64::from(b));
    acc.iter().fold(tail, |a, &b| a ^ b)
}

/// Runs `f` at least three times and until `budget` has passed; returns its results.
pub(super) fn timed(budget: Duration, mut f: impl FnMut() -> f64) -> Vec<f64> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < 3 || start.elapsed() < budget {
        out.push(f());
    }
    out
}

/// Median of a non-empty list (the mean of the middle two for an even count).
pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_fold() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let naive = bytes.chunks(8).fold(0u64, |a, c| {
            if c.len() == 8 {
                a ^ u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
            } else {
                a
            }
        });
        // 1000 = 31 · 32 + 8: the last 8 bytes are the tail, folded differently.
        let tail = bytes[992..].iter().fold(0u64, |a, &b| a.rotate_left(8) ^ u64::from(b));
        let head = bytes[..992].chunks(8).fold(0u64, |a, c| {
            a ^ u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
        });
        assert_eq!(xor_fold(&bytes), head ^ tail);
        assert_ne!(naive, 0);
    }

    #[test]
    fn streams_cover_every_byte() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| u8::try_from(i % 251).unwrap_or(0)).collect();
        // XOR is order-free, so every stream count folds the same words; the tail past the
        // whole 256-byte steps is folded by `xor_fold` itself in each case.
        for streams in MEMORY_STREAMS {
            let len = bytes.len() / (streams * 256) * 256;
            let want = xor_fold(&bytes[..streams * len]) ^ xor_fold(&bytes[streams * len..]);
            assert_eq!(xor_streams(&bytes, streams), want, "{streams} streams");
        }
    }
}
