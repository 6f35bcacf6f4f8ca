//! The outer-product prefill nest on AVX2 ([`crate::outer`]'s, for 8-lane registers): a
//! register holds one lane of 8 weight rows' accumulators, so the weights a tile folds stay in
//! L1 while every token group of the block passes over them.
//!
//! **Why.** AVX2's prefill nest ([`crate::wide`]) folds 16 columns of one (row, token) cell
//! per pair of FMAs, so each FMA needs 8 weights *and* 8 activations from the cache; its tiles
//! of 3 rows × 4 tokens in halves stream the weights from the L2 panel (about two thirds of
//! the FMA peak at T = 256 on one thread, issue 20). Here, as in [`crate::outer`], an FMA
//! takes 8 weights (column `c` of 8 rows) and **one** activation value, broadcast, and a
//! lane's slab of the panel (64 rows × 64 columns, 16 KiB) stays in L1 while all the block's
//! token groups fold over it.
//!
//! **Layout.** The same as [`crate::outer`]'s, so the two tiers share the pack
//! ([`crate::packed`]) and the scratch: the panel `P[l][k][r]` = `W[g0 + r][c0 + 16k + l]`
//! (64 rows a step, lane `l`'s slab at `l · PANEL_LANE`), decoded 16 rows × 256 columns at a
//! time through the format's AVX2 decode and transposed in 8 × 8 blocks ([`transpose8`]; a
//! 16 × 16 block is four); the activations `A[ch][l][g][k][j]` packed once per call
//! ([`pack`], 8 × 8 transposes too). A lane's accumulators for token group `g` are the 4 tiles
//! of 16 rows × 6 tokens one after the other ([`CELLS`] floats), a tile's 12 registers of 8
//! rows side by side ([`TILE`] floats), on cache lines.
//!
//! **Tiles** are 2 vectors of 8 rows × 6 tokens: 12 accumulators, and per step two aligned
//! loads of the panel and six broadcasts for 12 FMAs (15 of the 16 registers). A lane's token
//! group runs the group's 4 tiles (64 rows) one after the other: its activations (1.5 KiB)
//! come from L2 once and serve all four from L1, and the first tile names the next group's
//! (or the next lane's first group's) activations to the prefetcher, a line a step; each
//! tile names the next tile's accumulators (as [`crate::outer`]'s tiles do: within noise on
//! the dev VM, session 25, where this nest already ran at 76–80%). The stored bytes the
//! nest decodes next are named as in [`crate::outer`].
//!
//! **Exactness.** As in [`crate::outer`]: lane `l` of cell (r, j) folds
//! `fma(W[r][c], x[j][c], acc)` for `c = l, l + 16, …` in increasing order from +0.0 (chunks
//! in order, steps in order, accumulators stored bit-unchanged between chunks), a row's last
//! partial 16 columns fold +0.0 weights against −0.0 activations, and the 16 lanes of a cell
//! are added in [`crate::matmul::reduce16`]'s tree, the lower lanes' as the first operand, for
//! 8 rows at once ([`reduce_lanes`]). So every result is the canonical reduction, bit for bit.

use std::ops::Range;

use core::arch::x86_64::*;

use crate::arch::avx2::Avx2;
use crate::formats::Format;
use crate::matmul::Matrix;
use crate::outer::{Tier, ACC_FLOATS, CELLS, PANEL_LANE, ROWS, SUB};
use crate::packed::{pack_size, BLOCK, GROUP_TOKENS, MICRO, PACK_WINDOW, STEPS, WINDOW_FLOATS};
use crate::tiled::Kernel;

/// Floats of one tile's accumulators: 2 vectors of 8 rows × 6 tokens, token-major.
const TILE: usize = 2 * 8 * GROUP_TOKENS;
/// Lanes of a mask: the first `n` of 8 set when loaded from `n` floats before the zeros.
const MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

const _: () = assert!(CELLS == 4 * TILE && TILE.is_multiple_of(16) && CELLS.is_multiple_of(16));
const _: () = assert!(16 * BLOCK.div_ceil(GROUP_TOKENS) * CELLS <= ACC_FLOATS);

/// The mask of lanes `lo..hi` of 8 (`lo <= hi <= 8`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn lanes(lo: usize, hi: usize) -> __m256i {
    assert!(lo <= hi && hi <= 8, "mask lanes");
    // SAFETY: `8 - hi + 8 <= 16` and `8 - lo + 8 <= 16`: both loads inside `MASKS`.
    unsafe {
        let below_hi = _mm256_loadu_si256(MASKS.as_ptr().add(8 - hi).cast());
        let below_lo = _mm256_loadu_si256(MASKS.as_ptr().add(8 - lo).cast());
        _mm256_andnot_si256(below_lo, below_hi)
    }
}

