//! The AVX2 tile of the few-row nest ([`crate::stored`]): a tile of weight rows folded
//! straight from their stored bytes against a few activation rows, each 8 columns widened in
//! a register as the tile reads them (bf16, row int8, f32: [`Widen8`]).
//!
//! A 16-lane accumulator is two 8-lane registers here, so a tile of 2 weight rows × 3
//! activation rows holds 12 accumulator registers, and each 16-column step folds one 8-lane
//! half at a time: the half's 2 weights widened (2 registers), then each activation half
//! loaded (1 register) against both, 15 of the 16 registers. Per step that is 4 widening
//! loads, 6 activation loads and 12 FMAs, where the buffered few-row nest stored every
//! widened weight into a buffer and loaded it back before folding it (the AVX2 tier at 2
//! rows ran slower than at 1, measured in docs/PERFORMANCE.md, session 26).
//!
//! **Exactness**: each lane takes the FMAs of the panel's fold, in the same order (the
//! widened values are the format's `fold_values`), so a result does not depend on the nest.

use super::{load2, store2, Acc2, NibbleDecoder};
use crate::tiled::Lanes;
use core::arch::x86_64::*;

/// A weight format whose 8 consecutive columns widen to f32 in one register on AVX2 (bf16,
/// int8 rows, f32): what [`fold_stored_tile`] needs of it.
pub(crate) trait Widen8 {
    /// Stored bytes per column.
    const BYTES: usize;

    /// The 8 columns whose stored bytes start at `p`, as the format's `fold_values` widens
    /// them (the values its panel would hold).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `p` points at `8 * BYTES` readable bytes.
    unsafe fn widen8(p: *const u8) -> __m256;
}

/// [`crate::formats::Format::avx2_tile`] of a format stored as `W`: `R` rows (each the whole
/// row's bytes) against `N` activation rows, folded from the stored bytes of the span from
/// column `c0` (as long as every `x[j]`), one 8-lane half of each 16-column step at a time.
/// When `ahead` is not 0, each row's bytes `ahead` on from its span are named to the
/// prefetcher, a line per 64 bytes read.
///
/// # Panics
/// If the span does not lie inside a row, the `x[j]` differ in length, or their length is not
/// a multiple of 16.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fold_stored_tile<W: Widen8, const R: usize, const N: usize>(
    rows: [&[u8]; R],
    c0: usize,
    x: [&[f32]; N],
    acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let n = x.first().map_or(0, |s| s.len());
    let w = rows.map(|w| &w[W::BYTES * c0..W::BYTES * (c0 + n)]);
    if ahead == 0 {
        stored_tile::<W, R, N, false>(w, x, acc, 0);
    } else {
        stored_tile::<W, R, N, true>(w, x, acc, ahead);
    }
}

/// [`fold_stored_tile`]'s loop, naming `ahead` to the prefetcher when `PF`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn stored_tile<W: Widen8, const R: usize, const N: usize, const PF: bool>(
    w: [&[u8]; R],
    x: [&[f32]; N],
    mut acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let len = x.first().map_or(0, |s| s.len());
    assert!(len.is_multiple_of(16), "stored tile span");
    assert!(w.iter().all(|w| w.len() == W::BYTES * len) && x.iter().all(|x| x.len() == len));
    let mut a: [Acc2<N>; R] = std::array::from_fn(|r| load2(&acc[r].each_mut()));
    let wp: [*const u8; R] = std::array::from_fn(|r| w[r].as_ptr());
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    for c in (0..len).step_by(16) {
        if PF && (W::BYTES * c).is_multiple_of(64) {
            for p in wp {
                crate::arch::prefetch_line(p.wrapping_add(W::BYTES * c + ahead));
            }
        }
        for h in 0..2 {
            let ch = c + 8 * h;
            // SAFETY: the CPU has AVX2 and FMA (this function's features); `ch + 8 <= len`
            // and each row holds `BYTES * len` bytes (asserted), so the 8 columns at `ch`
            // lie inside it.
            let wv: [__m256; R] =
                std::array::from_fn(|r| unsafe { W::widen8(wp[r].add(W::BYTES * ch)) });
            for (j, &xj) in xp.iter().enumerate() {
                // SAFETY: `ch + 8 <= len`, each `x[j]`'s length (asserted).
                let xv = unsafe { _mm256_loadu_ps(xj.add(ch)) };
                for (v, ar) in wv.iter().zip(a.iter_mut()) {
                    ar[j][h] = _mm256_fmadd_ps(*v, xv, ar[j][h]);
                }
            }
        }
    }
    for (ar, lanes_r) in a.iter().zip(acc) {
        store2(ar, lanes_r.each_mut());
    }
}

/// A weight format of 32-column blocks of 16 packed nibble bytes that [`NibbleDecoder`]
/// widens (MXFP4, INT4 groups): what [`fold_nibble_tile`] needs of it.
pub(crate) trait NibbleBlocks {
    /// The decoder's table: nibble → signed byte.
    const TABLE: [i8; 16];

