//! The AVX-512 side of [`super`]'s MXFP4 kernels: the one-row fold, the block decode the
//! wide nest's panel uses, and the tile that folds a few activation rows straight from the
//! stored nibbles ([`nibble_tile`], which INT4 groups share: the same nibble order and
//! 32-column blocks, another table and scale). `vpermps` over the 16 E2M1 values scaled by the block's
//! `e8m0_to_f32(s)`, its indices made by one `vpmultishiftqb` per 16 columns where the CPU has
//! AVX-512 VBMI, else by byte unpacks and a widening (see the parent module's docs).

use super::{E2M1, E8M0};
use crate::arch::avx512::{load_tile, store_tile};
use crate::arch::prefetch_line;
use crate::tiled::Lanes;
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

/// The factor of a block whose scale byte is `s[0]`, as the tile takes it ([`nibble_rows_tile`]'s
/// `factor`): [`E8M0`]'s entry, the reference's `e8m0_to_f32`.
#[inline]
pub(super) fn factor(s: &[u8]) -> f32 {
    E8M0[usize::from(s[0])]
}

/// One block's 32 columns from its indices: the 16 E2M1 values times `e8m0_to_f32(s)`
/// (one multiplication per value, the reference's expression), then permuted. Scaling the
/// table before the permutation multiplies the same pairs as scaling after it, so the bits
/// are the same, at one multiplication per block instead of two.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_block(lut: __m512, idx: [__m512i; 2], s: u8) -> [__m512; 2] {
    let scaled = _mm512_mul_ps(lut, _mm512_set1_ps(E8M0[usize::from(s)]));
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

/// The `vpermps` indices of the 16 columns whose 8 packed bytes are at `p` (half a block),
/// as [`indices_unpack`] makes them: the bytes interleaved with themselves shifted right by 4,
/// widened to dwords.
///
/// # Safety
/// `p` points at 8 readable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn half_unpack(_ctl: __m512i, p: *const u8) -> __m512i {
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { _mm_loadl_epi64(p.cast()) };
    _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16::<4>(bytes)))
}

/// The `vpermps` indices of the 16 columns whose 8 packed bytes are at `p`, as
/// [`indices_vbmi`] makes them (the 8 bytes broadcast, one `vpmultishiftqb` by `ctl`).
///
/// # Safety
/// `p` points at 8 readable bytes.
#[target_feature(enable = "avx512f,avx512vbmi")]
#[inline]
unsafe fn half_vbmi(ctl: __m512i, p: *const u8) -> __m512i {
    // SAFETY: guaranteed by the caller.
    let q = unsafe { p.cast::<i64>().read_unaligned() };
    _mm512_multishift_epi64_epi8(ctl, _mm512_set1_epi64(i64::from_le(q)))
}

/// Blocks a tile's per-row scale factors are computed for at a time (a stack array).
const TILE_SPAN_BLOCKS: usize = 32;