/// AVX2's [`crate::outer_avx512::pack`]: the pack's column chunks `chunks` of token
/// groups `gs`, each group's micro run of a lane written in whole aligned vectors from 8 × 8
/// transposes of the group's 6 rows over 8 steps, half a step's 16 columns at a time.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `out` points to `pack_size(tokens, cols).0` writable floats
/// on a cache line, of which no other thread touches these groups during the call.
///
/// # Panics
/// If `x` is not `tokens * cols` long, or `gs` ends past the pack's last group.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pack(
    x: &[f32],
    tokens: usize,
    cols: usize,
    chunks: Range<usize>,
    gs: Range<usize>,
    out: *mut f32,
) {
    assert_eq!(x.len(), tokens * cols, "pack: x length");
    let (_, groups) = pack_size(tokens, cols);
    assert!(gs.end <= groups, "pack: token groups");
    let steps = cols.div_ceil(16);
    let neg = _mm256_set1_ps(-0.0);
    for ch in chunks {
        for g in gs.clone() {
            for w0 in (0..STEPS).step_by(PACK_WINDOW) {
                if ch * STEPS + w0 >= steps {
                    break;
                }
                for h in 0..2 {
                    for b in 0..WINDOW_FLOATS / 8 {
                        let mut r = [_mm256_setzero_ps(); 8];
                        for (i, v) in r.iter_mut().enumerate() {
                            let m = 8 * b + i;
                            let (kk, j) = (m / GROUP_TOKENS, m % GROUP_TOKENS);
                            let (tok, s) = (GROUP_TOKENS * g + j, ch * STEPS + w0 + kk);
                            if tok >= tokens {
                                continue;
                            }
                            // Columns `c .. c + n` of the 8 are in the row.
                            let c = 16 * s + 8 * h;
                            let n = cols.saturating_sub(c).min(8);
                            *v = if n == 0 {
                                neg
                            } else {
                                let keep = lanes(0, n);
                                // The sign bit where a lane is past the row's end.
                                let past = _mm256_andnot_ps(_mm256_castsi256_ps(keep), neg);
                                // SAFETY: row `tok < tokens` of `x` holds `cols` floats from
                                // `tok * cols`, `c < cols` (as `n > 0`), and the mask keeps
                                // the load inside `c..cols` (masked lanes never fault).
                                let v = unsafe {
                                    _mm256_maskload_ps(x.as_ptr().add(tok * cols + c), keep)
                                };
                                _mm256_or_ps(v, past)
                            };
                        }
                        transpose8(&mut r);
                        for (l, v) in r.iter().enumerate() {
                            let at = ((ch * 16 + 8 * h + l) * groups + g) * MICRO
                                + GROUP_TOKENS * w0
                                + 8 * b;
                            // SAFETY: `at + 8 <= pack_size(..).0` (`ch < chunks`, `g < groups`,
                            // `w0 + 8 <= STEPS`), a multiple of 8 floats from `out`, which is
                            // on a line; these groups are this call's alone.
                            unsafe { _mm256_store_ps(out.add(at), *v) };
                        }
                    }
                }
            }
        }
    }
}

impl Tier for Avx2 {
    const WIDTH: usize = 8;

