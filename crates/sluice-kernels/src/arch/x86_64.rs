//! AVX-512F and AVX2+FMA bodies of the matmul inner loop.
//!
//! AVX-512 holds a 16-lane accumulator in one register; AVX2 in two (lanes 0–7, 8–15). Weights
//! are widened exactly before the FMA: bf16 by a 16-bit left shift into the high half of each
//! f32 lane, MXFP4 by a table lookup of each nibble (`vpermps` over the 16 E2M1 values on
//! AVX-512; over the 8 magnitudes plus the nibble's bit 3 moved into the sign bit on AVX2)
//! followed by a multiply with the block scale `e8m0_to_f32(s)`, so the FMA operands equal the
//! scalar reference's `E2M1[nib] · e8m0_to_f32(s)` bit for bit. Partial final chunks use masked
//! loads and a masked FMA on AVX-512, and a zero-padded [`Tail`] on AVX2.
//!
//! All loads are unaligned: safetensors offsets carry no alignment. Each body asserts the
//! lengths its pointer arithmetic relies on before its loop.

use super::{by_group_size, Row, Tail};
use crate::matmul::{e8m0_to_f32, reduce16, E2M1};
use core::arch::x86_64::*;

/// AVX-512 dispatch on format and group size. Callers outside AVX-512 code need `unsafe` and
/// must know the CPU supports AVX-512F; the bodies check every length they rely on.
#[target_feature(enable = "avx512f")]
pub(crate) fn avx512_group(row: Row<'_>, cols: usize, x: &[f32], out: &mut [f32]) {
    match row {
        Row::F32(w) => by_group_size!(out, f32_512(w, cols, x)),
        Row::Bf16(w) => by_group_size!(out, bf16_512(w, cols, x)),
        Row::Mxfp4 { packed, scales } => by_group_size!(out, mxfp4_512(packed, scales, cols, x)),
    }
}

/// AVX2 dispatch on format and group size. Callers outside AVX2 code need `unsafe` and must
/// know the CPU supports AVX2 and FMA; the bodies check every length they rely on.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn avx2_group(row: Row<'_>, cols: usize, x: &[f32], out: &mut [f32]) {
    match row {
        Row::F32(_) | Row::Bf16(_) => by_group_size!(out, dense_256(row, cols, x)),
        Row::Mxfp4 { packed, scales } => by_group_size!(out, mxfp4_256(packed, scales, cols, x)),
    }
}

/// Mask of the low `rem` lanes (`0 < rem < 16`).
#[inline]
fn tail_mask(rem: usize) -> __mmask16 {
    u16::MAX >> (16 - rem)
}