    /// Block `b` of a row, `packed` its 16 bytes and `scales` the span's scale bytes → its
    /// columns 0–7, 8–15, 16–23 and 24–31 as the format's `fold_values` widens them.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `scales` holds block `b`'s scale, and the span's scales
    /// are ones the format's fast decode takes.
    unsafe fn block(d: &NibbleDecoder, packed: &[u8], scales: &[u8], b: usize) -> [__m256; 4];
}

/// [`crate::formats::Format::avx2_tile`] of a nibble format `B`: `R` rows (each the span's
/// packed bytes, 16 a block, and its scale bytes) against `N` activation rows, a 32-column
/// block at a time: each row's block widened in registers once ([`NibbleBlocks::block`]) and
/// folded into every token's accumulators, columns 0–7 and 16–23 into the low 8 lanes and
/// 8–15 and 24–31 into the high ones, the order the panel's fold takes. When `ahead` is not
/// 0, each row's bytes `ahead` on are named to the prefetcher, a line per 4 blocks. The
/// span's scales must be ones `B`'s block decode takes (MXFP4's fast range: its caller checks
/// the span first and takes the buffered decode otherwise); others give wrong values, never an
/// access outside the slices.
///
/// # Panics
/// If a row's bytes are not 16 a block of the span, the `x[j]` differ in length, or their
/// length is not a multiple of 32.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fold_nibble_tile<B: NibbleBlocks, const R: usize, const N: usize>(
    rows: [(&[u8], &[u8]); R],
    x: [&[f32]; N],
    mut acc: [&mut [Lanes; N]; R],
    ahead: usize,
) {
    let len = x.first().map_or(0, |s| s.len());
    assert!(len.is_multiple_of(32), "nibble tile span");
    let blocks = len / 32;
    assert!(rows.iter().all(|(p, _)| p.len() == 16 * blocks) && x.iter().all(|x| x.len() == len));
    let d = NibbleDecoder::new(&B::TABLE);
    let xp: [*const f32; N] = std::array::from_fn(|j| x[j].as_ptr());
    // A row at a time over the whole span (the activations' span stays in L1): the N
    // tokens' accumulators of two rows, a block's four widened registers and the decoder's
    // tables are more than AVX2's 16 registers, and the spills cost more than reading the
    // activations again for the second row (INT4 at 6 and 8 rows ran 0.75–0.79× the buffered
    // nest with both rows a block).
    for ((packed, scales), lanes_r) in rows.iter().zip(acc.iter_mut()) {
        let mut ar: Acc2<N> = load2(&lanes_r.each_mut());
        for b in 0..blocks {
            if ahead != 0 && b.is_multiple_of(4) {
                crate::arch::prefetch_line(packed.as_ptr().wrapping_add(16 * b + ahead));
            }
            // SAFETY: the CPU has AVX2 and FMA (this function's features); the scales are
            // the caller's.
            let wv = unsafe { B::block(&d, &packed[16 * b..16 * b + 16], scales, b) };
            for (j, &xj) in xp.iter().enumerate() {
                for (k, v) in wv.iter().enumerate() {
                    // SAFETY: `32 * b + 8 * k + 8 <= len`, each `x[j]`'s length (asserted).
                    let xv = unsafe { _mm256_loadu_ps(xj.add(32 * b + 8 * k)) };
                    ar[j][k % 2] = _mm256_fmadd_ps(*v, xv, ar[j][k % 2]);
                }
            }
        }
        store2(&ar, lanes_r.each_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::super::Avx2;
    use crate::formats::{bf16::Bf16, float32::F32, int4_group::Int4Group, int8_row::Int8Row};
    use crate::formats::{fp8_block::Fp8Block, mxfp4::Mxfp4};
    use crate::stored::STORED_ROWS;
    use crate::tiled::Kernel;

    /// Calls of 2 to 32 activation rows on bf16 and int8 (12 on f32) widened every chunk into a
    /// buffer before folding it on the AVX2 tier, so 2 rows ran slower than 1 (session 26);
    /// they now take the stored nest. Since session 39 FP8 does up to 4 rows (its own tile,
    /// `formats/fp8_block_x86.rs`; a layer from memory 1.13–1.99×; up to 6 since session 40's
    /// unmasked tile, 5 / 6 rows 1.22–1.31×), MXFP4 up to 8 and INT4 up to 6
    /// ([`fold_nibble_tile`]; 1.10–1.98× and 1.03–1.79×).
    /// (Each path's bits are the few-row tests' in `tests/batch.rs`.)
    #[test]
    fn avx2_few_row_calls_widened_each_chunk_into_a_buffer_now_fold_the_stored_bytes() {
        assert_eq!(Avx2::stored_rows::<Bf16>(), STORED_ROWS);
        assert_eq!(Avx2::stored_rows::<Int8Row>(), STORED_ROWS);
        assert_eq!(Avx2::stored_rows::<F32>(), 12);
        assert_eq!(Avx2::stored_rows::<Mxfp4>(), 8);
        assert_eq!(Avx2::stored_rows::<Int4Group>(), 6);
        assert_eq!(Avx2::stored_rows::<Fp8Block>(), 6);
    }
}