    /// Each 16 × 16 block transposed as four 8 × 8 blocks ([`transpose8`]).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode_panel<F: Format>(
        m: &Matrix<'_>,
        g0: usize,
        gr: usize,
        c0: usize,
        len: usize,
        panel: &mut [f32],
        stage: &mut [f32],
    ) {
        for rb in (0..gr).step_by(16) {
            for s0 in (0..len).step_by(SUB) {
                let sl = SUB.min(len - s0);
                let padded = sl.next_multiple_of(16);
                for (i, dst) in stage.chunks_exact_mut(SUB).take(16).enumerate() {
                    if rb + i < gr {
                        // SAFETY: the CPU supports AVX2 and FMA; the span starts at a multiple of
                        // 256 columns (so of every format's block) inside the row, and is `SUB`
                        // long or ends the row.
                        unsafe {
                            Avx2::decode::<F>(F::row(m, g0 + rb + i), c0 + s0, &mut dst[..sl])
                        };
                        dst[sl..padded].fill(0.0);
                    } else {
                        dst[..padded].fill(0.0);
                    }
                }
                for st in 0..padded / 16 {
                    let k = s0 / 16 + st;
                    for (rh, ch) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                        let mut r = [_mm256_setzero_ps(); 8];
                        for (i, v) in r.iter_mut().enumerate() {
                            // SAFETY: `(8rh + i) · SUB + 16st + 8ch + 8 <= 16 · SUB`: inside the
                            // stage, on 32 bytes.
                            *v = unsafe {
                                _mm256_load_ps(
                                    stage.as_ptr().add((8 * rh + i) * SUB + 16 * st + 8 * ch),
                                )
                            };
                        }
                        transpose8(&mut r);
                        for (l, v) in r.iter().enumerate() {
                            let at = (8 * ch + l) * PANEL_LANE + k * ROWS + rb + 8 * rh;
                            // SAFETY: `at + 8 <= PANEL_FLOATS` (as `k < STEPS`, `rb + 16 <= ROWS`),
                            // a multiple of 8 of a buffer on a line.
                            unsafe { _mm256_store_ps(panel.as_mut_ptr().add(at), *v) };
                        }
                    }
                }
            }
        }
    }

    /// The group's tiles of 16 rows one after the other: its activations come from L2 once
    /// and serve all of them from L1; the first names the next group's.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold(
        w: *const f32,
        x: *const f32,
        next: *const f32,
        steps: usize,
        acc: *mut f32,
        gr: usize,
        first: bool,
    ) {
        // Tiles of 16 rows the group has (the panel holds +0.0 past `gr` within them).
        for t in 0..gr.div_ceil(16) {
            // SAFETY: guaranteed by the caller: rows `16t .. 16t + 16` of each step lie in
            // its 64, tile `t`'s accumulators in the group's `CELLS` (`(t + 1) · TILE`).
            unsafe {
                let (w, a) = (w.add(16 * t), acc.add(t * TILE));
                match (first, t == 0) {
                    (true, true) => tile::<true, true>(w, x, next, steps, a),
                    (true, false) => tile::<true, false>(w, x, next, steps, a),
                    (false, true) => tile::<false, true>(w, x, next, steps, a),
                    (false, false) => tile::<false, false>(w, x, next, steps, a),
                }
            }
        }
    }

    /// Rows `v .. v + 8`: vector `v / 8 % 2` of tile `v / 16`.
    fn cell(j: usize, v: usize) -> usize {
        v / 16 * TILE + 8 * (2 * j + v / 8 % 2)
    }

    /// The 8 rows' sums, the first 8 of the 16 returned.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce_lanes(acc: *const f32, lane: usize) -> [f32; 16] {
        macro_rules! q {
            ($l:literal) => {
                // SAFETY: guaranteed by the caller: the 16 lanes' vectors at `acc + l · lane`.
                unsafe { _mm256_load_ps(acc.add($l * lane)) }
            };
        }
        // The tree written out, as the AVX-512 tier's: as loops over an array the compiler
        // kept the array on the stack and the loop's bounds checks in it (4–5% of a
        // 2,048-token prefill on AVX-512; here the change measured within noise).
        let (s0, s1, s2, s3) = (
            _mm256_add_ps(q!(0), q!(8)),
            _mm256_add_ps(q!(1), q!(9)),
            _mm256_add_ps(q!(2), q!(10)),
            _mm256_add_ps(q!(3), q!(11)),
        );
        let (s4, s5, s6, s7) = (
            _mm256_add_ps(q!(4), q!(12)),
            _mm256_add_ps(q!(5), q!(13)),
            _mm256_add_ps(q!(6), q!(14)),
            _mm256_add_ps(q!(7), q!(15)),
        );
        let (t0, t1, t2, t3) = (
            _mm256_add_ps(s0, s4),
            _mm256_add_ps(s1, s5),
            _mm256_add_ps(s2, s6),
            _mm256_add_ps(s3, s7),
        );
        let sum = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        let mut out = [0.0f32; 16];
        // SAFETY: `out` holds 16 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
        out
    }
}

