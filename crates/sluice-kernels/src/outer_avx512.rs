//! The outer-product prefill nest's AVX-512 tier ([`crate::outer`]'s driver runs it): the
//! pack, the panel's decode, the tiles and the lanes' reduction, on 16-lane registers.
//!
//! **Tiles** are 1 to 4 vectors of 16 rows (as many as the group has) × 6 tokens: per step,
//! up to four aligned loads of the panel, six broadcasts, 24 FMAs, and, in the first 24
//! steps, a prefetch of a line of the next tile's activations (the next group's, or the
//! next lane's first group's) and one of its accumulators: a block's accumulators (1 MiB)
//! and a chunk's pack do not stay in L2 together, and naming the next tile's 24 + 24 lines
//! took T = 256 from 62–65% to 70–77% of the peak on the dev VM (issue 20, session 25).
//! A 16 × 16 block of the panel or the pack is transposed in registers ([`transpose16`]).

use std::ops::Range;

use core::arch::x86_64::*;

use crate::arch::avx512::Avx512;
use crate::formats::Format;
use crate::matmul::Matrix;
use crate::outer::{Tier, PANEL_LANE, ROWS, SUB};
use crate::packed::{pack_size, GROUP_TOKENS, MICRO, PACK_WINDOW, STEPS, WINDOW_FLOATS};
use crate::tiled::Kernel;

/// Writes the part of the pack of `x` (`tokens` rows of `cols`) that holds column chunks
/// `chunks` of token groups `gs` into `out`, the whole pack's buffer ([`pack_size`] floats):
/// columns past `cols` as −0.0 (whole steps past the row's end too), tokens past `tokens` as
/// +0.0. Each group's micro run of a lane is written in whole aligned vectors, three per 8
/// steps, from 16 × 16 transposes of the group's 6 rows over 8 steps, so every cache line of
/// the pack is written whole by one store.
///
/// # Safety
/// The CPU supports AVX-512F; `out` points to `pack_size(tokens, cols).0` writable floats on
/// a cache line, of which no other thread touches these groups during the call.
///
/// # Panics
/// If `x` is not `tokens * cols` long, or `gs` ends past the pack's last group.
#[target_feature(enable = "avx512f")]
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
    for ch in chunks {
        for g in gs.clone() {
            for w0 in (0..STEPS).step_by(PACK_WINDOW) {
                if ch * STEPS + w0 >= steps {
                    break;
                }
                for b in 0..WINDOW_FLOATS / 16 {
                    let mut r = [_mm512_setzero_ps(); 16];
                    for (i, v) in r.iter_mut().enumerate() {
                        let (kk, j) = ((16 * b + i) / GROUP_TOKENS, (16 * b + i) % GROUP_TOKENS);
                        let (tok, s) = (GROUP_TOKENS * g + j, ch * STEPS + w0 + kk);
                        if tok >= tokens {
                            continue;
                        }
                        *v = if s >= steps {
                            _mm512_set1_ps(-0.0)
                        } else {
                            let c = 16 * s;
                            let tail = (cols - c).min(16);
                            let mask: __mmask16 = if tail == 16 { 0xFFFF } else { (1 << tail) - 1 };
                            // SAFETY: row `tok < tokens` of `x` holds `cols` floats from
                            // `tok * cols`, `c < cols`, and the mask keeps the load inside
                            // `c..cols` (masked lanes never fault).
                            unsafe {
                                _mm512_mask_loadu_ps(
                                    _mm512_set1_ps(-0.0),
                                    mask,
                                    x.as_ptr().add(tok * cols + c),
                                )
                            }
                        };
                    }
                    transpose16(&mut r);
                    for (l, v) in r.iter().enumerate() {
                        let at = ((ch * 16 + l) * groups + g) * MICRO + GROUP_TOKENS * w0 + 16 * b;
                        // SAFETY: `at + 16 <= pack_size(..).0` (`ch < chunks`, `g < groups`,
                        // `w0 + 8 <= STEPS`), a multiple of 16 floats from `out`, which is on
                        // a line; these groups are this call's alone.
                        unsafe { _mm512_store_ps(out.add(at), *v) };
                    }
                }
            }
        }
    }
}

impl Tier for Avx512 {
    const WIDTH: usize = 16;

