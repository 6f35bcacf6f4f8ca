//! MXFP4 weights (OCP microscaling FP4): E2M1 nibbles, low nibble first, in blocks of 32
//! columns, one E8M0 scale byte per block; element `(r, c)` is `E2M1[nibble] · 2^(s − 127)`
//! (one rounding, exact for every real scale). Layout: `packed [rows, cols/2]` and
//! `scales [rows, cols/32]`, row-major.
//!
//! **GPT-OSS packs MXFP4 the same way.** Its experts are `*_blocks` u8 `[E, out, in/32, 16]`
//! and `*_scales` u8 `[E, out, in/32]`: rows are output features, blocked along the input
//! axis, and byte `k` of a 16-byte block holds element `2k` in its low nibble and `2k + 1` in
//! its high nibble. Flattening one expert's `[out, in/32, 16]` row-major gives byte
//! `r · in/2 + b · 16 + k` for element `(r, 32b + 2k (+1))`, which is exactly `packed[r, c/2]`
//! here, and the scales are the same `[out, in/32]`. So a GPT-OSS expert is a
//! [`Matrix::mxfp4`] over the mapped bytes, with no second kernel and no repacking (the test
//! `gpt_oss_blocks_are_the_mxfp4_layout` builds a tensor in GPT-OSS's shape and checks it).
//!
//! **AVX2.** `vpshufb` maps each nibble to the signed integer `k = 2 · E2M1[nibble]` (0, ±1,
//! ±2, ±3, ±4, ±6, ±8, ±12); a second in-lane shuffle places each `k` in the top byte of a
//! dword, the integer `k · 2^24`, whose conversion to f32 is exact; one multiplication by
//! `2^(s − 152)` (a normal f32 for `26 ≤ s ≤ 254`, built from its bits) then rounds
//! `k · 2^(s − 128)` once. That is the same real number as the reference's
//! `E2M1[nibble] · 2^(s − 127)`, rounded once, so the same f32 (an overflow to ±∞ at large `s`
//! included). Blocks with `s < 26` (tiny or subnormal scales, which some CPUs handle in
//! microcode) or `s = 255` (NaN) take the reference's own expression; real checkpoints never
//! have them, so the fused loops check a whole span up front (`all_fast`) and carry no slow
//! branch, and a span with such a block goes through the buffered path. Code 8 (−0.0)
//! becomes +0.0, which never reaches a result (see [`crate::tiled::Kernel::decode`]). One
//! activation row runs two rows per pass, row a in the low 128-bit lane and row b in the
//! high one, so the nibble split, lookup and interleave serve both rows at once.
//!
//! **AVX-512.** `vpermps` over the 16 E2M1 values times `e8m0_to_f32(s)` (the reference's
//! expression, computed once per block on the table rather than on each permuted value: the
//! same products). Its indices come from one `vpmultishiftqb` per 16 columns where the CPU has
//! AVX-512 VBMI, else from byte unpacks and a widening: the one-row kernel is bound by the
//! shuffle port, which the widening and the unpacks crowded (docs/PERFORMANCE.md, session 15). **NEON.** Two byte
//! tables holding the low and high byte of each E2M1 value's bf16 pattern (every E2M1 value is
//! exactly a bf16), widened and multiplied by `e8m0_to_f32(s)`.

use std::ops::Range;

use super::{check_len, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;

/// The MXFP4 format.
pub(crate) struct Mxfp4;

/// One MXFP4 row: `cols / 2` bytes of nibbles and `cols / 32` E8M0 scales.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mxfp4Row<'a> {
    /// Packed nibbles.
    packed: &'a [u8],
    /// One scale byte per 32-column block.
    scales: &'a [u8],
}

/// E2M1 code → value (bit 3 is the sign; code 8 is −0.0).
pub const E2M1: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// E8M0 scale byte → `2^(s − 127)` as f32 (s = 0 gives 2^-127, a subnormal; 255 gives NaN).
#[inline]
pub const fn e8m0_to_f32(s: u8) -> f32 {
    match s {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        _ => f32::from_bits((s as u32) << 23),
    }
}