/// One tile of 2 vectors of 8 rows × 6 tokens:
/// `acc[j][v] = fma(w[k][v], x[6k + j], acc[j][v])` for `k < steps` in increasing order,
/// from +0.0 if `FIRST` (accumulator `(j, v)` at `acc + 8 · (2j + v)`). The [`TILE`] floats
/// after this tile's accumulators (the next tile's) are named to L1, a line at each of the
/// first six steps, and when `AHEAD` the [`MICRO`] floats at `next` (the next group's
/// activations), a line at each of the first 24.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `w` holds `steps` steps [`ROWS`] floats apart, each's first
/// 16 read, on 32 bytes; `x` is readable at `6k + j` for `k < steps`, `j < 6`; and `acc`
/// holds [`TILE`] floats on 32 bytes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const FIRST: bool, const AHEAD: bool>(
    w: *const f32,
    x: *const f32,
    next: *const f32,
    steps: usize,
    acc: *mut f32,
) {
    let mut a = [[_mm256_setzero_ps(); 2]; GROUP_TOKENS];
    if !FIRST {
        for (j, aj) in a.iter_mut().enumerate() {
            for (v, av) in aj.iter_mut().enumerate() {
                // SAFETY: guaranteed by the caller.
                *av = unsafe { _mm256_load_ps(acc.add(8 * (2 * j + v))) };
            }
        }
    }
    for k in 0..steps {
        // SAFETY: guaranteed by the caller.
        let (wk, xk) = unsafe { (w.add(k * ROWS), x.add(k * GROUP_TOKENS)) };
        // A prefetch never faults and has no architectural effect.
        if AHEAD && k < MICRO / 16 {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(16 * k).cast());
        }
        if k < TILE / 16 {
            // Line `k` of the next tile's accumulators (the next tile's of this group, or the
            // next group's first: the lines after this tile's where the group has 64 rows).
            _mm_prefetch::<_MM_HINT_T0>(acc.wrapping_add(TILE + 16 * k).cast());
        }
        // SAFETY: as above: step `k`'s first 16 rows.
        let (w0, w1) = unsafe { (_mm256_load_ps(wk), _mm256_load_ps(wk.add(8))) };
        for (j, aj) in a.iter_mut().enumerate() {
            // SAFETY: as above.
            let b = _mm256_set1_ps(unsafe { *xk.add(j) });
            aj[0] = _mm256_fmadd_ps(w0, b, aj[0]);
            aj[1] = _mm256_fmadd_ps(w1, b, aj[1]);
        }
    }
    for (j, aj) in a.iter().enumerate() {
        for (v, av) in aj.iter().enumerate() {
            // SAFETY: guaranteed by the caller.
            unsafe { _mm256_store_ps(acc.add(8 * (2 * j + v)), *av) };
        }
    }
}

/// Transposes 8 vectors in place: lane `i` of `r[l]` becomes lane `l` of the old `r[i]`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn transpose8(r: &mut [__m256; 8]) {
    let mut t = [_mm256_setzero_ps(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // t[2i] holds, in each 128-bit half, rows 2i, 2i + 1 of columns 0, 1 (4, 5 in the high
    // half); t[2i + 1] of columns 2, 3 (6, 7).
    let mut u = [_mm256_setzero_ps(); 8];
    for i in 0..2 {
        let (a, b) = (t[4 * i], t[4 * i + 2]);
        let (c, d) = (t[4 * i + 1], t[4 * i + 3]);
        u[4 * i] = _mm256_shuffle_ps::<0x44>(a, b);
        u[4 * i + 1] = _mm256_shuffle_ps::<0xEE>(a, b);
        u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(c, d);
        u[4 * i + 3] = _mm256_shuffle_ps::<0xEE>(c, d);
    }
    // u[4i + q] holds rows 4i .. 4i + 4 of column q in its low half, of column q + 4 in its
    // high half.
    for q in 0..4 {
        r[q] = _mm256_permute2f128_ps::<0x20>(u[q], u[4 + q]);
        r[4 + q] = _mm256_permute2f128_ps::<0x31>(u[q], u[4 + q]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose8_moves_lane_i_of_vector_l_to_lane_l_of_vector_i() {
        if !crate::isa::Isa::Avx2.is_available() {
            return;
        }
        let rows: Vec<[f32; 8]> =
            (0..8u8).map(|i| std::array::from_fn(|l| f32::from(i) * 8.0 + l as f32)).collect();
        // SAFETY: the CPU supports AVX2 and FMA (checked); every load and store is of 8 floats.
        let out = unsafe { transposed(&rows) };
        for (l, v) in out.iter().enumerate() {
            for (i, &e) in v.iter().enumerate() {
                assert_eq!(e, rows[i][l], "vector {l}, lane {i}");
            }
        }
    }

    #[test]
    fn mask_lanes_lo_to_hi_are_set_and_no_others() {
        if !crate::isa::Isa::Avx2.is_available() {
            return;
        }
        for lo in 0..=8 {
            for hi in lo..=8 {
                let mut got = [0i32; 8];
                // SAFETY: the CPU supports AVX2 and FMA (checked); `got` holds 8 i32.
                unsafe { _mm256_storeu_si256(got.as_mut_ptr().cast(), lanes(lo, hi)) };
                let want: [i32; 8] =
                    std::array::from_fn(|i| if (lo..hi).contains(&i) { -1 } else { 0 });
                assert_eq!(got, want, "lanes {lo}..{hi}");
            }
        }
    }

    /// `rows` transposed by [`transpose8`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transposed(rows: &[[f32; 8]]) -> Vec<[f32; 8]> {
        let mut r = [_mm256_setzero_ps(); 8];
        for (v, row) in r.iter_mut().zip(rows) {
            // SAFETY: each row holds 8 floats.
            *v = unsafe { _mm256_loadu_ps(row.as_ptr()) };
        }
        transpose8(&mut r);
        r.iter()
            .map(|v| {
                let mut o = [0.0f32; 8];
                // SAFETY: `o` holds 8 floats.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *v) };
                o
            })
            .collect()
    }
}
