//! f32 weights: little-endian IEEE f32, `[rows, cols]`, folded as they are.
//!
//! SIMD tiers: AVX2 and AVX-512 copy eight or sixteen lanes at a time and fold one activation
//! row straight from the weight bytes; NEON takes the scalar decode (f32 matrices are small
//! in every model: norms, routers, some MLA pieces).

use super::{check_len, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;

/// The f32 format.
pub(crate) struct F32;

impl<'a> Matrix<'a> {
    /// An f32 matrix over `data` (`rows * cols * 4` bytes).
    pub fn f32(rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        check_len("weights", rows, cols, WeightFormat::F32, rows * cols * 4, data.len())?;
        Ok(Self { rows, cols, format: WeightFormat::F32, data, scales: &[] })
    }
}

/// The scalar decode of `out.len()` little-endian f32 values in `w` (`4 * out.len()` bytes):
/// the reference, and the tail every SIMD decode leaves.
fn f32s_scalar(w: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(w.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

impl Format for F32 {
    const TIER_WIDENS: bool = true;

    /// `4 * cols` bytes.
    type Row<'a> = &'a [u8];

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> &'a [u8] {
        &m.data[r * m.cols * 4..(r + 1) * m.cols * 4]
    }

    fn widen(w: &[u8], c0: usize, out: &mut [f32]) {
        f32s_scalar(&w[4 * c0..4 * (c0 + out.len())], out);
    }

    fn row_bytes(w: &[u8]) -> usize {
        w.len()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_decode(w: &[u8], c0: usize, out: &mut [f32]) {
        x86::f32s_avx2(&w[4 * c0..4 * (c0 + out.len())], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(w: &[u8], c0: usize, out: &mut [f32]) {
        x86::f32s_avx512(&w[4 * c0..4 * (c0 + out.len())], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [&[u8]; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        let ahead = R * Self::row_bytes(rows[0]);
        let w = rows.map(|w| &w[4 * c0..4 * (c0 + n)]);
        x86::f32_one_avx2(w, x, acc, ahead);
    }

    /// Measured against the buffered few-row nest and the panel on one thread (the Zen 5
    /// development VM, a 2048 × 7168 matrix, 58 MB, from memory, 2 interleaved rounds): 1.3–2×
    /// as fast at 2 to 8 rows, even at 12 and 16, 0.88–0.91× at 24 and 32 (session 26).
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = 12;

    /// The weights loaded as they are, no copy into a buffer first (AVX2).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [&[u8]; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        crate::arch::avx2::fold_stored_tile::<Self, R, N>(rows, c0, x, acc, ahead);
    }

    /// Measured against the panel on one thread (`layer_batch 1 64 T 768 2048 5 f32`, medians
    /// of 3 interleaved rounds): 1.25× as fast at 2, 4 and 16 rows, 1.15× at 8, 1.04× at 32,
    /// so the stored nest's whole range.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = crate::stored::STORED_ROWS;

    /// The weights loaded as they are, no copy into a panel first.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [&[u8]; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        crate::arch::avx512::fold_stored_tile::<Self, R, N>(rows, c0, x, acc, ahead);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_fold_one<const R: usize>(
        rows: [&[u8]; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        let ahead = R * Self::row_bytes(rows[0]);
        let w = rows.map(|w| &w[4 * c0..4 * (c0 + n)]);
        x86::f32_one_avx512(w, x, acc, ahead);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::arch::avx2::{load2, store2, Widen8};
    use crate::arch::avx512::{load1, store1, Widen16};
    use crate::arch::prefetch_line;
    use crate::tiled::Lanes;
    use core::arch::x86_64::*;

    /// f32 weights: a copy, eight lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn f32s_avx2(w: &[u8], out: &mut [f32]) {
        assert_eq!(w.len(), 4 * out.len());
        let full = out.len() - out.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: `i + 8 <= out.len()`, and `w` holds `4 * out.len()` bytes.
            unsafe {
                let v = _mm256_loadu_ps(w.as_ptr().add(4 * i).cast());
                _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
        super::f32s_scalar(&w[4 * full..], &mut out[full..]);
    }

    /// f32 weights: a copy, sixteen lanes at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) fn f32s_avx512(w: &[u8], out: &mut [f32]) {
        assert_eq!(w.len(), 4 * out.len());
        let full = out.len() - out.len() % 16;
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= out.len()`, and `w` holds `4 * out.len()` bytes.
            unsafe {
                let v = _mm512_loadu_ps(w.as_ptr().add(4 * i).cast());
                _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
        super::f32s_scalar(&w[4 * full..], &mut out[full..]);
    }

    /// f32 rows against one activation row (AVX2).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn f32_one_avx2<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|w| w.len() == 4 * x.len()) && x.len().is_multiple_of(16));
        let mut acc = load2(&lanes);
        for c in (0..x.len()).step_by(16) {
            if (4 * c).is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(4 * c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`.
            let (xl, xh) = unsafe {
                (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)))
            };
            for (wr, ar) in w.iter().zip(acc.iter_mut()) {
                // SAFETY: each row holds `4 * x.len()` bytes (asserted).
                let (wl, wh) = unsafe {
                    let p = wr.as_ptr().add(4 * c).cast::<f32>();
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
                ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
            }
        }
        store2(&acc, lanes);
    }

    /// The AVX2 stored tile's "widening": 8 f32 loaded as they are.
    impl Widen8 for super::F32 {
        const BYTES: usize = 4;

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn widen8(p: *const u8) -> __m256 {
            // SAFETY: `p` points at 32 readable bytes (the caller's contract).
            unsafe { _mm256_loadu_ps(p.cast()) }
        }
    }

    /// The stored tile's "widening": 16 f32 loaded as they are.
    impl Widen16 for super::F32 {
        const BYTES: usize = 4;

        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn widen16(p: *const u8) -> __m512 {
            // SAFETY: `p` points at 64 readable bytes (the caller's contract).
            unsafe { _mm512_loadu_ps(p.cast()) }
        }
    }

    /// f32 rows against one activation row (AVX-512).
    #[target_feature(enable = "avx512f")]
    pub(super) fn f32_one_avx512<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|w| w.len() == 4 * x.len()) && x.len().is_multiple_of(16));
        let mut a = load1(&lanes);
        for c in (0..x.len()).step_by(16) {
            if (4 * c).is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(4 * c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`, and each row holds `4 * x.len()` bytes (asserted).
            let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for (wr, ar) in w.iter().zip(a.iter_mut()) {
                // SAFETY: as above.
                let wv = unsafe { _mm512_loadu_ps(wr.as_ptr().add(4 * c).cast()) };
                *ar = _mm512_fmadd_ps(wv, xv, *ar);
            }
        }
        store1(&a, lanes);
    }
}