    /// Each 16 × 16 block transposed in registers ([`transpose16`]).
    #[target_feature(enable = "avx512f")]
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
                        // SAFETY: the CPU supports AVX-512F; the span starts at a multiple of
                        // 256 columns (so of every format's block) inside the row, and is `SUB`
                        // long or ends the row.
                        unsafe {
                            Avx512::decode::<F>(F::row(m, g0 + rb + i), c0 + s0, &mut dst[..sl])
                        };
                        dst[sl..padded].fill(0.0);
                    } else {
                        dst[..padded].fill(0.0);
                    }
                }
                for st in 0..padded / 16 {
                    let k = s0 / 16 + st;
                    let mut r = [_mm512_setzero_ps(); 16];
                    for (i, v) in r.iter_mut().enumerate() {
                        // SAFETY: `i · SUB + 16 · st + 16 <= 16 · SUB`: inside the stage.
                        *v = unsafe { _mm512_load_ps(stage.as_ptr().add(i * SUB + 16 * st)) };
                    }
                    transpose16(&mut r);
                    for (l, v) in r.iter().enumerate() {
                        // SAFETY: `l · PANEL_LANE + k · ROWS + rb + 16 <= PANEL_FLOATS` (as
                        // `k < STEPS`, `rb + 16 <= ROWS`), a multiple of 16 of a buffer on a line.
                        unsafe {
                            _mm512_store_ps(
                                panel.as_mut_ptr().add(l * PANEL_LANE + k * ROWS + rb),
                                *v,
                            )
                        };
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fold(
        w: *const f32,
        x: *const f32,
        next: *const f32,
        steps: usize,
        a: *mut f32,
        gr: usize,
        first: bool,
    ) {
        // SAFETY: guaranteed by the caller: the group's accumulators are its 24 vectors.
        unsafe {
            match (first, (gr - 1) / 16) {
                (true, 0) => tile::<true, 1>(w, x, next, steps, a),
                (true, 1) => tile::<true, 2>(w, x, next, steps, a),
                (true, 2) => tile::<true, 3>(w, x, next, steps, a),
                (true, _) => tile::<true, 4>(w, x, next, steps, a),
                (false, 0) => tile::<false, 1>(w, x, next, steps, a),
                (false, 1) => tile::<false, 2>(w, x, next, steps, a),
                (false, 2) => tile::<false, 3>(w, x, next, steps, a),
                (false, _) => tile::<false, 4>(w, x, next, steps, a),
            }
        }
    }

    fn cell(j: usize, v: usize) -> usize {
        16 * (4 * j + v / 16)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn reduce_lanes(acc: *const f32, lane: usize) -> [f32; 16] {
        macro_rules! q {
            ($l:literal) => {
                // SAFETY: guaranteed by the caller: the 16 lanes' vectors at `acc + l · lane`.
                unsafe { _mm512_load_ps(acc.add($l * lane)) }
            };
        }
        // The tree written out: as loops over an array the compiler kept the array on the
        // stack and the loop's bounds checks in it (4–5% of a 2,048-token prefill).
        let (s0, s1, s2, s3) = (
            _mm512_add_ps(q!(0), q!(8)),
            _mm512_add_ps(q!(1), q!(9)),
            _mm512_add_ps(q!(2), q!(10)),
            _mm512_add_ps(q!(3), q!(11)),
        );
        let (s4, s5, s6, s7) = (
            _mm512_add_ps(q!(4), q!(12)),
            _mm512_add_ps(q!(5), q!(13)),
            _mm512_add_ps(q!(6), q!(14)),
            _mm512_add_ps(q!(7), q!(15)),
        );
        let (t0, t1, t2, t3) = (
            _mm512_add_ps(s0, s4),
            _mm512_add_ps(s1, s5),
            _mm512_add_ps(s2, s6),
            _mm512_add_ps(s3, s7),
        );
        let sum = _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
        let mut out = [0.0f32; 16];
        // SAFETY: `out` holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
        out
    }
}

/// One tile of `V` vectors of 16 rows × 6 tokens:
/// `acc[j][v] = fma(w[k][v], x[6k + j], acc[j][v])` for `k < steps` in increasing order,
/// from +0.0 if `FIRST` (accumulator `(j, v)` at `acc + 16 · (4j + v)`); the next tile's
/// activations (the [`MICRO`] floats at `next`) and accumulators (the 24 lines after this
/// tile's) are named to L1, a line of each at each of the first 24 steps.
///
/// # Safety
/// The CPU supports AVX-512F; `w` holds `steps` steps of 64 floats on a cache line (the first
/// `16 · V` of each read), `x` is readable at `6k + j` for `k < steps`, `j < 6`, and `acc`
/// holds 24 · 16 floats on a line.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const FIRST: bool, const V: usize>(
    w: *const f32,
    x: *const f32,
    next: *const f32,
    steps: usize,
    acc: *mut f32,
) {
    let mut a = [[_mm512_setzero_ps(); V]; GROUP_TOKENS];
    if !FIRST {
        for (j, aj) in a.iter_mut().enumerate() {
            for (v, av) in aj.iter_mut().enumerate() {
                // SAFETY: guaranteed by the caller.
                *av = unsafe { _mm512_load_ps(acc.add(16 * (4 * j + v))) };
            }
        }
    }
    for k in 0..steps {
        // SAFETY: guaranteed by the caller.
        let (wk, xk) = unsafe { (w.add(k * ROWS), x.add(k * GROUP_TOKENS)) };
        if k < MICRO / 16 {
            // A prefetch never faults and has no architectural effect. Line `k` of the next
            // tile's activations and of its accumulators (the next group's, or the next
            // lane's first: the 24 lines after this tile's, either way).
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(16 * k).cast());
            _mm_prefetch::<_MM_HINT_T0>(acc.wrapping_add(24 * 16 + 16 * k).cast());
        }
        let mut wv = [_mm512_setzero_ps(); V];
        for (v, w) in wv.iter_mut().enumerate() {
            // SAFETY: as above: step `k`'s first `16 · V` rows.
            *w = unsafe { _mm512_load_ps(wk.add(16 * v)) };
        }
        for (j, aj) in a.iter_mut().enumerate() {
            // SAFETY: as above.
            let b = _mm512_set1_ps(unsafe { *xk.add(j) });
            for (av, w) in aj.iter_mut().zip(&wv) {
                *av = _mm512_fmadd_ps(*w, b, *av);
            }
        }
    }
    for (j, aj) in a.iter().enumerate() {
        for (v, av) in aj.iter().enumerate() {
            // SAFETY: guaranteed by the caller.
            unsafe { _mm512_store_ps(acc.add(16 * (4 * j + v)), *av) };
        }
    }
}

