//! MXFP4 on AVX2 ([`super`]'s module docs say why the values are exact): the nibble decode
//! over `2 · E2M1` through [`NibbleDecoder`], the one-row fold (two rows a pass, one in each
//! 128-bit lane), the blocks of the few-row nest's nibble tile
//! (`arch::avx2::fold_nibble_tile`), and the buffered decode of any scale.

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
    let (lo, hi) = scales.iter().fold((u8::MAX, u8::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
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
fn mxfp4_pair(d: &Decoder, w: [(&[u8], &[u8]); 2], x: &[f32], acc: &mut [__m256; 4], ahead: usize) {
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
            *fb = fast_factor(s);
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
            let xv =
                unsafe { _mm256_broadcast_ps(&*x.as_ptr().add(32 * b + 4 * g).cast::<__m128>()) };
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

/// MXFP4 blocks for the AVX2 nibble tile: [`Decoder::fast`]'s values.
pub(super) struct Blocks;

impl crate::arch::avx2::NibbleBlocks for Blocks {
    const TABLE: [i8; 16] = E2M1_X2;

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block(d: &NibbleDecoder, packed: &[u8], scales: &[u8], b: usize) -> [__m256; 4] {
        fast_block(d, packed, scales[b])
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
        fast_block(&self.0, packed, s)
    }
}

/// `2^(s − 152)` for a scale byte `s` in the fast range: exponent field `s − 25` in 1..=229,
/// a normal f32 (see the module docs).
#[inline]
fn fast_factor(s: u8) -> f32 {
    debug_assert!(FAST.contains(&s));
    f32::from_bits(u32::from(s.wrapping_sub(25)) << 23)
}

/// One block (16 packed bytes, scale byte `s` in the fast range) → columns 0–7, 8–15, 16–23,
/// 24–31: the one-row fold's values, the nibble tile's and the buffered decode's.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fast_block(d: &NibbleDecoder, packed: &[u8], s: u8) -> [__m256; 4] {
    let scale = _mm256_set1_ps(fast_factor(s));
    d.top_bytes(packed).map(|q| _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale))
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
