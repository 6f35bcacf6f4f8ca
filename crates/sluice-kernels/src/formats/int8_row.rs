//! Row-int8 weights: one signed byte per element and one little-endian f16 scale per output
//! row. The matmul folds the integers `f32(q)` (exact) and multiplies the reduced sum by the
//! row's scale once ([`Format::finish`]; see [`crate::matmul`] for why this is the canonical
//! int8 dot product); [`Matrix::get`] returns the dequantized `f32(q) · f32(scale)` (exact).
//!
//! SIMD tiers: sign-extension to i32 (`vpmovsxbd`, NEON's widening moves) and an exact
//! conversion; a weight costs no multiplication.

use super::{check_len, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;
use sluice_core::f16_to_f32;

/// The row-int8 format.
pub(crate) struct Int8Row;

/// One int8 row: its values and its scale, already widened from f16.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int8RowView<'a> {
    /// One signed byte per column.
    values: &'a [u8],
    /// The row scale.
    scale: f32,
}

impl<'a> Matrix<'a> {
    /// A row-int8 matrix: `data` is `[rows, cols]` signed bytes, `scales` is `[rows]`
    /// little-endian f16 (`2 * rows` bytes).
    pub fn int8_row(
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [u8],
    ) -> Result<Self, KernelError> {
        let f = WeightFormat::Int8Row;
        check_len("int8 values", rows, cols, f, rows * cols, data.len())?;
        check_len("f16 row scales", rows, cols, f, rows * 2, scales.len())?;
        Ok(Self { rows, cols, format: f, data, scales })
    }
}

/// Sign-extends stored bytes to the integers they hold, as f32.
fn ints(q: &[u8], out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(q) {
        *o = f32::from(i8::from_le_bytes([b]));
    }
}

