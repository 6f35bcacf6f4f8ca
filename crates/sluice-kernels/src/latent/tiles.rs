//! The tier bodies of the [`super`] sums: tiles of query sets × positions (the scores) and of
//! rows × latent columns (the weighted sums), their shapes chosen per tier.
//!
//! **Why sets.** A score sum costs one vector FMA per 4-byte key value and lane vector, so one
//! set of [`LANES`] rows reads a head's keys at 8 bytes a cycle at the FMA peak: a 2,048-position
//! prefill streamed them from the L3 cache for every eight rows and reached 45–50% of the f64 FMA
//! peak on a Zen 5 core. Grouped-query and latent attention give many query heads the same keys;
//! a tile of `S` sets (heads) × `P` positions reads each key once for all of them, and widens it
//! to f64 once (into a small buffer the FMAs broadcast from, so a key costs no conversion per
//! FMA). The weighted sums share each load of the matrix among `R` rows the same way, their
//! weights widened once per row group. No lane's sum changes its order: a tile only decides
//! which independent sums run side by side.
//!
//! **Reading ahead.** A decode step reads each layer's cache once, from memory, while the
//! weights of the layer before have just gone through the caches; its tiles consume a line every
//! few FMAs, too slowly for the hardware prefetchers to run far enough ahead, so the sums waited
//! on memory at a third of their rate from the caches. The calls of a decode step's shape (the
//! score sets left over from the `S`-set blocks, the weighted sums' first row group where the
//! call holds one vector of rows) name the rows of the next block of [`AHEAD`] positions to the
//! L2 prefetcher before each block; a prefill's calls, whose rows the caches already hold, name
//! nothing (naming lines the caches hold cost the weighted sums a third of their rate).

use super::LANES;

/// Positions of the matrix named to the prefetcher at a time, a block ahead of the tiles that
/// read them, in the calls that read it from memory (a decode step's: see [`name_rows`]).
const AHEAD: usize = 32;

/// Values of each position a score tile widens to f64 at a time.
const WIDEN: usize = 32;

/// [`super::dot_sets_on`] on one tier: blocks of `S` sets over `P` positions at a time (then
/// single positions), the sets left over one at a time over `P1` positions.
#[inline(always)]
pub(super) fn dot_sets<const S: usize, const P: usize, const P1: usize, const FUSED: bool>(
    q: &[[f32; LANES]],
    sets: usize,
    (m, stride): (&[f32], usize),
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    // Every query value widened to f64 once per call (in this thread's kept buffer, taken out
    // of it: a closure would compile the tiles without the tier's features), not once per tile
    // of positions: converting them at every use cost a conversion per `P` FMAs and held the
    // AVX-512 scores of 4 sets at 63% of the f64 peak (85 → 120 GFLOP/s widened).
    let mut wide = crate::kept::take(&WIDE_Q);
    wide.clear();
    wide.extend(q.iter().map(|v| Lane(v.map(f64::from))));
    dot_sets_wide::<S, P, P1, FUSED>(&wide, sets, (m, stride), npos, out);
    crate::kept::give_back(&WIDE_Q, wide);
}

