//! The FMA throughput a core reaches on each tier: a loop of independent fused multiply-adds
//! on registers, no memory traffic, the bound the several-row kernels are compared with
//! (`sluice probe --kernels`).
//!
//! Each loop keeps [`CHAINS`] independent accumulators, more than any current core needs to
//! cover its FMA latency with all its FMA units busy (latency 4 × 2 units on most x86 cores).

use crate::isa::Isa;

/// Independent accumulators per loop.
pub(crate) const CHAINS: usize = 12;

/// Runs `iters` rounds of [`CHAINS`] vector FMAs on `isa` ([`fma_loop_flops`] operations)
/// and returns a value derived from every accumulator, which the caller passes to `black_box`
/// so the loop cannot be removed.
///
/// # Panics
/// If the running CPU does not support `isa`.
pub(crate) fn fma_loop(isa: Isa, iters: u64) -> f32 {
    assert!(isa.is_available(), "fma_loop: the {isa} tier is not supported by this CPU");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX-512F (asserted above).
        Isa::Avx512 => unsafe { x86::avx512(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX2 and FMA (asserted above).
        Isa::Avx2 => unsafe { x86::avx2(iters) },
        // The portable kernels fold 16-lane arrays with `mul_add`; so does this loop (NEON
        // included: the compiler vectorises it, as it does the portable fold).
        _ => portable(iters),
    }
}

/// Floating-point operations in [`fma_loop`]`(isa, iters)`: two per lane per FMA.
pub(crate) fn fma_loop_flops(isa: Isa, iters: u64) -> f64 {
    let lanes = if isa == Isa::Avx2 { 8.0 } else { 16.0 };
    2.0 * lanes * CHAINS as f64 * iters as f64
}

/// 16-lane accumulators by `mul_add`, as the portable kernels compute.
fn portable(iters: u64) -> f32 {
    let mut acc = [[1.0f32; 16]; CHAINS];
    let (m, b) = (std::hint::black_box(0.999_999f32), std::hint::black_box(1e-7f32));
    for _ in 0..iters {
        for a in &mut acc {
            for l in a.iter_mut() {
                *l = l.mul_add(m, b);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use core::arch::x86_64::*;

    /// [`CHAINS`] zmm accumulators.
    #[target_feature(enable = "avx512f")]
    pub(super) fn avx512(iters: u64) -> f32 {
        let m = _mm512_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm512_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for a in &mut acc {
                *a = _mm512_fmadd_ps(*a, m, b);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }

    /// [`CHAINS`] ymm accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2(iters: u64) -> f32 {
        let m = _mm256_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm256_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for a in &mut acc {
                *a = _mm256_fmadd_ps(*a, m, b);
            }
        }
        let mut out = [0.0f32; 8];
        let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
        // SAFETY: `out` holds 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
        out.iter().sum()
    }
}