impl Format for Int8Row {
    type Row<'a> = Int8RowView<'a>;

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> Int8RowView<'a> {
        let scale = f16_to_f32(u16::from_le_bytes([m.scales[2 * r], m.scales[2 * r + 1]]));
        Int8RowView { values: &m.data[r * m.cols..(r + 1) * m.cols], scale }
    }

    fn widen(row: Int8RowView<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        for (o, &q) in out.iter_mut().zip(&row.values[c0..c0 + n]) {
            *o = f32::from(i8::from_le_bytes([q])) * row.scale;
        }
    }

    fn fold_values(row: Int8RowView<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        ints(&row.values[c0..c0 + n], out);
    }

    #[inline]
    fn finish(row: Int8RowView<'_>, sum: f32) -> f32 {
        sum * row.scale
    }

    fn row_bytes(row: Int8RowView<'_>) -> usize {
        row.values.len()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_decode(row: Int8RowView<'_>, c0: usize, out: &mut [f32]) {
        x86::int8s_avx2(&row.values[c0..c0 + out.len()], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(row: Int8RowView<'_>, c0: usize, out: &mut [f32]) {
        x86::int8s_avx512(&row.values[c0..c0 + out.len()], out);
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn neon_decode(row: Int8RowView<'_>, c0: usize, out: &mut [f32]) {
        neon::int8s(&row.values[c0..c0 + out.len()], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [Int8RowView<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        let ahead = R * Self::row_bytes(rows[0]);
        x86::int8_one_avx2(rows.map(|r| &r.values[c0..c0 + n]), x, acc, ahead);
    }

    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = crate::stored::STORED_ROWS;

    /// The integers widened in registers as the tile reads them (AVX2); the scale stays out
    /// of the sum.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [Int8RowView<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        crate::arch::avx2::fold_stored_tile::<Self, R, N>(
            rows.map(|r| r.values),
            c0,
            x,
            acc,
            ahead,
        );
    }

    /// Measured against the panel on one thread (`layer_batch 1 64 T 768 2048 5 int8`, medians
    /// of 3 interleaved rounds): 1.6× as fast at 2 and 4 rows, 1.4× at 8, 1.16× at 16, 1.03×
    /// at 32, so the stored nest's whole range.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = crate::stored::STORED_ROWS;

    /// The integers widened in registers as the tile reads them (sign extension and an
    /// exact conversion, the panel's values); the scale stays out of the sum.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [Int8RowView<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let w = rows.map(|r| r.values);
        crate::arch::avx512::fold_stored_tile::<Self, R, N>(w, c0, x, acc, ahead);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_fold_one<const R: usize>(
        rows: [Int8RowView<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        let n = x.len();
        let ahead = R * Self::row_bytes(rows[0]);
        x86::int8_one_avx512(rows.map(|r| &r.values[c0..c0 + n]), x, acc, ahead);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ints;
    use crate::arch::avx2::{load2, store2, Widen8};
    use crate::arch::avx512::{load1, store1, Widen16};
    use crate::arch::prefetch_line;
    use crate::tiled::Lanes;
    use core::arch::x86_64::*;

    /// int8 weights: `f32(q)`, eight at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn int8s_avx2(q: &[u8], out: &mut [f32]) {
        assert_eq!(q.len(), out.len());
        let full = out.len() - out.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: `i + 8 <= out.len() = q.len()`.
            unsafe {
                let raw = _mm_loadl_epi64(q.as_ptr().add(i).cast());
                let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
        ints(&q[full..], &mut out[full..]);
    }

    /// int8 weights: `f32(q)`, sixteen at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) fn int8s_avx512(q: &[u8], out: &mut [f32]) {
        assert_eq!(q.len(), out.len());
        let full = out.len() - out.len() % 16;
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= out.len() = q.len()`.
            unsafe {
                let raw = _mm_loadu_si128(q.as_ptr().add(i).cast());
                let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
        ints(&q[full..], &mut out[full..]);
    }

    /// int8 rows against one activation row: eight values are one sign-extending load
    /// (`vpmovsxbd`) and an exact conversion.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn int8_one_avx2<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|q| q.len() == x.len()) && x.len().is_multiple_of(16));
        let mut acc = load2(&lanes);
        for c in (0..x.len()).step_by(16) {
            if c.is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`.
            let (xl, xh) = unsafe {
                (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)))
            };
            for (q, ar) in w.iter().zip(acc.iter_mut()) {
                // SAFETY: each row holds `x.len()` bytes (asserted) and `c + 16 <= x.len()`,
                // so both 8-byte loads lie inside it.
                let (lo, hi) = unsafe {
                    let p = q.as_ptr().add(c);
                    (_mm_loadl_epi64(p.cast()), _mm_loadl_epi64(p.add(8).cast()))
                };
                let wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
                let wh = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
                ar[0] = _mm256_fmadd_ps(wl, xl, ar[0]);
                ar[1] = _mm256_fmadd_ps(wh, xh, ar[1]);
            }
        }
        store2(&acc, lanes);
    }

    /// The AVX2 stored tile's widening: 8 signed bytes sign-extended and converted (exact).
    impl Widen8 for super::Int8Row {
        const BYTES: usize = 1;

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn widen8(p: *const u8) -> __m256 {
            // SAFETY: `p` points at 8 readable bytes (the caller's contract).
            let raw = unsafe { _mm_loadl_epi64(p.cast()) };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw))
        }
    }

    /// The stored tile's widening: 16 signed bytes sign-extended and converted (exact).
    impl Widen16 for super::Int8Row {
        const BYTES: usize = 1;

        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn widen16(p: *const u8) -> __m512 {
            // SAFETY: `p` points at 16 readable bytes (the caller's contract).
            let raw = unsafe { _mm_loadu_si128(p.cast()) };
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw))
        }
    }

    /// int8 rows against one activation row (AVX-512).
    #[target_feature(enable = "avx512f")]
    pub(super) fn int8_one_avx512<const R: usize>(
        w: [&[u8]; R],
        x: &[f32],
        lanes: [&mut Lanes; R],
        ahead: usize,
    ) {
        assert!(w.iter().all(|q| q.len() == x.len()) && x.len().is_multiple_of(16));
        let mut a = load1(&lanes);
        for c in (0..x.len()).step_by(16) {
            if c.is_multiple_of(64) {
                for wr in &w {
                    prefetch_line(wr.as_ptr().wrapping_add(c + ahead));
                }
            }
            // SAFETY: `c + 16 <= x.len()`, and each row holds `x.len()` bytes (asserted).
            let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for (q, ar) in w.iter().zip(a.iter_mut()) {
                // SAFETY: as above.
                let raw = unsafe { _mm_loadu_si128(q.as_ptr().add(c).cast()) };
                let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
                *ar = _mm512_fmadd_ps(v, xv, *ar);
            }
        }
        store1(&a, lanes);
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::ints;
    use crate::arch::aarch64::store4;
    use core::arch::aarch64::*;

    /// int8 weights: `f32(q)`, sixteen at a time by two widening moves to i32.
    #[target_feature(enable = "neon")]
    pub(super) fn int8s(q: &[u8], out: &mut [f32]) {
        assert_eq!(q.len(), out.len());
        let full = out.len() - out.len() % 16;
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= out.len() = q.len()`.
            unsafe {
                let v = vreinterpretq_s8_u8(vld1q_u8(q.as_ptr().add(i)));
                let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
                let f = [
                    vmovl_s16(vget_low_s16(lo)),
                    vmovl_high_s16(lo),
                    vmovl_s16(vget_low_s16(hi)),
                    vmovl_high_s16(hi),
                ]
                .map(|w| vcvtq_f32_s32(w));
                store4(out.as_mut_ptr().add(i), f);
            }
        }
        ints(&q[full..], &mut out[full..]);
    }
}
