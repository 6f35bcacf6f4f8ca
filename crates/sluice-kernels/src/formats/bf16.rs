//! bf16 weights: little-endian bf16, `[rows, cols]`, widened exactly to f32 (the pattern in the
//! high half of an f32).
//!
//! SIMD tiers: AVX2 widens with `vpmovzxwd` + shift for the several-row decode, and for one
//! activation row loads 16 bytes broadcast to both lanes and widens with one in-lane byte
//! shuffle per eight values (cheaper than the cross-lane `vpmovzx` family); AVX-512 widens by
//! zero-extension and a 16-bit shift; NEON by a widening shift left of 16.

use super::{check_len, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;
use sluice_core::bf16_to_f32;

/// The bf16 format.
pub(crate) struct Bf16;

impl<'a> Matrix<'a> {
    /// A bf16 matrix over `data` (`rows * cols * 2` bytes).
    pub fn bf16(rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        check_len("weights", rows, cols, WeightFormat::Bf16, rows * cols * 2, data.len())?;
        Ok(Self { rows, cols, format: WeightFormat::Bf16, data, scales: &[] })
    }
}

/// The scalar decode of `out.len()` little-endian bf16 patterns in `w` (`2 * out.len()` bytes):
/// the reference, and the tail every SIMD decode leaves.
fn bf16s_scalar(w: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(w.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

impl Format for Bf16 {
    const TIER_WIDENS: bool = true;

    /// `2 * cols` bytes.
    type Row<'a> = &'a [u8];

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> &'a [u8] {
        &m.data[r * m.cols * 2..(r + 1) * m.cols * 2]
    }

    fn widen(w: &[u8], c0: usize, out: &mut [f32]) {
        bf16s_scalar(&w[2 * c0..2 * (c0 + out.len())], out);
    }

    const ONE_ROW_TILE: usize = 1;

    fn row_bytes(w: &[u8]) -> usize {
        w.len()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_decode(w: &[u8], c0: usize, out: &mut [f32]) {
        x86::bf16s_avx2(&w[2 * c0..2 * (c0 + out.len())], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(w: &[u8], c0: usize, out: &mut [f32]) {
        x86::bf16s_avx512(&w[2 * c0..2 * (c0 + out.len())], out);
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn neon_decode(w: &[u8], c0: usize, out: &mut [f32]) {
        neon::bf16s(&w[2 * c0..2 * (c0 + out.len())], out);
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
        x86::bf16_one_avx2(rows.map(|w| &w[2 * c0..2 * (c0 + n)]), x, acc, ahead);
    }

    /// Rows one after another in one loop (as `avx512_fold_rows` below).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_fold_rows<const TB: usize>(rows: &[&[u8]], x: &[f32], acc: &mut [[Lanes; TB]]) {
        let n = x.len();
        for (w, a) in rows.iter().zip(acc) {
            x86::bf16_one_avx2([&w[..2 * n]], x, [&mut a[0]], Self::row_bytes(w));
        }
    }

    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = crate::stored::STORED_ROWS;

    /// The patterns widened in registers as the tile reads them (AVX2).
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

    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = crate::stored::STORED_ROWS;

    /// The patterns widened in registers as the tile reads them (zero-extension and a
    /// 16-bit shift, exact).
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
        x86::bf16_one_avx512(rows.map(|w| &w[2 * c0..2 * (c0 + n)]), x, acc, ahead);
    }

    /// Rows one after another in one loop: a row's 16 lanes are a single chain of FMAs, so a
    /// row runs at the FMA latency unless the core starts the next row's loads and FMAs
    /// before the last of this row's finish, which it does only where little code lies between
    /// the two loops (the row loop through the generic nest, a call per row, halved the rate
    /// of L2-resident rows on a Zen 5 core).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_fold_rows<const TB: usize>(
        rows: &[&[u8]],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        let n = x.len();
        for (w, a) in rows.iter().zip(acc) {
            x86::bf16_one_avx512([&w[..2 * n]], x, [&mut a[0]], Self::row_bytes(w));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::arch::avx2::{load2, store2, Widen8};
    use crate::arch::avx512::{load1, store1, Widen16};
    use crate::arch::prefetch_line;
    use crate::tiled::Lanes;
    use core::arch::x86_64::*;

    /// Byte-shuffle indices that turn eight bf16 (the same 16 bytes in both lanes) into eight
    /// f32: dword `d` takes bytes `2d`, `2d + 1` in its high half and zeros in its low half.
    const BF16_SPREAD: [u8; 32] = {
        let mut t = [0x80u8; 32];
        let mut d: u8 = 0;
        while d < 8 {
            t[4 * d as usize + 2] = 2 * d;
            t[4 * d as usize + 3] = 2 * d + 1;
            d += 1;
        }
        t
    };

    /// bf16 weights: zero-extend each pattern to 32 bits and shift it into the high half.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn bf16s_avx2(w: &[u8], out: &mut [f32]) {
        assert_eq!(w.len(), 2 * out.len());
        let full = out.len() - out.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: `i + 8 <= out.len()`, and `w` holds `2 * out.len()` bytes.
            unsafe {
                let raw = _mm_loadu_si128(w.as_ptr().add(2 * i).cast());
                let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_castsi256_ps(v));
            }
        }
        super::bf16s_scalar(&w[2 * full..], &mut out[full..]);
    }

    /// Sixteen bf16 → f32 by zero-extending to 32 bits and shifting into the high half.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn widen_512(v: __m256i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    }

    /// bf16 weights, sixteen at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) fn bf16s_avx512(w: &[u8], out: &mut [f32]) {
        assert_eq!(w.len(), 2 * out.len());
        let full = out.len() - out.len() % 16;
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= out.len()`, and `w` holds `2 * out.len()` bytes.
            unsafe {
                let raw = _mm256_loadu_si256(w.as_ptr().add(2 * i).cast());
                _mm512_storeu_ps(out.as_mut_ptr().add(i), widen_512(raw));
            }
        }
        super::bf16s_scalar(&w[2 * full..], &mut out[full..]);
    }

    /// bf16 rows against one activation row: each eight weights are one 16-byte broadcast
    /// load and one in-lane byte shuffle that places every pattern in the high half of its
    /// f32 lane.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn bf16_one_avx2<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|w| w.len() == 2 * x.len()) && x.len().is_multiple_of(16));
        // SAFETY: the table is 32 bytes.
        let spread = unsafe { _mm256_loadu_si256(BF16_SPREAD.as_ptr().cast()) };
        let mut acc = load2(&lanes);
        for c in (0..x.len()).step_by(16) {
            if (2 * c).is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(2 * c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`.
            let (xl, xh) = unsafe {
                (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)))
            };
            for (wr, ar) in w.iter().zip(acc.iter_mut()) {
                // SAFETY: each row holds `2 * x.len()` bytes (asserted), so both 16-byte loads
                // at `2 * c` lie inside it.
                let (lo, hi) = unsafe {
                    let p = wr.as_ptr().add(2 * c).cast::<__m128i>();
                    (
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(p)),
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(1))),
                    )
                };
                let wl = _mm256_castsi256_ps(_mm256_shuffle_epi8(lo, spread));
                let wh = _mm256_castsi256_ps(_mm256_shuffle_epi8(hi, spread));
                ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
                ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
            }
        }
        store2(&acc, lanes);
    }

    /// The AVX2 stored tile's widening: 8 patterns zero-extended and shifted into the high half.
    impl Widen8 for super::Bf16 {
        const BYTES: usize = 2;

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn widen8(p: *const u8) -> __m256 {
            // SAFETY: `p` points at 16 readable bytes (the caller's contract).
            let raw = unsafe { _mm_loadu_si128(p.cast()) };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
        }
    }

    /// The stored tile's widening: 16 patterns zero-extended and shifted into the high half.
    impl Widen16 for super::Bf16 {
        const BYTES: usize = 2;

        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn widen16(p: *const u8) -> __m512 {
            // SAFETY: `p` points at 32 readable bytes (the caller's contract).
            widen_512(unsafe { _mm256_loadu_si256(p.cast()) })
        }
    }

    /// bf16 rows against one activation row (AVX-512).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn bf16_one_avx512<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|w| w.len() == 2 * x.len()) && x.len().is_multiple_of(16));
        let mut a = load1(&lanes);
        for c in (0..x.len()).step_by(16) {
            if (2 * c).is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(2 * c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`, and each row holds `2 * x.len()` bytes (asserted).
            let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for (wr, ar) in w.iter().zip(a.iter_mut()) {
                // SAFETY: as above.
                let raw = unsafe { _mm256_loadu_si256(wr.as_ptr().add(2 * c).cast()) };
                *ar = _mm512_fmadd_ps(widen_512(raw), xv, *ar);
            }
        }
        store1(&a, lanes);
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use crate::arch::aarch64::{store4, widen_bf16};
    use core::arch::aarch64::*;

    /// bf16 weights, sixteen at a time.
    #[target_feature(enable = "neon")]
    pub(super) fn bf16s(w: &[u8], out: &mut [f32]) {
        assert_eq!(w.len(), 2 * out.len());
        let full = out.len() - out.len() % 16;
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= out.len()`, so the 32 bytes at `2 * i` lie inside `w` and the
            // 16 f32 at `i` inside `out`.
            unsafe {
                let p = w.as_ptr().add(2 * i);
                let [a, b] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p)));
                let [c, d] = widen_bf16(vreinterpretq_u16_u8(vld1q_u8(p.add(16))));
                store4(out.as_mut_ptr().add(i), [a, b, c, d]);
            }
        }
        super::bf16s_scalar(&w[2 * full..], &mut out[full..]);
    }
}