/// The tile fold of [`nibble_tile`], compiled once per way of making indices.
macro_rules! nibble_tiles {
    ($tile:ident, $features:literal, $half:ident) => {
        /// `R` rows of 4-bit codes in 32-column blocks against `N` activation rows, 16
        /// columns (half a block) at a time: each row's 16 values decoded in a register and
        /// folded against the `N` activation vectors. The table is permuted first and the 16
        /// values then multiplied by the block's factor: for MXFP4 the same pairs as
        /// [`decode_block`] multiplies, so the same bits, and no scaled table per row to keep
        /// (scaled tables held across both halves, as the compiler kept them, left too few
        /// registers for the 24 accumulators, which it then loaded and stored around every
        /// FMA). `factor` is a closure the tile is compiled for, inlined: passed as a
        /// function pointer it was an indirect call per block and row, which took about half
        /// of an MXFP4 tile's time at 2 activation rows on a Zen 5 (docs/PERFORMANCE.md,
        /// session 26). With `PF`, each 64 packed bytes read name a line `ahead` bytes on, and the
        /// rows' scales `ahead / 16 · SB` on (the same span of the next rows).
        #[target_feature(enable = $features)]
        fn $tile<const R: usize, const N: usize, const PF: bool, const SB: usize>(
            table: &[f32; 16],
            factor: impl Fn(&[u8]) -> f32 + Copy,
            w: [(&[u8], &[u8]); R],
            x: [&[f32]; N],
            acc: [&mut [Lanes; N]; R],
            ahead: usize,
        ) {
            let len = x.first().map_or(0, |s| s.len());
            let blocks = len / 32;
            assert!(len.is_multiple_of(32) && x.iter().all(|x| x.len() == len), "nibble tile");
            assert!(w.iter().all(|(p, s)| p.len() == 16 * blocks && s.len() == SB * blocks));
            let ctl = nibble_shifts();
            // SAFETY: `table` holds 16 f32.
            let lut = unsafe { _mm512_loadu_ps(table.as_ptr()) };
            let mut a = load_tile(&acc);
            if PF && blocks > 0 {
                for (_, s) in &w {
                    let p = s.as_ptr().wrapping_add(ahead / 16 * SB);
                    prefetch_line(p);
                    prefetch_line(p.wrapping_add(SB * blocks - 1));
                }
            }
            let pp: [*const u8; R] = std::array::from_fn(|r| w[r].0.as_ptr());
            let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
            let mut factors = [[0.0f32; TILE_SPAN_BLOCKS]; R];
            for b0 in (0..blocks).step_by(TILE_SPAN_BLOCKS) {
                let nb = TILE_SPAN_BLOCKS.min(blocks - b0);
                for (f, (_, s)) in factors.iter_mut().zip(&w) {
                    let s = &s[SB * b0..SB * (b0 + nb)];
                    for (fb, s) in f.iter_mut().zip(s.chunks_exact(SB)) {
                        *fb = factor(s);
                    }
                }
                // One 16-column step per iteration, the same code for both halves of a
                // block (unrolled by halves, the compiler kept each row's factor in a
                // register across them and spilled accumulators).
                for c in (32 * b0..32 * (b0 + nb)).step_by(16) {
                    if PF && c.is_multiple_of(128) {
                        for p in pp {
                            prefetch_line(p.wrapping_add(c / 2 + ahead));
                        }
                    }
                    let wv: [__m512; R] = std::array::from_fn(|r| {
                        // SAFETY: column `c < len` and the 15 after it lie in the row's
                        // `len / 2` packed bytes (asserted), 8 bytes from `c / 2`.
                        let idx = unsafe { $half(ctl, pp[r].add(c / 2)) };
                        let f = _mm512_set1_ps(factors[r][c / 32 - b0]);
                        _mm512_mul_ps(_mm512_permutexvar_ps(idx, lut), f)
                    });
                    for (j, &xj) in xp.iter().enumerate() {
                        // SAFETY: `c + 16 <= len`, each `x[j]`'s length.
                        let xv = unsafe { _mm512_loadu_ps(xj.add(c)) };
                        for (v, ar) in wv.iter().zip(a.iter_mut()) {
                            ar[j] = _mm512_fmadd_ps(*v, xv, ar[j]);
                        }
                    }
                }
            }
            store_tile(&a, acc);
        }
    };
}

nibble_tiles!(tile_unpack, "avx512f", half_unpack);
nibble_tiles!(tile_vbmi, "avx512f,avx512vbmi", half_vbmi);

/// `R` rows of 4-bit codes, low nibble first, in 32-column blocks with `SB` scale bytes
/// each (each row the span's packed bytes and scales), against `N` activation rows, folded
/// from the stored bytes (see [`crate::formats::Format::avx512_tile`]): code `k` of a block
/// folds as `table[k] · factor(block's scale bytes)`, one rounding. MXFP4 (E2M1 values and
/// E8M0 scales) and INT4 groups (`k − 8` and bf16 scales) share it. On AVX-512 VBMI where the
/// CPU has it; `ahead != 0` names the bytes `ahead` on to the prefetcher.
#[target_feature(enable = "avx512f")]
fn nibble_tile<const R: usize, const N: usize, const SB: usize>(
    table: &[f32; 16],
    factor: impl Fn(&[u8]) -> f32 + Copy,
    w: [(&[u8], &[u8]); R],
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let (t, f) = (table, factor);
    match (vbmi(), ahead != 0) {
        // SAFETY: the CPU has AVX-512F (this function's feature) and VBMI (checked).
        (true, true) => unsafe { tile_vbmi::<R, N, true, SB>(t, f, w, x, acc, ahead) },
        // SAFETY: as above.
        (true, false) => unsafe { tile_vbmi::<R, N, false, SB>(t, f, w, x, acc, 0) },
        (false, true) => tile_unpack::<R, N, true, SB>(t, f, w, x, acc, ahead),
        (false, false) => tile_unpack::<R, N, false, SB>(t, f, w, x, acc, 0),
    }
}

