//! The prefill nest in outer-product form (AVX-512): a register holds one lane of 16 weight
//! rows' accumulators, not 16 lanes of one row's, so the weights a tile folds stay in L1
//! while every token group of the block passes over them. AVX2's nest (`crate::outer_avx2`)
//! is the same with 8-lane registers, on the same pack and panel.
//!
//! **Why.** The canonical reduction ([`crate::matmul`]) gives each (row, token) cell 16
//! lanes, lane `l` folding columns `l, l + 16, l + 32, …` in increasing order, then
//! [`crate::matmul::reduce16`]'s tree. The other nests hold a cell's 16 lanes in one register
//! and fold 16 columns per FMA, so each FMA needs 16 weights *and* 16 activations: a tile of
//! 4 rows × 6 tokens streams 4 KiB of weights per 1,536 FMAs from the L2 panel, and a token
//! group's 24 KiB of activations and the tile's weights share L1 (≈ 52% of the FMA peak at
//! T = 256 on one thread of the dev VM, issue 20, sessions 11–22). Here a register holds lane
//! `l` of 16 rows × 1 token: an FMA takes 16 weights (column `c` of 16 rows) and **one**
//! activation value, broadcast. A tile of 64 rows × 6 tokens then reads, per step, four
//! weight vectors and six scalars: the lane's slab of the panel (64 rows × 64 columns, 16 KiB)
//! stays in L1 while all the block's token groups fold over it, and a token group streams
//! only 1.5 KiB of activations per tile.
//!
//! **Layout.** Both operands are transposed so that a lane's values lie together:
//! - the **panel** of a row group's column chunk is `P[l][k][r]` = `W[g0 + r][c0 + 16k + l]`
//!   (64 rows, [`CHUNK`] columns, so 64 steps `k` a lane), made by decoding 16 rows × 256
//!   columns through the format's decode and transposing 16 × 16 blocks in registers;
//! - the activations are **packed** once per call ([`pack`]): `A[ch][l][g][k][j]` =
//!   `x[6g + j][ch · CHUNK + 16k + l]`, in token groups of 6 (the tokens a tile folds), so
//!   that a tile's activations are one run of 24 cache lines; shared by every thread's row
//!   chunks, a block of at most [`BLOCK`] (264) tokens at a time
//!   ([`crate::packed::in_blocks`]). The weights are decoded once per block: a 256-token
//!   prefill decodes them once. (Packed with a block's tokens side by side instead, a lane's
//!   steps lay a stride of all the tokens apart, which the hardware prefetchers did not
//!   follow: the fold ran at 56% of the peak at T = 256 against 87% at T = 64, and blocks
//!   were kept to 128 tokens, each decoding the weights again; docs/PERFORMANCE.md, issue 20,
//!   sessions 23 and 24.)
//!
//! **Tiles** are 1 to 4 vectors of 16 rows (as many as the group has) × 6 tokens: per step,
//! up to four aligned loads of the panel, six broadcasts, 24 FMAs, and, in the first 24
//! steps, a prefetch of a line of the next tile's activations (the next group's, or the
//! next lane's first group's) and one of its accumulators: a block's accumulators (1 MiB)
//! and a chunk's pack do not stay in L2 together, and naming the next tile's 24 + 24 lines
//! took T = 256 from 62–65% to 70–77% of the peak on the dev VM (issue 20, session 25). While the tiles run, the stored bytes the nest decodes next are named to the
//! prefetcher, a few lines before each tile, as the other prefill nest does ([`crate::wide`]).
//!
//! **Exactness.** Lane `l` of cell (r, j) still folds `fma(W[r][c], x[j][c], acc)` for
//! `c = l, l + 16, …` in increasing order: chunks in increasing order, steps `k` in
//! increasing order within a chunk, accumulators starting at +0.0 and stored bit-unchanged
//! between chunks. A row's last partial 16 columns fold +0.0 weights against −0.0 activations
//! (`fma(+0, −0, acc) = acc`, as in every nest), and the 16 lanes of a cell are added in
//! [`crate::matmul::reduce16`]'s tree, the lower lanes' as the first operand, for 16 rows at
//! once. So every result is the canonical reduction, bit for bit.

use std::ops::Range;

use core::arch::x86_64::*;

use crate::arch::avx512::Avx512;
use crate::formats::Format;
use crate::matmul::Matrix;
use crate::packed::{pack_size, Packed, BLOCK, CHUNK, GROUP_TOKENS, MICRO, STEPS};
use crate::tiled::Kernel;

