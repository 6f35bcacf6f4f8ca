//! The AVX-512 side of [`super`]'s MXFP4 kernels: the one-row fold and the block decode the
//! wide nest's panel uses. `vpermps` over the 16 E2M1 values scaled by the block's
//! `e8m0_to_f32(s)`, its indices made by one `vpmultishiftqb` per 16 columns where the CPU has
//! AVX-512 VBMI, else by byte unpacks and a widening (see the parent module's docs).

use super::{e8m0_to_f32, E2M1};
use crate::arch::prefetch_line;
use core::arch::x86_64::*;

/// Whether the CPU has AVX-512 VBMI, checked once per call (std caches the detection).
#[inline]
pub(super) fn vbmi() -> bool {
    is_x86_feature_detected!("avx512vbmi")
}

/// `vpmultishiftqb` control: in each qword `q` (dword lanes `2q`, `2q + 1`), byte 0 takes
/// the bits from offset `8q` (byte `q`'s low nibble) and byte 4 those from `8q + 4` (its
/// high nibble), of a qword that holds a half block's 8 packed bytes.
const NIBBLE_SHIFTS: [u8; 64] = {
    let mut c = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        // Byte 0 of qword q takes offset 8q, byte 4 offset 8q + 4 (i = 8q + 4).
        if i % 8 == 0 || i % 8 == 4 {
            c[i] = [0, 8, 16, 24, 32, 40, 48, 56][i / 8] + [0, 4][i % 8 / 4];
        }
        i += 1;
    }
    c
};

/// The control vector of [`indices_vbmi`].
#[target_feature(enable = "avx512f")]
#[inline]
fn nibble_shifts() -> __m512i {
    // SAFETY: `NIBBLE_SHIFTS` holds 64 bytes.
    unsafe { _mm512_loadu_si512(NIBBLE_SHIFTS.as_ptr().cast()) }
}

/// A block's 16 packed bytes → the `vpermps` indices of columns 0–15 and 16–31 (each
/// lane's nibble in bits 0–3; `vpermps` ignores the bits above), on AVX-512F: the bytes
/// interleaved with themselves shifted right by 4 (column `c`'s nibble in the low bits of
/// byte `c`), widened to dwords: three shuffle-port operations for every 16 columns.
/// `_ctl` is unused (the VBMI version's signature).
#[target_feature(enable = "avx512f")]
#[inline]
fn indices_unpack(_ctl: __m512i, packed: &[u8]) -> [__m512i; 2] {
    assert_eq!(packed.len(), 16);
    // SAFETY: `packed` is 16 bytes (asserted).
    let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().cast()) };
    let shifted = _mm_srli_epi16::<4>(bytes);
    [
        _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, shifted)),
        _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(bytes, shifted)),
    ]
}

/// [`indices_unpack`] on AVX-512 VBMI: each half block's 8 bytes broadcast to every qword
/// (a load, no shuffle) and one `vpmultishiftqb` by `ctl` ([`NIBBLE_SHIFTS`]) that moves
/// each lane's nibble to the lane's low bits.
#[target_feature(enable = "avx512f,avx512vbmi")]
#[inline]
fn indices_vbmi(ctl: __m512i, packed: &[u8]) -> [__m512i; 2] {
    let half = |o: usize| {
        let mut q = [0u8; 8];
        q.copy_from_slice(&packed[o..o + 8]);
        _mm512_multishift_epi64_epi8(ctl, _mm512_set1_epi64(i64::from_le_bytes(q)))
    };
    [half(0), half(8)]
}

/// One block's 32 columns from its indices: the 16 E2M1 values times `e8m0_to_f32(s)`
/// (one multiplication per value, the reference's expression), then permuted. Scaling the
/// table before the permutation multiplies the same pairs as scaling after it, so the bits
/// are the same, at one multiplication per block instead of two.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_block(lut: __m512, idx: [__m512i; 2], s: u8) -> [__m512; 2] {
    let scaled = _mm512_mul_ps(lut, _mm512_set1_ps(e8m0_to_f32(s)));
    [_mm512_permutexvar_ps(idx[0], scaled), _mm512_permutexvar_ps(idx[1], scaled)]
}