thread_local! {
    /// This thread's widened query lanes ([`dot_sets`]), kept for its life.
    static WIDE_Q: std::cell::RefCell<Vec<Lane>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A query lane vector widened to f64, on a cache line of its own (a vector that straddled
/// two lines cost the AVX-512 scores a tenth of their rate).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Lane([f64; LANES]);

/// [`dot_sets`] on the widened query lanes `q`.
#[inline(always)]
fn dot_sets_wide<const S: usize, const P: usize, const P1: usize, const FUSED: bool>(
    q: &[Lane],
    sets: usize,
    (m, stride): (&[f32], usize),
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    let w = q.len().checked_div(sets).unwrap_or(0);
    let mut s = 0;
    while s + S <= sets {
        let out = &mut out[s * npos..(s + S) * npos];
        sets_over_positions::<S, P, FUSED, false>(
            &q[s * w..(s + S) * w],
            w,
            (m, stride),
            npos,
            out,
        );
        s += S;
    }
    // Sets left over one at a time: a decode step's few heads, whose keys come from memory.
    while s < sets {
        let out = &mut out[s * npos..(s + 1) * npos];
        sets_over_positions::<1, P1, FUSED, true>(
            &q[s * w..(s + 1) * w],
            w,
            (m, stride),
            npos,
            out,
        );
        s += 1;
    }
}

/// `S` sets of `w` lane vectors (`q`, set-major) against positions `0..npos` of `m`, `P` at a
/// time; set `s`'s sums go to `out[s · npos ..][.. npos]`. Where `NAME`, each block of
/// [`AHEAD`] positions names the next block's rows to the prefetcher first.
#[inline(always)]
fn sets_over_positions<const S: usize, const P: usize, const FUSED: bool, const NAME: bool>(
    q: &[Lane],
    w: usize,
    (m, stride): (&[f32], usize),
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    let mut pos = 0;
    if NAME {
        name_rows(m, (stride, w), 0..AHEAD.min(npos));
    }
    while pos + P <= npos {
        if NAME && pos % AHEAD < P {
            let next = pos - pos % AHEAD + AHEAD;
            name_rows(m, (stride, w), next..(next + AHEAD).min(npos));
        }
        let rows: [&[f32]; P] = std::array::from_fn(|j| &m[(pos + j) * stride..][..w]);
        for (s, acc) in tile::<S, P, FUSED>(q, w, rows).iter().enumerate() {
            out[s * npos + pos..][..P].copy_from_slice(acc);
        }
        pos += P;
    }
    while pos < npos {
        for (s, acc) in tile::<S, 1, FUSED>(q, w, [&m[pos * stride..][..w]]).iter().enumerate() {
            out[s * npos + pos] = acc[0];
        }
        pos += 1;
    }
}

/// The sums of `S` sets × `P` positions (`rows`, each `w` long): [`WIDEN`] values of each
/// position widened to f64 at a time, then for each index `a` every set's lane values (widened)
/// multiplied by each position's value at `a`, broadcast. Each lane adds its products in
/// increasing `a` from `-0.0`.
#[inline(always)]
fn tile<const S: usize, const P: usize, const FUSED: bool>(
    q: &[Lane],
    w: usize,
    rows: [&[f32]; P],
) -> [[[f64; LANES]; P]; S] {
    let mut acc = [[[-0.0f64; LANES]; P]; S];
    let mut wide = [[0.0f64; WIDEN]; P];
    for a0 in (0..w).step_by(WIDEN) {
        let n = WIDEN.min(w - a0);
        for (wd, row) in wide.iter_mut().zip(&rows) {
            for (d, &v) in wd[..n].iter_mut().zip(&row[a0..a0 + n]) {
                *d = f64::from(v);
            }
        }
        for a in 0..n {
            for (s, acc) in acc.iter_mut().enumerate() {
                let qv = q[s * w + a0 + a].0;
                for (acc, wd) in acc.iter_mut().zip(&wide) {
                    let mv = wd[a];
                    for (x, &y) in acc.iter_mut().zip(&qv) {
                        *x = madd::<FUSED>(y, mv, *x);
                    }
                }
            }
        }
    }
    acc
}

/// [`super::weighted_rows_on`] on one tier: groups of `R` rows whose common weights are widened
/// to f64 once (`WIDE`), then groups of 4, then single rows; `C` columns a tile.
#[inline(always)]
pub(super) fn weighted_rows<const R: usize, const C: usize, const WIDE: bool, const FUSED: bool>(
    p: &[&[f32]],
    m: &[f32],
    (stride, width): (usize, usize),
    out: &mut [f32],
) {
    let mut wide = Vec::new();
    let mut r = 0;
    // A decode step's few rows (one vector of lanes) read the values from memory, once.
    if p.len() <= LANES && R <= p.len() {
        let out = &mut out[..R * width];
        row_group::<R, C, WIDE, FUSED, true>(&p[..R], m, (stride, width), out, &mut wide);
        r = R;
    }
    while r + R <= p.len() {
        let out = &mut out[r * width..(r + R) * width];
        row_group::<R, C, WIDE, FUSED, false>(&p[r..r + R], m, (stride, width), out, &mut wide);
        r += R;
    }
    while r + 4 <= p.len() {
        let out = &mut out[r * width..(r + 4) * width];
        row_group::<4, C, WIDE, FUSED, false>(&p[r..r + 4], m, (stride, width), out, &mut wide);
        r += 4;
    }
    while r < p.len() {
        let out = &mut out[r * width..(r + 1) * width];
        row_group::<1, C, false, FUSED, false>(&p[r..=r], m, (stride, width), out, &mut wide);
        r += 1;
    }
}

/// `R` rows of the weighted sums: `C` columns at a time, the terms all `R` rows have sharing each
/// load of `m` (their weights widened once into `wide`, row after row, where `WIDE`), then each row's
/// own remaining terms, then the columns left over one at a time. Each column's sum adds its
/// terms in increasing index whichever part of the loop adds them. Where `NAME`, the joint
/// terms name each tile's values a block of [`AHEAD`] positions ahead to the prefetcher.
#[inline(always)]
fn row_group<
    const R: usize,
    const C: usize,
    const WIDE: bool,
    const FUSED: bool,
    const NAME: bool,
>(
    p: &[&[f32]],
    m: &[f32],
    (stride, width): (usize, usize),
    out: &mut [f32],
    wide: &mut Vec<f64>,
) {
    let joint = p.iter().map(|r| r.len()).min().unwrap_or(0);
    if WIDE {
        wide.clear();
        wide.resize(joint * R, 0.0);
        for (r, pr) in p.iter().enumerate() {
            for (i, &v) in pr[..joint].iter().enumerate() {
                wide[r * joint + i] = f64::from(v);
            }
        }
    }
    let mut a0 = 0;
    while a0 + C <= width {
        let mut acc = [[0.0f64; C]; R];
        joint_terms::<R, C, WIDE, FUSED, NAME>(p, (m, stride, a0), joint, wide, &mut acc);
        for (acc, pr) in acc.iter_mut().zip(p) {
            for (i, &pi) in pr.iter().enumerate().skip(joint) {
                let pv = f64::from(pi);
                for (a, &lv) in acc.iter_mut().zip(&m[i * stride + a0..][..C]) {
                    *a = madd::<FUSED>(pv, f64::from(lv), *a);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (o, &a) in out[r * width + a0..][..C].iter_mut().zip(acc) {
                #[allow(clippy::cast_possible_truncation)]
                {
                    *o = a as f32;
                }
            }
        }
        a0 += C;
    }
    columns_one_at_a_time::<FUSED>(p, (m, stride, width), a0, out);
}

/// Columns `a0..width` of every row of `p` (`out [p.len()][width]`), one sum at a time: from
/// +0.0, every term in increasing position.
#[inline(always)]
pub(super) fn columns_one_at_a_time<const FUSED: bool>(
    p: &[&[f32]],
    (m, stride, width): (&[f32], usize, usize),
    a0: usize,
    out: &mut [f32],
) {
    for a in a0..width {
        for (r, pr) in p.iter().enumerate() {
            let mut acc = 0.0f64;
            for (i, &pi) in pr.iter().enumerate() {
                acc = madd::<FUSED>(f64::from(pi), f64::from(m[i * stride + a]), acc);
            }
            #[allow(clippy::cast_possible_truncation)]
            {
                out[r * width + a] = acc as f32;
            }
        }
    }
}

/// Adds to `out` the first `joint` terms of columns `a0 .. a0 + C` for the `R` rows of `p`
/// (their weights from `wide`, row after row, where `WIDE`). Each widened row is read through
/// its own slice: read as one position-major block, the compiler vectorized across the rows
/// (gathers and scatters of the accumulators, 3% of the FMA peak), and a loop that also held
/// the rows' own remaining terms stored half the accumulators to the stack on every term.
#[inline(always)]
fn joint_terms<
    const R: usize,
    const C: usize,
    const WIDE: bool,
    const FUSED: bool,
    const NAME: bool,
>(
    p: &[&[f32]],
    (m, stride, a0): (&[f32], usize, usize),
    joint: usize,
    wide: &[f64],
    out: &mut [[f64; C]; R],
) {
    let mut acc = *out;
    if NAME && WIDE {
        // The same sums block by block of positions, each block first naming the next one's
        // values of this tile (one line a position) to the prefetcher.
        let rows: [&[f64]; R] = std::array::from_fn(|r| &wide[r * joint..][..joint]);
        let tile = &m[a0..];
        name_rows(tile, (stride, C), 0..AHEAD.min(joint));
        for b0 in (0..joint).step_by(AHEAD) {
            let b1 = (b0 + AHEAD).min(joint);
            name_rows(tile, (stride, C), b1..(b1 + AHEAD).min(joint));
            for i in b0..b1 {
                let l = widened::<C>(&m[i * stride + a0..]);
                for (acc, pw) in acc.iter_mut().zip(&rows) {
                    let pv = pw[i];
                    for (a, &lv) in acc.iter_mut().zip(&l) {
                        *a = madd::<FUSED>(pv, lv, *a);
                    }
                }
            }
        }
    } else if WIDE {
        let rows: [&[f64]; R] = std::array::from_fn(|r| &wide[r * joint..][..joint]);
        for i in 0..joint {
            let l = widened::<C>(&m[i * stride + a0..]);
            for (acc, pw) in acc.iter_mut().zip(&rows) {
                let pv = pw[i];
                for (a, &lv) in acc.iter_mut().zip(&l) {
                    *a = madd::<FUSED>(pv, lv, *a);
                }
            }
        }
    } else {
        for i in 0..joint {
            let l = widened::<C>(&m[i * stride + a0..]);
            for (acc, pr) in acc.iter_mut().zip(p) {
                let pv = f64::from(pr[i]);
                for (a, &lv) in acc.iter_mut().zip(&l) {
                    *a = madd::<FUSED>(pv, lv, *a);
                }
            }
        }
    }
    *out = acc;
}

/// Names rows `range` of `m` (`w` values each, `stride` apart; one cache line every 16 values)
/// to the L2 prefetcher; changes no result. A decode step reads its layer's cache once, from
/// memory, where a tile that consumes a line every few FMAs left the hardware prefetchers too
/// little ahead of it: on a Zen 5 core, one KV head's 2,048 positions in rows of 512 floats
/// scored at 21–24 GFLOP/s from memory against 65–70 from the caches, where reading the same
/// bytes alone runs at 28 GB/s (`attention_sums cold`). The L2, not the L1: rows 2 KB apart
/// fall in two sets of the L1's 64, so a block named into it evicts itself.
#[inline(always)]
pub(super) fn name_rows(m: &[f32], (stride, w): (usize, usize), range: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    for pos in range {
        let row = m[pos * stride..].as_ptr();
        for a in (0..w).step_by(16) {
            crate::arch::prefetch_line(row.wrapping_add(a).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (m, stride, w, range);
}

/// The first `C` values of `row` widened to f64 (a function, not a closure: a closure is
/// compiled without the calling body's target features).
#[inline(always)]
fn widened<const C: usize>(row: &[f32]) -> [f64; C] {
    let row: &[f32; C] = row[..C].try_into().expect("invariant: a slice of C values");
    row.map(f64::from)
}

/// `acc + a · b` for `a`, `b` widened from f32: fused where the tier has FMA, since their
/// product is exact in f64 and rounding it first changes nothing (both give the same bits).
#[inline(always)]
fn madd<const FUSED: bool>(a: f64, b: f64, acc: f64) -> f64 {
    if FUSED {
        a.mul_add(b, acc)
    } else {
        acc + a * b
    }
}