/// Weight rows of a row group: four 16-row vectors.
pub(crate) const ROWS: usize = 64;
/// Floats of one lane's slab of the panel: a chunk of 64 rows and one cache line, so that the
/// 16 slabs a transposed block is stored into do not all fall in one L1 set.
pub(crate) const PANEL_LANE: usize = STEPS * ROWS + 16;
/// Columns a row is decoded in at a time (16 rows of it: 16 KiB, in L1) before transposing.
pub(crate) const SUB: usize = 256;
/// Floats of the panel, the accumulators and the decode stage the nest needs.
pub(crate) const PANEL_FLOATS: usize = 16 * PANEL_LANE;
/// Accumulator floats of a block: 16 lanes × token groups × 24 vectors of 16.
pub(crate) const ACC_FLOATS: usize = 16 * BLOCK.div_ceil(GROUP_TOKENS) * 24 * 16;
/// Floats of the decode stage: 16 rows of [`SUB`] columns.
pub(crate) const STAGE_FLOATS: usize = 16 * SUB;

const _: () = assert!(CHUNK.is_multiple_of(SUB) && SUB.is_multiple_of(128));
const _: () = assert!(ROWS == 4 * 16 && ROWS == crate::wide::GROUP);

/// The nest's buffers, each on a cache line: the panel ([`PANEL_FLOATS`]), the accumulators
/// ([`ACC_FLOATS`]) and the decode stage ([`STAGE_FLOATS`]).
pub(crate) struct Buffers<'s> {
    pub(crate) panel: &'s mut [f32],
    pub(crate) acc: &'s mut [f32],
    pub(crate) stage: &'s mut [f32],
}

/// Writes the part of the pack of `x` (`tokens` rows of `cols`) that holds column chunks
/// `chunks` of token blocks `blocks` (16 tokens each) into `out`, the whole pack's buffer
/// ([`pack_size`] floats): columns past `cols` as −0.0, tokens past `tokens` as +0.0. A token
/// group that straddles two blocks gets its tokens from both, each writing only its own.
///
/// # Safety
/// The CPU supports AVX-512F; `out` points to `pack_size(tokens, cols).0` writable floats, of
/// which no other thread touches this part's tokens during the call; `blocks` ends within the
/// last token group's 16.
///
/// # Panics
/// If `x` is not `tokens * cols` long.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack(
    x: &[f32],
    tokens: usize,
    cols: usize,
    chunks: Range<usize>,
    blocks: Range<usize>,
    out: *mut f32,
) {
    assert_eq!(x.len(), tokens * cols, "pack: x length");
    let (_, groups) = pack_size(tokens, cols);
    let slots = groups * GROUP_TOKENS;
    assert!(blocks.end * 16 <= slots.next_multiple_of(16), "pack: token blocks");
    let steps = cols.div_ceil(16);
    for ch in chunks {
        for k in 0..STEPS {
            let s = ch * STEPS + k;
            if s >= steps {
                break;
            }
            let c = 16 * s;
            let tail = (cols - c).min(16);
            // Lanes past the row's end load −0.0 (masked lanes never fault).
            let mask: __mmask16 = if tail == 16 { 0xFFFF } else { (1 << tail) - 1 };
            for jb in blocks.clone().map(|b| 16 * b) {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, v) in r.iter_mut().enumerate() {
                    let j = jb + i;
                    if j < tokens {
                        // SAFETY: row `j < tokens` of `x` holds `cols` floats from
                        // `j * cols`, and the mask keeps the load inside `c..cols`.
                        *v = unsafe {
                            _mm512_mask_loadu_ps(
                                _mm512_set1_ps(-0.0),
                                mask,
                                x.as_ptr().add(j * cols + c),
                            )
                        };
                    }
                }
                transpose16(&mut r);
                // Lane `i` of `r[l]` is token `jb + i`: slot `(jb + i) % 6` of group
                // `(jb + i) / 6`, stored by one masked store per group the block meets.
                for g in jb / GROUP_TOKENS..(jb + 16).min(slots).div_ceil(GROUP_TOKENS) {
                    let first = GROUP_TOKENS * g;
                    let (lo, hi) = (first.max(jb) - jb, (first + GROUP_TOKENS).min(jb + 16) - jb);
                    // Lanes `lo..hi` (`lo < hi <= 16`).
                    let keep: __mmask16 = (u16::MAX >> (16 - hi)) & (u16::MAX << lo);
                    for (l, v) in r.iter().enumerate() {
                        let slot = ((ch * 16 + l) * groups + g) * MICRO + GROUP_TOKENS * k;
                        // SAFETY: lane `i` of the vector lands at `slot + jb + i - first`;
                        // the kept lanes (`first <= jb + i < first + 6`) land in the group's
                        // six slots of step `k`, below `pack_size(..).0` (`ch < chunks`,
                        // `g < groups`); masked lanes are neither written nor fault.
                        unsafe {
                            _mm512_mask_storeu_ps(
                                out.wrapping_add(slot + jb).wrapping_sub(first),
                                keep,
                                *v,
                            )
                        };
                    }
                }
            }
        }
    }
}