/// The one-row fold and the block decode, compiled once per way of making indices (the
/// index function is inlined into each, with its own CPU features).
macro_rules! mxfp4_kernels {
    ($one:ident, $blocks:ident, $features:literal, $indices:ident) => {
        /// MXFP4 rows against one activation row, a block at a time, decoded as the
        /// block decode of the same indices decodes.
        #[target_feature(enable = $features)]
        fn $one<const R: usize>(
            w: [(&[u8], &[u8]); R],
            x: &[f32],
            a: &mut [__m512; R],
            ahead: usize,
        ) {
            let blocks = x.len() / 32;
            assert!(x.len().is_multiple_of(32));
            assert!(w.iter().all(|(p, s)| p.len() == 16 * blocks && s.len() == blocks));
            let ctl = nibble_shifts();
            // SAFETY: `E2M1` holds 16 f32.
            let lut = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
            for b in 0..blocks {
                if b.is_multiple_of(4) {
                    for (packed, _) in &w {
                        prefetch_line(packed.as_ptr().wrapping_add(16 * b + ahead));
                    }
                }
                // SAFETY: `32 * b + 32 <= x.len()`.
                let xv = unsafe {
                    [
                        _mm512_loadu_ps(x.as_ptr().add(32 * b)),
                        _mm512_loadu_ps(x.as_ptr().add(32 * b + 16)),
                    ]
                };
                for ((packed, scales), ar) in w.iter().zip(a.iter_mut()) {
                    let idx = $indices(ctl, &packed[16 * b..16 * b + 16]);
                    let wv = decode_block(lut, idx, scales[b]);
                    *ar = _mm512_fmadd_ps(wv[0], xv[0], *ar);
                    *ar = _mm512_fmadd_ps(wv[1], xv[1], *ar);
                }
            }
        }

        /// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each.
        #[target_feature(enable = $features)]
        fn $blocks(packed: &[u8], scales: &[u8], out: &mut [f32]) {
            assert!(packed.len() == 16 * scales.len() && out.len() == 32 * scales.len());
            let ctl = nibble_shifts();
            // SAFETY: `E2M1` holds 16 f32.
            let lut = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
            for (b, &s) in scales.iter().enumerate() {
                let [lo, hi] = decode_block(lut, $indices(ctl, &packed[16 * b..16 * b + 16]), s);
                // SAFETY: `32 * b + 32 <= out.len()`.
                unsafe {
                    _mm512_storeu_ps(out.as_mut_ptr().add(32 * b), lo);
                    _mm512_storeu_ps(out.as_mut_ptr().add(32 * b + 16), hi);
                }
            }
        }
    };
}

mxfp4_kernels!(one_unpack, blocks_unpack, "avx512f", indices_unpack);
mxfp4_kernels!(one_vbmi, blocks_vbmi, "avx512f,avx512vbmi", indices_vbmi);

/// MXFP4 rows against one activation row, a block at a time, decoded as [`mxfp4s`]
/// decodes: on AVX-512 VBMI where the CPU has it.
#[target_feature(enable = "avx512f")]
pub(super) fn mxfp4_one<const R: usize>(
    w: [(&[u8], &[u8]); R],
    x: &[f32],
    a: &mut [__m512; R],
    ahead: usize,
) {
    if vbmi() {
        // SAFETY: the CPU has AVX-512F (this function's feature) and VBMI (checked).
        unsafe { one_vbmi(w, x, a, ahead) }
    } else {
        one_unpack(w, x, a, ahead);
    }
}

/// MXFP4 blocks: 16 packed bytes and one scale byte → 32 f32 each (on AVX-512 VBMI where
/// the CPU has it).
#[target_feature(enable = "avx512f")]
pub(super) fn mxfp4s(packed: &[u8], scales: &[u8], out: &mut [f32]) {
    if vbmi() {
        // SAFETY: the CPU has AVX-512F (this function's feature) and VBMI (checked).
        unsafe { blocks_vbmi(packed, scales, out) }
    } else {
        blocks_unpack(packed, scales, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both index paths decode every nibble in every position under every scale byte to
    /// the same bits (the tier tests reach only the path this CPU takes).
    #[test]
    fn vbmi_and_unpack_decode_every_block_alike() {
        if !(is_x86_feature_detected!("avx512f") && vbmi()) {
            return;
        }
        let packed: Vec<u8> =
            (0..256 * 16u32).map(|i| (i * 37 + i / 16).to_le_bytes()[0]).collect();
        let scales: Vec<u8> = (0..=255).collect();
        let (mut a, mut b) = (vec![0.0f32; 256 * 32], vec![0.0f32; 256 * 32]);
        // SAFETY: AVX-512F and VBMI are present (checked above).
        unsafe {
            blocks_unpack(&packed, &scales, &mut a);
            blocks_vbmi(&packed, &scales, &mut b);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
    }
}