/// [`crate::formats::Format::avx512_tile`] of a format of 4-bit codes in 32-column blocks
/// of `SB` scale bytes each (MXFP4, INT4 groups): `parts(row)` gives a row's packed bytes
/// and scales, whose span's share [`nibble_tile`] folds with `table` and `factor`. A span
/// that does not start and end on a block (never the stored nest's) is decoded into a
/// buffer and folded instead.
///
/// # Safety
/// As [`crate::formats::Format::avx512_tile`].
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn nibble_rows_tile<'a, F, const R: usize, const N: usize, const SB: usize>(
    table: &[f32; 16],
    factor: impl Fn(&[u8]) -> f32 + Copy,
    parts: impl Fn(F::Row<'a>) -> (&'a [u8], &'a [u8]),
    rows: [F::Row<'a>; R],
    c0: usize,
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: usize,
) where
    F: crate::formats::Format,
{
    let n = x.first().map_or(0, |s| s.len());
    if !(c0.is_multiple_of(32) && n.is_multiple_of(32)) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx512::Avx512, F, R, N>(
                rows, c0, x, acc,
            );
        }
        return;
    }
    let (b0, b1) = (c0 / 32, (c0 + n) / 32);
    let w = rows.map(|r| {
        let (packed, scales) = parts(r);
        (&packed[16 * b0..16 * b1], &scales[SB * b0..SB * b1])
    });
    nibble_tile::<R, N, SB>(table, factor, w, x, acc, ahead);
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

    /// Both index paths of the tile fold every nibble under every scale byte (2^-127 and
    /// NaN included) to the same bits, over more than one span of scale factors.
    #[test]
    fn vbmi_and_unpack_tiles_fold_alike() {
        if !(is_x86_feature_detected!("avx512f") && vbmi()) {
            return;
        }
        const R: usize = 3;
        const N: usize = 2;
        let len = 32 * (TILE_SPAN_BLOCKS + 40);
        let packed: Vec<u8> =
            (0..R * len / 2).map(|i| (i * 37 + i / 16).to_le_bytes()[0]).collect();
        let scales: Vec<u8> = (0..R * len / 32).map(|i| (i * 7 + 1).to_le_bytes()[0]).collect();
        let x: Vec<f32> = (0..N * len).map(|i| (i % 97) as f32 / 16.0 - 3.0).collect();
        let fold = |vbmi: bool| {
            let w: [(&[u8], &[u8]); R] = std::array::from_fn(|r| {
                (&packed[r * len / 2..][..len / 2], &scales[r * len / 32..][..len / 32])
            });
            let xs: [&[f32]; N] = std::array::from_fn(|j| &x[j * len..][..len]);
            let mut acc = [[[0.25f32; 16]; N]; R];
            let mut it = acc.iter_mut();
            let a: [&mut [Lanes; N]; R] = std::array::from_fn(|_| it.next().expect("R rows"));
            let f = factor;
            // SAFETY: AVX-512F and VBMI are present (checked above).
            unsafe {
                if vbmi {
                    tile_vbmi::<R, N, true, 1>(&E2M1, f, w, xs, a, 64);
                } else {
                    tile_unpack::<R, N, false, 1>(&E2M1, f, w, xs, a, 0);
                }
            }
            acc.map(|r| r.map(|l| l.map(f32::to_bits)))
        };
        assert_eq!(fold(true), fold(false));
    }
}