/// [`e8m0_to_f32`] of every scale byte: a kernel that indexes it with the byte broadcasts a
/// block's factor straight from memory (one load, no shuffle), where computing it takes a
/// shift, a move into a vector register and a broadcast there, on the port the table's
/// permutes need (the AVX-512 one-row fold, docs/PERFORMANCE.md, session 27).
#[cfg(target_arch = "x86_64")]
pub(crate) static E8M0: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut s: u8 = 0;
    loop {
        t[s as usize] = e8m0_to_f32(s);
        if s == u8::MAX {
            break t;
        }
        s += 1;
    }
};

impl<'a> Matrix<'a> {
    /// An MXFP4 matrix: `packed` is `[rows, cols/2]`, `scales` is `[rows, cols/32]` (GPT-OSS's
    /// `*_blocks` / `*_scales` of one expert are exactly this; see `formats/mxfp4.rs`).
    pub fn mxfp4(
        rows: usize,
        cols: usize,
        packed: &'a [u8],
        scales: &'a [u8],
    ) -> Result<Self, KernelError> {
        if !cols.is_multiple_of(32) {
            return Err(KernelError::BlockWidth { cols });
        }
        let f = WeightFormat::Mxfp4;
        check_len("packed nibbles", rows, cols, f, rows * cols / 2, packed.len())?;
        check_len("scales", rows, cols, f, rows * cols / 32, scales.len())?;
        Ok(Self { rows, cols, format: f, data: packed, scales })
    }
}

impl Format for Mxfp4 {
    const BLOCK: usize = 32;