/// `emit(j, r, Σ_c W[r, c] · x[j, c])` for every `r` in `rows` and token `j` of `tokens`
/// (of the pack `p`; `j` handed relative to `tokens.start`), each sum in the canonical
/// order, in the buffers `panel`, `acc` and `stage` of [`Buffers`] ([`PANEL_FLOATS`], [`ACC_FLOATS`],
/// [`STAGE_FLOATS`] floats, each on a cache line).
///
/// # Safety
/// The CPU supports AVX-512F.
///
/// # Panics
/// If a buffer is too short or off a cache line, `p` is not `m`'s columns, `tokens` runs past
/// the pack or `rows` past `m`.
pub(crate) unsafe fn run<F: Format>(
    Buffers { panel, acc, stage }: Buffers<'_>,
    m: &Matrix<'_>,
    p: &Packed<'_>,
    tokens: Range<usize>,
    rows: Range<usize>,
    mut emit: impl FnMut(usize, usize, f32),
) {
    assert!(panel.len() >= PANEL_FLOATS && acc.len() >= ACC_FLOATS, "outer: scratch");
    assert!(stage.len() >= STAGE_FLOATS, "outer: stage");
    for b in [panel.as_ptr(), acc.as_ptr(), stage.as_ptr()] {
        assert!(b.addr().is_multiple_of(64), "outer: scratch alignment");
    }
    assert!(p.cols == m.cols() && tokens.end <= p.tokens, "outer: pack");
    assert!(tokens.start.is_multiple_of(GROUP_TOKENS), "outer: tokens off a group");
    assert!(rows.end <= m.rows(), "matmul: row range");
    let cols = m.cols();
    // Blocks of about equal size, of whole token groups, so that none is left with a few
    // tokens to decode the weights for.
    let size = tokens.len().div_ceil(tokens.len().div_ceil(BLOCK).max(1));
    let size = size.next_multiple_of(GROUP_TOKENS).min(BLOCK);
    for b0 in tokens.clone().step_by(size.max(1)) {
        let n = size.min(tokens.end - b0);
        let groups = n.div_ceil(GROUP_TOKENS);
        // Floats of one lane's accumulators: `groups` tiles of 24 vectors.
        let lane_acc = groups * 24 * 16;
        for g0 in rows.clone().step_by(ROWS) {
            let gr = ROWS.min(rows.end - g0);
            for ch in 0..Packed::chunks(cols) {
                let c0 = ch * CHUNK;
                let len = CHUNK.min(cols - c0);
                // SAFETY: the CPU supports AVX-512F; the buffers' sizes are asserted above.
                unsafe { decode_panel::<F>(m, g0, gr, c0, len, panel, stage) };
                let steps = len.div_ceil(16);
                // The stored bytes the nest decodes next (this group's next chunk, the next
                // group's first, or the first group's again for the next block), named to the
                // prefetcher a few lines per tile, so that they arrive under the FMAs.
                let (nr, nc) = if c0 + CHUNK < cols {
                    (g0, c0 + CHUNK)
                } else if g0 + ROWS < rows.end {
                    (g0 + ROWS, 0)
                } else {
                    (rows.start, 0)
                };
                let nn = ROWS.min(rows.end - nr);
                let ahead: [&[u8]; ROWS] = std::array::from_fn(|i| {
                    if i < nn {
                        crate::wide::span(m, 0, nr + i, nc)
                    } else {
                        &[]
                    }
                });
                let row_lines = ahead[0].len().div_ceil(64).max(1);
                let (tiles, lines) = (16 * groups, nn * ahead[0].len().div_ceil(64));
                let (mut named, mut r, mut q) = (0, 0, 0);
                for l in 0..16 {
                    // Lane `l`'s micro-panels of this chunk, one per token group, in a row.
                    let lane = ((ch * 16 + l) * p.groups + b0 / GROUP_TOKENS) * MICRO;
                    let next_lane = lane + p.groups * MICRO;
                    for g in 0..groups {
                        let upto = (l * groups + g + 1) * lines / tiles;
                        while named < upto {
                            // Line `q` of row `r` (`named = r · row_lines + q`).
                            crate::arch::prefetch_line(ahead[r].as_ptr().wrapping_add(64 * q));
                            named += 1;
                            q += 1;
                            if q == row_lines {
                                (r, q) = (r + 1, 0);
                            }
                        }
                        // SAFETY: the CPU supports AVX-512F. Lane `l`'s slab lies inside the
                        // panel (`16 · PANEL_LANE`); the tile's accumulators inside `acc`
                        // (`l · lane_acc + 24 · 16 · (g + 1) <= ACC_FLOATS`, as
                        // `groups <= BLOCK / 6`); its activations, the micro-panel at
                        // `lane + g · MICRO` (`MICRO` floats), inside the pack, as
                        // `b0 / 6 + g < p.groups`.
                        unsafe {
                            let w = panel.as_ptr().add(l * PANEL_LANE);
                            let x = p.data.as_ptr().add(lane + g * MICRO);
                            let a = acc.as_mut_ptr().add(l * lane_acc + g * 24 * 16);
                            // The activations the next tile reads (the next group's in this
                            // lane, or the first group's in the next), named to L1 a tile
                            // ahead.
                            let next = if g + 1 < groups {
                                x.wrapping_add(MICRO)
                            } else {
                                p.data.as_ptr().wrapping_add(next_lane)
                            };
                            match (ch == 0, (gr - 1) / 16) {
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
                }
            }
            let views = crate::wide::group_rows::<F>(m, g0, gr);
            for g in 0..groups {
                for j in 0..GROUP_TOKENS {
                    let tok = g * GROUP_TOKENS + j;
                    if tok >= n {
                        break;
                    }
                    for v in (0..gr).step_by(16) {
                        // SAFETY: the CPU supports AVX-512F; the 16 lanes' vectors of the cell
                        // block lie at `(g · 24 + 4j + v / 16) · 16 + l · lane_acc`, inside
                        // `acc` (as for the tiles above).
                        let sums = unsafe {
                            reduce_lanes(acc.as_ptr().add((g * 24 + j * 4 + v / 16) * 16), lane_acc)
                        };
                        for (i, &s) in sums.iter().enumerate().take(gr - v) {
                            emit(b0 - tokens.start + tok, g0 + v + i, F::finish(views[v + i], s));
                        }
                    }
                }
            }
        }
    }
}

/// Decodes columns `c0 .. c0 + len` of rows `g0 .. g0 + gr` into the panel `P[l][k][r]`
/// (lane `l`'s slab at `l · PANEL_LANE`), 16 rows × [`SUB`] columns at a time through `stage`;
/// a row's last partial 16 columns are padded with +0.0. Rows past `gr` are left as they are
/// (their cells are never emitted).
///
/// # Safety
/// The CPU supports AVX-512F; `panel` and `stage` are at least [`PANEL_FLOATS`] and
/// [`STAGE_FLOATS`] long, on cache lines; `c0` is a multiple of [`CHUNK`] and
/// `len <= CHUNK` reaches the chunk's or the row's end.
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
                    unsafe { Avx512::decode::<F>(F::row(m, g0 + rb + i), c0 + s0, &mut dst[..sl]) };
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
                        _mm512_store_ps(panel.as_mut_ptr().add(l * PANEL_LANE + k * ROWS + rb), *v)
                    };
                }
            }
        }
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

/// The 16 lanes' vectors at `acc + l · lane` (each 16 rows' lane `l`) added in
/// [`crate::matmul::reduce16`]'s tree: lane `l` plus lane `l + 8`, then `+ 4`, `+ 2`, `+ 1`,
/// the lower lane the first operand. Returns the 16 rows' sums.
///
/// # Safety
/// The CPU supports AVX-512F; each of the 16 vectors is readable and on a cache line.
#[target_feature(enable = "avx512f")]
unsafe fn reduce_lanes(acc: *const f32, lane: usize) -> [f32; 16] {
    let mut q = [_mm512_setzero_ps(); 16];
    for (l, v) in q.iter_mut().enumerate() {
        // SAFETY: guaranteed by the caller.
        *v = unsafe { _mm512_load_ps(acc.add(l * lane)) };
    }
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            q[l] = _mm512_add_ps(q[l], q[l + w]);
        }
    }
    let mut out = [0.0f32; 16];
    // SAFETY: `out` holds 16 floats.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), q[0]) };
    out
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