/// Transposes 16 vectors in place: lane `i` of `r[l]` becomes lane `l` of the old `r[i]`.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let (a, b) = (_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 1]));
        let (c, d) = (_mm512_castps_pd(t[4 * i + 2]), _mm512_castps_pd(t[4 * i + 3]));
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // r[4i + q] holds, for rows 4i .. 4i + 4, column q + 4s in its 128-bit lane s.
    for h in 0..2 {
        for q in 0..4 {
            let (a, b) = (r[8 * h + q], r[8 * h + 4 + q]);
            t[8 * h + q] = _mm512_shuffle_f32x4::<0x88>(a, b);
            t[8 * h + 4 + q] = _mm512_shuffle_f32x4::<0xdd>(a, b);
        }
    }
    for q in 0..8 {
        r[q] = _mm512_shuffle_f32x4::<0x88>(t[q], t[8 + q]);
        r[8 + q] = _mm512_shuffle_f32x4::<0xdd>(t[q], t[8 + q]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_moves_lane_i_of_vector_l_to_lane_l_of_vector_i() {
        if !crate::isa::Isa::Avx512.is_available() {
            return;
        }
        let rows: Vec<[f32; 16]> =
            (0..16u8).map(|i| std::array::from_fn(|l| f32::from(i) * 16.0 + l as f32)).collect();
        // SAFETY: the CPU supports AVX-512F (checked); every load and store is of 16 floats.
        let out = unsafe { transposed(&rows) };
        for (l, v) in out.iter().enumerate() {
            for (i, &e) in v.iter().enumerate() {
                assert_eq!(e, rows[i][l], "vector {l}, lane {i}");
            }
        }
    }

    /// `rows` transposed by [`transpose16`].
    #[target_feature(enable = "avx512f")]
    unsafe fn transposed(rows: &[[f32; 16]]) -> Vec<[f32; 16]> {
        // SAFETY: each row holds 16 floats.
        let mut r: [__m512; 16] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_ps(rows[i].as_ptr()) });
        transpose16(&mut r);
        r.iter()
            .map(|v| {
                let mut o = [0.0f32; 16];
                // SAFETY: `o` holds 16 floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
                o
            })
            .collect()
    }
}
