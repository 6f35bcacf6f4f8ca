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
mod avx2 {
    use super::{e8m0_to_f32, E2M1};
    use crate::arch::avx2::{Acc2, NibbleDecoder};
    use crate::arch::prefetch_line;
    use core::arch::x86_64::*;

    /// `2 · E2M1[code]` as signed bytes (code 8, −0.0, maps to 0; see the module docs).
    const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

    // The table must be exactly twice the reference values (up to the sign of zero).
    const _: () = {
        let mut i = 0;
        while i < 16 {
            assert!(E2M1_X2[i] as f32 == 2.0 * E2M1[i]);
            i += 1;
        }
    };

    /// The E8M0 scales whose blocks the integer path decodes.
    const FAST: std::ops::RangeInclusive<u8> = 26..=254;

    /// Whether every scale byte lies in the fast range (see the module docs). A min/max fold
    /// without early exit, which the compiler turns into 32-byte `vpminub`/`vpmaxub` steps: a
    /// byte-at-a-time test with a branch per scale cost as much as decoding the block it guards.
    #[inline]
    pub(super) fn all_fast(scales: &[u8]) -> bool {
        let (lo, hi) =
            scales.iter().fold((u8::MAX, u8::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        scales.is_empty() || (FAST.contains(&lo) && FAST.contains(&hi))
    }

    /// MXFP4 rows against one activation row, a 32-column block at a time: two rows per pass
    /// ([`mxfp4_pair`]), an odd last row alone. Every scale must be in the fast range
    /// ([`all_fast`]); the caller checks that once per span (a scale outside it would give a
    /// wrong value, never an unsafe access, so the kernels below only debug-assert it).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn mxfp4_one<const R: usize>(
        w: [(&[u8], &[u8]); R],
        x: &[f32],
        a: &mut Acc2<R>,
        ahead: usize,
    ) {
        let blocks = x.len() / 32;
        assert!(x.len().is_multiple_of(32));
        assert!(w.iter().all(|(p, s)| p.len() == 16 * blocks && s.len() == blocks));
        debug_assert!(w.iter().all(|(_, s)| all_fast(s)));
        let d = Decoder::new();
        let mut r = 0;
        while r + 1 < R {
            let [lo_a, hi_a] = a[r];
            let [lo_b, hi_b] = a[r + 1];
            // Accumulator k of the pair holds lanes 4k..4k + 4 of row a, then of row b.
            let mut pair = [
                _mm256_permute2f128_ps::<0x20>(lo_a, lo_b),
                _mm256_permute2f128_ps::<0x31>(lo_a, lo_b),
                _mm256_permute2f128_ps::<0x20>(hi_a, hi_b),
                _mm256_permute2f128_ps::<0x31>(hi_a, hi_b),
            ];
            for (k, xs) in x.chunks(PAIR_SPAN).enumerate() {
                let (b0, nb) = (k * PAIR_SPAN / 32, xs.len() / 32);
                let rows =
                    [w[r], w[r + 1]].map(|(p, s)| (&p[16 * b0..16 * (b0 + nb)], &s[b0..b0 + nb]));
                mxfp4_pair(&d, rows, xs, &mut pair, ahead);
            }
            a[r] = [
                _mm256_permute2f128_ps::<0x20>(pair[0], pair[1]),
                _mm256_permute2f128_ps::<0x20>(pair[2], pair[3]),
            ];
            a[r + 1] = [
                _mm256_permute2f128_ps::<0x31>(pair[0], pair[1]),
                _mm256_permute2f128_ps::<0x31>(pair[2], pair[3]),
            ];
            r += 2;
        }
        if r < R {
            let (packed, scales) = w[r];
            let mut acc = a[r];
            for b in 0..blocks {
                let wv = d.fast(&packed[16 * b..16 * b + 16], scales[b]);
                for (k, v) in wv.into_iter().enumerate() {
                    // SAFETY: `32 * b + 8 * k + 8 <= x.len()`.
                    let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(32 * b + 8 * k)) };
                    acc[k % 2] = _mm256_fmadd_ps(v, xv, acc[k % 2]);
                }
            }
            a[r] = acc;
        }
    }

    /// Columns per [`mxfp4_pair`] call (its scale factors live on the stack).
    const PAIR_SPAN: usize = 1024;

    /// Byte-shuffle indices that place bytes `4i .. 4i + 4` of each 128-bit lane in the top bytes
    /// of the lane's four dwords (the same indices in both lanes).
    const SPREAD4: [[u8; 32]; 4] = [spread4(0), spread4(4), spread4(8), spread4(12)];

    /// Dword `d` of each lane takes byte `first + d` in its top byte; index 0x80 zeroes a byte.
    const fn spread4(first: u8) -> [u8; 32] {
        let mut t = [0x80u8; 32];
        let mut d: u8 = 0;
        while d < 8 {
            t[4 * d as usize + 3] = first + d % 4;
            d += 1;
        }
        t
    }

    /// Two MXFP4 rows against one activation row, with row a in the low 128-bit lane of every
    /// register and row b in the high one: the nibble split, the table lookup and the interleave
    /// then serve both rows at once, and each spread yields four columns of both rows. The
    /// accumulators are `[a lanes 4k..4k + 4 | b lanes 4k..4k + 4]` for `k < 4`; activations are
    /// broadcast to both lanes four at a time. Values equal [`Decoder::fast`]'s. Each 64 bytes of
    /// a row consumed prefetch a line `ahead` bytes on.
    #[target_feature(enable = "avx2,fma")]
    fn mxfp4_pair(
        d: &Decoder,
        w: [(&[u8], &[u8]); 2],
        x: &[f32],
        acc: &mut [__m256; 4],
        ahead: usize,
    ) {
        let blocks = x.len() / 32;
        assert!(x.len().is_multiple_of(32) && blocks <= PAIR_SPAN / 32);
        assert!(w.iter().all(|(p, s)| p.len() == 16 * blocks && s.len() == blocks));
        debug_assert!(w.iter().all(|(_, s)| all_fast(s)));
        // 2^(s − 152) per block and row (exponent field s − 25), built with integer instructions
        // up front so that each block's scale vector is two broadcast loads and one insert rather
        // than two moves from general registers and two shuffles.
        let mut factors = [[0.0f32; PAIR_SPAN / 32]; 2];
        for (f, (_, scales)) in factors.iter_mut().zip(&w) {
            for (fb, &s) in f.iter_mut().zip(*scales) {
                *fb = f32::from_bits(u32::from(s.wrapping_sub(25)) << 23);
            }
        }
        // SAFETY: the tables are 32 bytes each.
        let spread = unsafe { SPREAD4.map(|t| _mm256_loadu_si256(t.as_ptr().cast())) };
        let [(pa, _), (pb, _)] = w;
        // A local copy, so that the accumulators stay in registers across the loop.
        let mut a = *acc;
        let [fa, fb] = &factors;
        for (b, (fa, fb)) in fa.iter().zip(fb).enumerate().take(blocks) {
            if b.is_multiple_of(4) {
                // The next tile's bytes at this column (see `tile_ahead`).
                prefetch_line(pa.as_ptr().wrapping_add(16 * b + ahead));
                prefetch_line(pb.as_ptr().wrapping_add(16 * b + ahead));
            }
            // SAFETY: block `b < blocks` owns bytes `16 * b..16 * b + 16` of each row.
            let bytes = unsafe {
                _mm256_loadu2_m128i(pb.as_ptr().add(16 * b).cast(), pa.as_ptr().add(16 * b).cast())
            };
            let scale = _mm256_setr_m128(_mm_broadcast_ss(fa), _mm_broadcast_ss(fb));
            let lo = _mm256_shuffle_epi8(d.0.table, _mm256_and_si256(bytes, d.0.low));
            let hi = _mm256_shuffle_epi8(
                d.0.table,
                _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), d.0.low),
            );
            // Per lane: columns 0–15, then 16–31, of that lane's row.
            let halves = [_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)];
            for g in 0..8 {
                let q = _mm256_shuffle_epi8(halves[g / 4], spread[g % 4]);
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
                // SAFETY: `32 * b + 4 * g + 4 <= x.len()`.
                let xv = unsafe {
                    _mm256_broadcast_ps(&*x.as_ptr().add(32 * b + 4 * g).cast::<__m128>())
                };
                a[g % 4] = _mm256_fmadd_ps(v, xv, a[g % 4]);
            }
        }
        *acc = a;
    }

    /// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each (any scale).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn mxfp4s(packed: &[u8], scales: &[u8], out: &mut [f32]) {
        assert!(packed.len() == 16 * scales.len() && out.len() == 32 * scales.len());
        let d = Decoder::new();
        for (b, &s) in scales.iter().enumerate() {
            let (p, o) = (&packed[16 * b..16 * b + 16], &mut out[32 * b..32 * b + 32]);
            if !FAST.contains(&s) {
                slow_block(p, s, o);
                continue;
            }
            for (k, v) in d.fast(p, s).into_iter().enumerate() {
                // SAFETY: `o` holds 32 f32 and `8 * k + 8 <= 32`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), v) };
            }
        }
    }

    /// The MXFP4 decode on AVX2: [`NibbleDecoder`] over `2 · E2M1`.
    struct Decoder(NibbleDecoder);

    impl Decoder {
        #[target_feature(enable = "avx2,fma")]
        fn new() -> Self {
            Self(NibbleDecoder::new(&E2M1_X2))
        }

        /// One block (16 packed bytes, scale byte `s` in the fast range) → columns 0–7, 8–15,
        /// 16–23, 24–31.
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        fn fast(&self, packed: &[u8], s: u8) -> [__m256; 4] {
            debug_assert!(FAST.contains(&s));
            // 2^(s − 152): exponent field s − 25 in 1..=229, a normal f32.
            let scale = _mm256_set1_ps(f32::from_bits(u32::from(s.wrapping_sub(25)) << 23));
            self.0.top_bytes(packed).map(|q| _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale))
        }
    }

    /// One block with an out-of-range scale, by the reference's expression.
    #[cold]
    fn slow_block(packed: &[u8], s: u8, out: &mut [f32]) {
        let scale = e8m0_to_f32(s);
        for (pair, &b) in out.chunks_exact_mut(2).zip(packed) {
            pair[0] = E2M1[usize::from(b & 0x0F)] * scale;
            pair[1] = E2M1[usize::from(b >> 4)] * scale;
        }
    }
}

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