/// Reduces each 16-lane accumulator in the canonical tree order.
#[target_feature(enable = "avx512f")]
#[inline]
fn finish_512<const N: usize>(acc: &[__m512; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` has room for 16 f32 and the store is unaligned.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *a) };
        *o = reduce16(lanes);
    }
    out
}

/// Folds one widened 16-column chunk at column `c` into every row's accumulator.
///
/// # Safety
/// `c + 16 <= cols` and `x` holds `N * cols` activations.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold_512<const N: usize>(
    acc: &mut [__m512; N],
    w: __m512,
    x: &[f32],
    cols: usize,
    c: usize,
) {
    for (j, a) in acc.iter_mut().enumerate() {
        // SAFETY: row `j < N` spans `x[j * cols..(j + 1) * cols]` and `c + 16 <= cols`.
        let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(j * cols + c)) };
        *a = _mm512_fmadd_ps(w, xv, *a);
    }
}

/// Folds the final `rem = cols − c` (< 16) columns with masked loads and a masked FMA, which
/// leaves lanes `rem..16` untouched.
#[target_feature(enable = "avx512f")]
#[inline]
fn fold_tail_512<const N: usize>(
    acc: &mut [__m512; N],
    w: __m512,
    x: &[f32],
    cols: usize,
    c: usize,
) {
    let k = tail_mask(cols - c);
    for (j, a) in acc.iter_mut().enumerate() {
        let xs = &x[j * cols + c..(j + 1) * cols];
        // SAFETY: masked-off lanes are neither read nor able to fault; the `cols − c` lanes that
        // are read lie inside `xs`.
        let xv = unsafe { _mm512_maskz_loadu_ps(k, xs.as_ptr()) };
        *a = _mm512_mask3_fmadd_ps(w, xv, *a, k);
    }
}

/// f32 weights on AVX-512.
#[target_feature(enable = "avx512f")]
fn f32_512<const N: usize>(w: &[u8], cols: usize, x: &[f32]) -> [f32; N] {
    assert!(w.len() == 4 * cols && x.len() == N * cols);
    let mut acc = [_mm512_setzero_ps(); N];
    let full = cols - cols % 16;
    for c in (0..full).step_by(16) {
        // SAFETY: `c + 16 <= cols`, so the 64 bytes at `4 * c` lie inside `w`; `x` was checked.
        unsafe { fold_512(&mut acc, _mm512_loadu_ps(w.as_ptr().add(4 * c).cast()), x, cols, c) };
    }
    if full < cols {
        let k = tail_mask(cols - full);
        // SAFETY: only the low `cols − full` lanes are read, and they lie inside `w`.
        let wv = unsafe { _mm512_maskz_loadu_ps(k, w.as_ptr().add(4 * full).cast()) };
        fold_tail_512(&mut acc, wv, x, cols, full);
    }
    finish_512(&acc)
}

/// Sixteen bf16 → f32 by zero-extending to 32 bits and shifting into the high half.
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_bf16_512(v: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
}

/// bf16 weights on AVX-512.
#[target_feature(enable = "avx512f")]
fn bf16_512<const N: usize>(w: &[u8], cols: usize, x: &[f32]) -> [f32; N] {
    assert!(w.len() == 2 * cols && x.len() == N * cols);
    let mut acc = [_mm512_setzero_ps(); N];
    let full = cols - cols % 16;
    for c in (0..full).step_by(16) {
        // SAFETY: `c + 16 <= cols`, so the 32 bytes at `2 * c` lie inside `w`; `x` was checked.
        unsafe {
            let raw = _mm256_loadu_si256(w.as_ptr().add(2 * c).cast());
            fold_512(&mut acc, widen_bf16_512(raw), x, cols, c);
        }
    }
    if full < cols {
        // A byte-masked load would need AVX-512BW; the tail is copied to the stack instead.
        let mut buf = [0u8; 32];
        buf[..w.len() - 2 * full].copy_from_slice(&w[2 * full..]);
        // SAFETY: `buf` is 32 bytes.
        let raw = unsafe { _mm256_loadu_si256(buf.as_ptr().cast()) };
        fold_tail_512(&mut acc, widen_bf16_512(raw), x, cols, full);
    }
    finish_512(&acc)
}

/// MXFP4 weights on AVX-512: one 16-byte load per 32-column block.
#[target_feature(enable = "avx512f")]
fn mxfp4_512<const N: usize>(packed: &[u8], scales: &[u8], cols: usize, x: &[f32]) -> [f32; N] {
    assert!(cols.is_multiple_of(32) && packed.len() == cols / 2 && scales.len() == cols / 32);
    assert!(x.len() == N * cols);
    // SAFETY: `E2M1` holds 16 f32.
    let lut = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, &s) in scales.iter().enumerate() {
        let scale = _mm512_set1_ps(e8m0_to_f32(s));
        // SAFETY: block `b < cols / 32` owns bytes `16 * b..16 * b + 16` of `packed`.
        let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().add(16 * b).cast()) };
        // Byte i of `bytes` holds columns 2i (low nibble) and 2i + 1 (high nibble). Interleaving
        // the bytes with themselves shifted right by 4 puts column c's nibble in the low 4 bits
        // of byte c; the high 4 bits are junk that `vpermps` ignores (it reads index bits 0–3).
        let shifted = _mm_srli_epi16::<4>(bytes);
        let halves = [_mm_unpacklo_epi8(bytes, shifted), _mm_unpackhi_epi8(bytes, shifted)];
        for (h, nibbles) in halves.into_iter().enumerate() {
            let wv = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nibbles), lut);
            let c = 32 * b + 16 * h;
            // SAFETY: `c + 16 <= cols` and `x` was checked.
            unsafe { fold_512(&mut acc, _mm512_mul_ps(wv, scale), x, cols, c) };
        }
    }
    finish_512(&acc)
}

/// Reduces each pair of 8-lane accumulators (lanes 0–7, 8–15) in the canonical tree order.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish_256<const N: usize>(acc: &[[__m256; 2]; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for (o, [lo, hi]) in out.iter_mut().zip(acc) {
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` has room for 16 f32 and both stores are unaligned.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), *lo);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), *hi);
        }
        *o = reduce16(lanes);
    }
    out
}

/// Folds one widened 16-column chunk into every row's accumulator pair.
///
/// # Safety
/// `c + 16 <= stride` and `x` holds `N * stride` activations (`stride` is `cols`, or 16 for a
/// padded [`Tail`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fold_256<const N: usize>(
    acc: &mut [[__m256; 2]; N],
    w: [__m256; 2],
    x: *const f32,
    stride: usize,
    c: usize,
) {
    for (j, [lo, hi]) in acc.iter_mut().enumerate() {
        // SAFETY: the caller guarantees 16 activations at `j * stride + c`.
        let (xl, xh) = unsafe {
            let p = x.add(j * stride + c);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        };
        *lo = _mm256_fmadd_ps(w[0], xl, *lo);
        *hi = _mm256_fmadd_ps(w[1], xh, *hi);
    }
}

