//! INT4 weights in compressed-tensors' `pack-quantized` layout (symmetric, group size 32), as
//! Kimi K2 Thinking publishes its routed experts: `weight_packed` I32 `[rows, cols/8]`, element
//! `e` of a row in word `e/8` at bits `4·(e % 8)`, stored as `q + 8` (q in −8..=7);
//! `weight_scale` bf16 `[rows, cols/32]`. Element `(r, c)` is `(nibble − 8) · scale[r][c/32]`:
//! a 4-bit integer times an 8-bit significand, exact in f32.
//!
//! The words are little-endian, so byte `k` of a row holds element `2k` in its low nibble and
//! `2k + 1` in its high one: the same nibble order as MXFP4, read straight from the mapped
//! `weight_packed` bytes. The width must be a multiple of the 32-column group
//! ([`KernelError::GroupWidth`]).
//!
//! **SIMD.** AVX2 looks each nibble up in a 16-entry table of `nibble − 8` with the shared
//! nibble decoder (`crate::arch::avx2::NibbleDecoder`), shifts each value down from the top
//! byte of its dword (an arithmetic shift, so the sign comes along), converts exactly and
//! multiplies by the group scale; AVX-512 uses `vpermps` over the 16 values `−8.0 ..= 7.0`;
//! NEON a byte-table lookup and widening moves. Every product is exact, so each tier equals
//! the scalar decode bit for bit.

use super::{check_len, check_scales, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;
use sluice_core::bf16_to_f32;

/// Columns per scale group.
pub(crate) const GROUP: usize = 32;

/// The INT4 group-quantized format.
pub(crate) struct Int4Group;

/// One INT4 row: `cols / 2` bytes of nibbles and `cols / 32` bf16 scales.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int4Row<'a> {
    /// Packed nibbles, low nibble first (the little-endian words' bytes).
    packed: &'a [u8],
    /// One little-endian bf16 scale per 32-column group.
    scales: &'a [u8],
}

impl Int4Row<'_> {
    /// The scale of group `g`.
    #[inline]
    fn scale(&self, g: usize) -> f32 {
        bf16_to_f32(u16::from_le_bytes([self.scales[2 * g], self.scales[2 * g + 1]]))
    }
}

/// Stored nibble → the integer it holds (`nibble − 8`).
const Q: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// [`Q`] as f32 (the AVX-512 tile's table).
#[cfg(target_arch = "x86_64")]
const Q_F32: [f32; 16] =
    [-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];

impl<'a> Matrix<'a> {
    /// An INT4 pack-quantized matrix: `packed` is `weight_packed`'s bytes (`[rows, cols/8]`
    /// little-endian i32, `rows * cols / 2` bytes), `scales` is `weight_scale`,
    /// `[rows, cols/32]` little-endian bf16. A scale buffer of any other size is refused with
    /// [`KernelError::ScaleShape`].
    pub fn int4_group(
        rows: usize,
        cols: usize,
        packed: &'a [u8],
        scales: &'a [u8],
    ) -> Result<Self, KernelError> {
        let f = WeightFormat::Int4Group;
        if !cols.is_multiple_of(GROUP) {
            return Err(KernelError::GroupWidth { format: f.name(), cols, group: GROUP });
        }
        check_len("packed int4 words", rows, cols, f, rows * cols / 2, packed.len())?;
        check_scales(f, rows, cols, 2, scales.len())?;
        Ok(Self { rows, cols, format: f, data: packed, scales })
    }
}

impl Format for Int4Group {
    const TIER_WIDENS: bool = true;

    const BLOCK: usize = GROUP;