    type Row<'a> = Mxfp4Row<'a>;

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> Mxfp4Row<'a> {
        Mxfp4Row {
            packed: &m.data[r * m.cols / 2..(r + 1) * m.cols / 2],
            scales: &m.scales[r * m.cols / 32..(r + 1) * m.cols / 32],
        }
    }

    fn widen(row: Mxfp4Row<'_>, c0: usize, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            let c = c0 + i;
            let b = row.packed[c / 2];
            let nib = if c.is_multiple_of(2) { b & 0x0F } else { b >> 4 };
            *o = E2M1[usize::from(nib)] * e8m0_to_f32(row.scales[c / 32]);
        }
    }

    fn row_bytes(row: Mxfp4Row<'_>) -> usize {
        row.packed.len()
    }

    /// The block scales (a sixteenth of the bytes, in a separate buffer the one-row kernels
    /// do not prefetch as they go).
    fn prefetch_side<'a>(m: &Matrix<'a>, rows: Range<usize>) -> &'a [u8] {
        m.rows_bytes(rows)[1]
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_decode(row: Mxfp4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
        avx2::mxfp4s(&row.packed[c0 / 2..(c0 + n) / 2], &row.scales[c0 / 32..(c0 + n) / 32], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(row: Mxfp4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
        avx512::mxfp4s(&row.packed[c0 / 2..(c0 + n) / 2], &row.scales[c0 / 32..(c0 + n) / 32], out);
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn neon_decode(row: Mxfp4Row<'_>, c0: usize, out: &mut [f32]) {
        let n = out.len();
        assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
        neon::mxfp4s(&row.packed[c0 / 2..(c0 + n) / 2], &row.scales[c0 / 32..(c0 + n) / 32], out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [Mxfp4Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        use crate::arch::avx2::{load2, store2};
        let n = x.len();
        assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
        let (b0, b1) = (c0 / 32, (c0 + n) / 32);
        if !rows.iter().all(|r| avx2::all_fast(&r.scales[b0..b1])) {
            // SAFETY: the caller guarantees AVX2 and FMA and the span.
            unsafe {
                crate::tiled::fold_one_buffered::<crate::arch::avx2::Avx2, Self, R>(
                    rows, c0, x, acc,
                );
            }
            return;
        }
        let ahead = R * Self::row_bytes(rows[0]);
        let mut a = load2(&acc);
        let w = rows.map(|r| (&r.packed[c0 / 2..(c0 + n) / 2], &r.scales[b0..b1]));
        avx2::mxfp4_one(w, x, &mut a, ahead);
        store2(&a, acc);
    }

    /// Calls of up to this many activation rows fold MXFP4 rows from their packed nibbles on
    /// AVX2 ([`crate::stored`]); more take the buffered nest or the panel. A layer of 32
    /// experts of 2,048 × 7,168 from memory, 2 threads (`SLUICE_ISA=avx2 layer_batch 2 32 T
    /// 2048 7168 3 mxfp4`, Zen 5, session 39) against the buffered nest: 2 / 4 / 6 / 8 rows
    /// 1.98 / 1.17 / 1.24 / 1.10×.
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = 8;

    /// The AVX2 nibble tile (`arch::avx2::fold_nibble_tile`) over [`Decoder::fast`]'s
    /// blocks; a span with a scale outside its range takes the buffered decode.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [Mxfp4Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let n = x.first().map_or(0, |s| s.len());
        let (b0, b1) = (c0 / 32, (c0 + n) / 32);
        let fast = c0.is_multiple_of(32)
            && n.is_multiple_of(32)
            && rows.iter().all(|r| avx2::all_fast(&r.scales[b0..b1]));
        if !fast {
            // SAFETY: guaranteed by the caller.
            unsafe {
                crate::tiled::fold_stored_buffered::<crate::arch::avx2::Avx2, Self, R, N>(
                    rows, c0, x, acc,
                );
            }
            return;
        }
        let w = rows.map(|r| (&r.packed[c0 / 2..(c0 + n) / 2], &r.scales[b0..b1]));
        crate::arch::avx2::fold_nibble_tile::<avx2::Blocks, R, N>(w, x, acc, ahead);
    }

    /// The tile decodes each block once per token group of six (the panel once in all):
    /// measured against the panel on one thread (`layer_batch 1 64 T 768 2048 3 mxfp4`,
    /// medians of 3 rounds, two runs), 1.4-1.9× as fast at 2 rows, 1.5-1.65× at 4, 1.25-1.65×
    /// at 8, 1.15× at 10, no faster at 12 to 16, slower at 32. Session 26 (Zen 5, the tile's
    /// scale factor inlined, twice as fast at 2 to 8 rows): a layer of 128 K3 experts from
    /// memory (`layer_batch 2 128 T 3072 3584 3 mxfp4`, 3 rounds) 1.13× at 10 rows, 1.04× at 12,
    /// 0.94× at 16 against the cap of 8; one expert from cache 1.05–1.12× at 9 to 12.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = 12;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [Mxfp4Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let (table, factor) = (&E2M1, avx512::factor);
        // SAFETY: guaranteed by the caller.
        unsafe {
            avx512::nibble_rows_tile::<Self, R, N, 1>(
                table,
                factor,
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
        rows: [Mxfp4Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        use crate::arch::avx512::{load1, store1};
        let n = x.len();
        assert!(c0.is_multiple_of(32) && n.is_multiple_of(32), "mxfp4 span");
        let ahead = R * Self::row_bytes(rows[0]);
        let mut a = load1(&acc);
        let w = rows.map(|r| (&r.packed[c0 / 2..(c0 + n) / 2], &r.scales[c0 / 32..(c0 + n) / 32]));
        avx512::mxfp4_one(w, x, &mut a, ahead);
        store1(&a, acc);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "mxfp4_avx2.rs"]
mod avx2;

#[cfg(target_arch = "x86_64")]
#[path = "mxfp4_avx512.rs"]
pub(super) mod avx512;

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{e8m0_to_f32, E2M1};
    use crate::arch::aarch64::{store4, widen_bf16};
    use core::arch::aarch64::*;

    /// Byte `k` (2 = low, 3 = high byte of the bf16 half) of each E2M1 value's f32 pattern.
    const fn e2m1_bytes(k: usize) -> [u8; 16] {
        let mut t = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = E2M1[i].to_le_bytes()[k];
            i += 1;
        }
        t
    }

    /// Low byte of each E2M1 value's bf16 pattern.
    const E2M1_BF16_LO: [u8; 16] = e2m1_bytes(2);
    /// High byte of each E2M1 value's bf16 pattern.
    const E2M1_BF16_HI: [u8; 16] = e2m1_bytes(3);

    // Every E2M1 value must be exactly representable as bf16 for the lookup to be exact.
    const _: () = {
        let lo = e2m1_bytes(0);
        let mid = e2m1_bytes(1);
        let mut i = 0;
        while i < 16 {
            assert!(lo[i] == 0 && mid[i] == 0);
            i += 1;
        }
    };

    /// Sixteen nibbles (one per byte, values 0–15) → E2M1 × scale in four registers.
    #[target_feature(enable = "neon")]
    #[inline]
    fn decode16(
        nibbles: uint8x16_t,
        lo: uint8x16_t,
        hi: uint8x16_t,
        scale: float32x4_t,
    ) -> [float32x4_t; 4] {
        let l = vqtbl1q_u8(lo, nibbles);
        let h = vqtbl1q_u8(hi, nibbles);
        // Interleaving low and high bytes gives little-endian bf16 patterns, columns 0–7 and
        // 8–15.
        let [a, b] = widen_bf16(vreinterpretq_u16_u8(vzip1q_u8(l, h)));
        let [c, d] = widen_bf16(vreinterpretq_u16_u8(vzip2q_u8(l, h)));
        [a, b, c, d].map(|v| vmulq_f32(v, scale))
    }

    /// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each.
    #[target_feature(enable = "neon")]
    pub(super) fn mxfp4s(packed: &[u8], scales: &[u8], out: &mut [f32]) {
        assert!(packed.len() == 16 * scales.len() && out.len() == 32 * scales.len());
        // SAFETY: both tables are 16 bytes.
        let (lo, hi) =
            unsafe { (vld1q_u8(E2M1_BF16_LO.as_ptr()), vld1q_u8(E2M1_BF16_HI.as_ptr())) };
        let mask = vdupq_n_u8(0x0F);
        for (b, &s) in scales.iter().enumerate() {
            let scale = vdupq_n_f32(e8m0_to_f32(s));
            // SAFETY: block `b < scales.len()` owns bytes `16 * b..16 * b + 16` of `packed`.
            let bytes = unsafe { vld1q_u8(packed.as_ptr().add(16 * b)) };
            // Byte i holds columns 2i (low nibble) and 2i + 1 (high nibble); zipping the two
            // nibble vectors puts column c's nibble in byte c (columns 0–15, then 16–31).
            let (l, h) = (vandq_u8(bytes, mask), vshrq_n_u8::<4>(bytes));
            for (half, nibbles) in [vzip1q_u8(l, h), vzip2q_u8(l, h)].into_iter().enumerate() {
                let v = decode16(nibbles, lo, hi, scale);
                // SAFETY: `32 * b + 16 * half + 16 <= out.len()`.
                unsafe { store4(out.as_mut_ptr().add(32 * b + 16 * half), v) };
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{e8m0_to_f32, E8M0};

    /// The table the AVX-512 kernels broadcast a block's factor from holds the reference's
    /// factor of every scale byte, bit for bit (2^-127 subnormal at 0, NaN at 255).
    #[test]
    fn e8m0_table_is_the_reference_factor_of_every_byte() {
        for s in 0..=255u8 {
            assert_eq!(E8M0[usize::from(s)].to_bits(), e8m0_to_f32(s).to_bits(), "byte {s}");
        }
        assert_eq!(E8M0[0].to_bits(), 0x0040_0000);
        assert!(E8M0[255].is_nan());
    }
}