/// f32 and bf16 weights on AVX2.
#[target_feature(enable = "avx2,fma")]
fn dense_256<const N: usize>(row: Row<'_>, cols: usize, x: &[f32]) -> [f32; N] {
    row.assert_cols(cols);
    assert!(x.len() == N * cols);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let full = cols - cols % 16;
    match row {
        Row::F32(w) => {
            for c in (0..full).step_by(16) {
                // SAFETY: `c + 16 <= cols` and `w` holds `4 * cols` bytes (checked above),
                // so both loads lie inside `w`; `x` was checked.
                unsafe {
                    let p = w.as_ptr().add(4 * c).cast::<f32>();
                    let wv = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
                    fold_256(&mut acc, wv, x.as_ptr(), cols, c);
                }
            }
        }
        Row::Bf16(w) => {
            for c in (0..full).step_by(16) {
                // SAFETY: `c + 16 <= cols` and `w` holds `2 * cols` bytes (checked above),
                // so both loads lie inside `w`; `x` was checked.
                unsafe {
                    let p = w.as_ptr().add(2 * c).cast::<__m128i>();
                    let wv = [
                        widen_bf16_256(_mm_loadu_si128(p)),
                        widen_bf16_256(_mm_loadu_si128(p.add(1))),
                    ];
                    fold_256(&mut acc, wv, x.as_ptr(), cols, c);
                }
            }
        }
        Row::Mxfp4 { .. } => unreachable!("dense body called on an MXFP4 row"),
    }
    if full < cols {
        let tail = Tail::<N>::new(row, cols, full, x);
        // SAFETY: `tail.w` is 16 f32 and `tail.x` is `N` contiguous rows of 16 f32.
        unsafe {
            let w = [_mm256_loadu_ps(tail.w.as_ptr()), _mm256_loadu_ps(tail.w.as_ptr().add(8))];
            fold_256(&mut acc, w, tail.x.as_ptr().cast(), 16, 0);
        }
    }
    finish_256(&acc)
}

/// Eight bf16 → f32 by zero-extending to 32 bits and shifting into the high half.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn widen_bf16_256(v: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

/// Eight nibbles (low 4 bits of each of the low 8 bytes of `nibbles`) → E2M1 × scale.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode8_256(nibbles: __m128i, magnitudes: __m256, scale: __m256) -> __m256 {
    let idx = _mm256_cvtepu8_epi32(nibbles);
    // `vpermps` reads index bits 0–2 (the magnitude); shifting left by 28 moves bit 3 (the
    // sign) to bit 31 and drops the junk bits 4–7.
    let mag = _mm256_permutevar8x32_ps(magnitudes, idx);
    let sign =
        _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)), _mm256_set1_ps(-0.0));
    _mm256_mul_ps(_mm256_xor_ps(mag, sign), scale)
}

/// MXFP4 weights on AVX2.
#[target_feature(enable = "avx2,fma")]
fn mxfp4_256<const N: usize>(packed: &[u8], scales: &[u8], cols: usize, x: &[f32]) -> [f32; N] {
    assert!(cols.is_multiple_of(32) && packed.len() == cols / 2 && scales.len() == cols / 32);
    assert!(x.len() == N * cols);
    // SAFETY: `E2M1` holds 16 f32; its first 8 are the non-negative magnitudes.
    let magnitudes = unsafe { _mm256_loadu_ps(E2M1.as_ptr()) };
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    for (b, &s) in scales.iter().enumerate() {
        let scale = _mm256_set1_ps(e8m0_to_f32(s));
        // SAFETY: block `b < cols / 32` owns bytes `16 * b..16 * b + 16` of `packed`.
        let bytes = unsafe { _mm_loadu_si128(packed.as_ptr().add(16 * b).cast()) };
        // Same interleave as the AVX-512 body: byte c of a half holds column c's nibble.
        let shifted = _mm_srli_epi16::<4>(bytes);
        let halves = [_mm_unpacklo_epi8(bytes, shifted), _mm_unpackhi_epi8(bytes, shifted)];
        for (h, nibbles) in halves.into_iter().enumerate() {
            let w = [
                decode8_256(nibbles, magnitudes, scale),
                decode8_256(_mm_srli_si128::<8>(nibbles), magnitudes, scale),
            ];
            // SAFETY: `32 * b + 16 * h + 16 <= cols` and `x` was checked.
            unsafe { fold_256(&mut acc, w, x.as_ptr(), cols, 32 * b + 16 * h) };
        }
    }
    finish_256(&acc)
}