    type Row<'a> = Int4Row<'a>;

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> Int4Row<'a> {
        let g = m.cols / GROUP;
        Int4Row {
            packed: &m.data[r * m.cols / 2..(r + 1) * m.cols / 2],
            scales: &m.scales[2 * r * g..2 * (r + 1) * g],
        }
    }

    fn widen(row: Int4Row<'_>, c0: usize, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            let c = c0 + i;
            let b = row.packed[c / 2];
            let nib = if c.is_multiple_of(2) { b & 0x0F } else { b >> 4 };
            *o = f32::from(Q[usize::from(nib)]) * row.scale(c / GROUP);
        }
    }

    fn row_bytes(row: Int4Row<'_>) -> usize {
        row.packed.len()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_decode(row: Int4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(GROUP) && n.is_multiple_of(GROUP), "int4 span");
        let d = crate::arch::avx2::NibbleDecoder::new(&Q);
        for (k, o) in out.chunks_exact_mut(GROUP).enumerate() {
            let g = c0 / GROUP + k;
            let v = x86::group_avx2(&d, &row.packed[16 * g..16 * g + 16], row.scale(g));
            for (h, v) in v.into_iter().enumerate() {
                // SAFETY: `o` holds 32 f32 and `8 * h + 8 <= 32`.
                unsafe { core::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr().add(8 * h), v) };
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(row: Int4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(GROUP) && n.is_multiple_of(GROUP), "int4 span");
        let lut = x86::lut512();
        for (k, o) in out.chunks_exact_mut(GROUP).enumerate() {
            let g = c0 / GROUP + k;
            let [lo, hi] = x86::group_avx512(lut, &row.packed[16 * g..16 * g + 16], row.scale(g));
            // SAFETY: `o` holds 32 f32.
            unsafe {
                core::arch::x86_64::_mm512_storeu_ps(o.as_mut_ptr(), lo);
                core::arch::x86_64::_mm512_storeu_ps(o.as_mut_ptr().add(16), hi);
            }
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn neon_decode(row: Int4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(GROUP) && n.is_multiple_of(GROUP), "int4 span");
        for (k, o) in out.chunks_exact_mut(GROUP).enumerate() {
            let g = c0 / GROUP + k;
            neon::group(&row.packed[16 * g..16 * g + 16], row.scale(g), o);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        x86::fold_one_avx2(rows, c0, x, acc);
    }

    /// Calls of up to this many activation rows fold INT4 rows from their packed nibbles on
    /// AVX2 ([`crate::stored`]); more take the buffered nest or the panel. A layer of 32
    /// experts of 2,048 × 7,168 from memory, 2 threads (`SLUICE_ISA=avx2 layer_batch 2 32 T
    /// 2048 7168 3 int4`, Zen 5, session 39) against the buffered nest: 2 / 4 / 6 rows
    /// 1.79 / 1.03 / 1.07×, 8 rows 0.98×.
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = 6;

    /// The AVX2 nibble tile (`arch::avx2::fold_nibble_tile`) over the groups'
    /// `group_avx2` values (every scale: each product is one rounding).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let n = x.first().map_or(0, |s| s.len());
        assert!(c0.is_multiple_of(GROUP) && n.is_multiple_of(GROUP), "int4 span");
        let (g0, g1) = (c0 / GROUP, (c0 + n) / GROUP);
        let w = rows.map(|r| (&r.packed[16 * g0..16 * g1], &r.scales[2 * g0..2 * g1]));
        crate::arch::avx2::fold_nibble_tile::<x86::Groups, R, N>(w, x, acc, ahead);
    }

    /// As MXFP4's (the same tile): measured against the panel on one thread
    /// (`layer_batch 1 64 T 768 2048 3 int4`, medians of 3 rounds), 1.4× as fast at 2 rows,
    /// 2.1× at 4, 1.45× at 8, slower at 16 and even at 32. Session 26 (Zen 5, one expert's
    /// shape from cache, one thread, 3 rounds) against the cap of 8: 1.18× at 9 rows, 1.13× at
    /// 10, 1.05× at 12, even at 16.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = 12;

    /// MXFP4's tile over the table `nibble − 8` and the bf16 group scales (the same nibble
    /// order and 32-column blocks; every product exact, as the decode's).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let scale = |s: &[u8]| bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
        const _: () = assert!(GROUP == 32, "the nibble tile's blocks");
        // SAFETY: guaranteed by the caller.
        unsafe {
            super::mxfp4::avx512::nibble_rows_tile::<Self, R, N, 2>(
                &Q_F32,
                scale,
                |r| (r.packed, r.scales),
                rows,
                c0,
                x,
                acc,
                ahead,
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_fold_one<const R: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        x86::fold_one_avx512(rows, c0, x, acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{bf16_to_f32, Int4Row, GROUP, Q};
    use crate::arch::avx2::{load2, store2, NibbleDecoder};
    use crate::arch::avx512::{load1, store1};
    use crate::arch::prefetch_line;
    use crate::tiled::Lanes;
    use core::arch::x86_64::*;

    /// One group (16 packed bytes) → columns 0–7, 8–15, 16–23, 24–31 times `scale`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn group_avx2(d: &NibbleDecoder, packed: &[u8], scale: f32) -> [__m256; 4] {
        let s = _mm256_set1_ps(scale);
        d.top_bytes(packed)
            .map(|q| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(q)), s))
    }

    /// INT4 groups for the AVX2 nibble tile: [`group_avx2`]'s values.
    pub(super) struct Groups;

    impl crate::arch::avx2::NibbleBlocks for Groups {
        const TABLE: [i8; 16] = Q;

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn block(d: &NibbleDecoder, packed: &[u8], scales: &[u8], g: usize) -> [__m256; 4] {
            group_avx2(
                d,
                packed,
                bf16_to_f32(u16::from_le_bytes([scales[2 * g], scales[2 * g + 1]])),
            )
        }
    }

    /// INT4 rows against one activation row, a group at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn fold_one_avx2<const R: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: &[f32],
        lanes: [&mut Lanes; R],
    ) {
        assert!(c0.is_multiple_of(GROUP) && x.len().is_multiple_of(GROUP), "int4 span");
        assert!(rows.iter().all(|r| c0 + x.len() <= 2 * r.packed.len()));
        let ahead = R * rows[0].packed.len();
        let d = NibbleDecoder::new(&Q);
        let mut acc = load2(&lanes);
        for c in (0..x.len()).step_by(GROUP) {
            let g = (c0 + c) / GROUP;
            if g.is_multiple_of(4) {
                for r in &rows {
                    prefetch_line(r.packed.as_ptr().wrapping_add(16 * g + ahead));
                }
            }
            for (r, ar) in rows.iter().zip(acc.iter_mut()) {
                let wv = group_avx2(&d, &r.packed[16 * g..16 * g + 16], r.scale(g));
                for (k, v) in wv.into_iter().enumerate() {
                    // SAFETY: `c + 8 * k + 8 <= x.len()`.
                    let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(c + 8 * k)) };
                    ar[k % 2] = _mm256_fmadd_ps(v, xv, ar[k % 2]);
                }
            }
        }
        store2(&acc, lanes);
    }

    /// The sixteen values `nibble − 8` as f32.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn lut512() -> __m512 {
        let v = Q.map(f32::from);
        // SAFETY: `v` holds 16 f32.
        unsafe { _mm512_loadu_ps(v.as_ptr()) }
    }

    /// One group (16 packed bytes) → columns 0–15 and 16–31 times `scale`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn group_avx512(lut: __m512, packed: &[u8], scale: f32) -> [__m512; 2] {
        assert_eq!(packed.len(), 16);
        let s = _mm512_set1_ps(scale);
        // SAFETY: `packed` is 16 bytes (asserted).
        let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().cast()) };
        // Interleaving the bytes with themselves shifted right by 4 puts column c's nibble in
        // the low 4 bits of byte c; `vpermps` reads only index bits 0–3.
        let shifted = _mm_srli_epi16::<4>(bytes);
        let halves = [_mm_unpacklo_epi8(bytes, shifted), _mm_unpackhi_epi8(bytes, shifted)];
        halves.map(|h| _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(h), lut), s))
    }

    /// INT4 rows against one activation row (AVX-512).
    #[target_feature(enable = "avx512f")]
    pub(super) fn fold_one_avx512<const R: usize>(
        rows: [Int4Row<'_>; R],
        c0: usize,
        x: &[f32],
        lanes: [&mut Lanes; R],
    ) {
        assert!(c0.is_multiple_of(GROUP) && x.len().is_multiple_of(GROUP), "int4 span");
        assert!(rows.iter().all(|r| c0 + x.len() <= 2 * r.packed.len()));
        let ahead = R * rows[0].packed.len();
        let lut = lut512();
        let mut acc = load1(&lanes);
        for c in (0..x.len()).step_by(GROUP) {
            let g = (c0 + c) / GROUP;
            if g.is_multiple_of(4) {
                for r in &rows {
                    prefetch_line(r.packed.as_ptr().wrapping_add(16 * g + ahead));
                }
            }
            // SAFETY: `c + 32 <= x.len()`.
            let xv = unsafe {
                [_mm512_loadu_ps(x.as_ptr().add(c)), _mm512_loadu_ps(x.as_ptr().add(c + 16))]
            };
            for (r, ar) in rows.iter().zip(acc.iter_mut()) {
                let wv = group_avx512(lut, &r.packed[16 * g..16 * g + 16], r.scale(g));
                *ar = _mm512_fmadd_ps(wv[0], xv[0], *ar);
                *ar = _mm512_fmadd_ps(wv[1], xv[1], *ar);
            }
        }
        store1(&acc, lanes);
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::Q;
    use crate::arch::aarch64::store4;
    use core::arch::aarch64::*;

    /// One group (16 packed bytes) → 32 f32 times `scale` into `out`.
    #[target_feature(enable = "neon")]
    pub(super) fn group(packed: &[u8], scale: f32, out: &mut [f32]) {
        assert!(packed.len() == 16 && out.len() == 32);
        // SAFETY: `packed` and the table are 16 bytes.
        let (bytes, table) = unsafe { (vld1q_u8(packed.as_ptr()), vld1q_s8(Q.as_ptr())) };
        let s = vdupq_n_f32(scale);
        let mask = vdupq_n_u8(0x0F);
        // Zipping the low and high nibbles puts column c's nibble in byte c.
        let (l, h) = (vandq_u8(bytes, mask), vshrq_n_u8::<4>(bytes));
        for (half, nibbles) in [vzip1q_u8(l, h), vzip2q_u8(l, h)].into_iter().enumerate() {
            let q = vqtbl1q_s8(table, nibbles);
            let (lo, hi) = (vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q));
            let f = [
                vmovl_s16(vget_low_s16(lo)),
                vmovl_high_s16(lo),
                vmovl_s16(vget_low_s16(hi)),
                vmovl_high_s16(hi),
            ]
            .map(|w| vmulq_f32(vcvtq_f32_s32(w), s));
            // SAFETY: `out` holds 32 f32 and `16 * half + 16 <= 32`.
            unsafe { store4(out.as_mut_ptr().add(16 * half), f) };
        }
    }
}
