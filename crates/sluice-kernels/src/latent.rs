//! The f64 sums of absorbed latent attention (MLA), many independent sums at a time.
//!
//! Absorbed MLA (Kimi K3, DeepSeek V3) spends its time outside the matrix kernels in three
//! sums per (row, head), each accumulated in f64 in index order like [`crate::ops::dot_f64`]:
//! the query absorbed into the latent space (`q_lat[a] = Σ_i q_nope[i] · W_UK[i, a]`), the
//! scores (`q_lat · lat[pos] + q_pe · pe[pos]`) and the context (`ctx[a] = Σ_pos p[pos] ·
//! lat[pos, a]`). Taken one sum at a time, a dot product is a chain of dependent f64
//! additions that runs at one addition per add latency whatever the vector width, and the
//! column sums ran two lanes wide (the baseline x86-64 build has SSE2 only).
//!
//! Here each vector lane carries a sum of its own, so no sum changes its order:
//! [`weighted_rows`] puts latent columns in the lanes (the context and the absorbed query, a few
//! rows sharing each load of a matrix row), [`dot_lanes`] puts [`LANES`] rows of the pass in the
//! lanes (the scores, each position's values broadcast to all of them), [`dot_sets_strided`]
//! runs several such sets (heads that share their keys) over one read of the keys, and
//! [`attend`] runs one
//! head's absorbed attention for up to [`LANES`] rows on them (the families multiply its context
//! by their W_UV). Every lane adds the same
//! products in the same order as the one-at-a-time sum, starting from the same zero (`+0.0` for
//! the column sums, as the model code started them; `-0.0` for the dot products, as
//! `Iterator::sum` starts), and the product of two f32 values is exact in f64, so every result
//! is bit for bit the one-at-a-time result on every tier (so is a fused multiply-add, which the
//! AVX tiers use: rounding an exact product first changes nothing). The bodies are plain Rust
//! compiled once per tier under `#[target_feature]` and picked by [`crate::isa::isa`]; their
//! tiles (how many sets, positions, rows and columns run side by side) are the tier's
//! (`tiles`). No closure does arithmetic in them: a closure is compiled without the tier's
//! features (an FMA in one became a call to the C library's `fma`, 25x slower).

use crate::isa::{self, Isa};
use crate::ops::softmax_inplace;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod tiles;

/// Rows of the pass whose dot products share one vector in [`dot_lanes`].
pub const LANES: usize = 8;

/// `out[r · width + a] = f32(Σ_{i < p[r].len()} f64(p[r][i]) · f64(m[i · width + a]))` for
/// every row `r` of `p` and column `a < width`, each sum taken from `+0.0` in increasing `i`.
/// Rows may have different lengths (causal attention: row `r` weighs its own positions).
///
/// # Panics
/// If a row of `p` is longer than `m` has rows of `width`, or `out` is not `p.len() · width`
/// long.
pub fn weighted_rows(p: &[&[f32]], m: &[f32], width: usize, out: &mut [f32]) {
    weighted_rows_with(isa::isa(), p, m, width, out);
}

/// [`weighted_rows`] over matrix rows `stride` values apart (`m[i · stride + a]`, `a < width`):
/// one head's values in a cache that holds every head of a position side by side.
///
/// # Panics
/// As [`weighted_rows`] (a row of `p` weighing more rows than `m` holds), and if `stride <
/// width`.
pub fn weighted_rows_strided(
    p: &[&[f32]],
    m: &[f32],
    stride: usize,
    width: usize,
    out: &mut [f32],
) {
    weighted_rows_on(isa::isa(), p, m, stride, width, out);
}

/// [`weighted_rows`] on an explicit tier (tests run every [`Isa::available`] one).
///
/// # Panics
/// As [`weighted_rows`], and if the running CPU does not support `isa`.
pub fn weighted_rows_with(isa: Isa, p: &[&[f32]], m: &[f32], width: usize, out: &mut [f32]) {
    weighted_rows_on(isa, p, m, width, width, out);
}

/// [`weighted_rows_strided`] on an explicit tier.
///
/// # Panics
/// As [`weighted_rows_strided`], and if the running CPU does not support `isa`.
pub fn weighted_rows_on(
    isa: Isa,
    p: &[&[f32]],
    m: &[f32],
    stride: usize,
    width: usize,
    out: &mut [f32],
) {
    assert_eq!(out.len(), p.len() * width, "weighted_rows: out length");
    assert!(stride >= width, "weighted_rows: rows overlap");
    let n = p.iter().map(|r| r.len()).max().unwrap_or(0);
    assert!(
        n == 0 || (n - 1) * stride + width <= m.len(),
        "weighted_rows: a row weighs more rows than the matrix has"
    );
    crate::isa::on_tier!(isa, "weighted_rows", (
        p: &[&[f32]], m: &[f32], stride: usize, width: usize, out: &mut [f32],
    ) {
        avx512("avx512f,fma") => tiles::weighted_rows::<8, 16, true, true>(p, m, (stride, width), out),
        avx2("avx2,fma") => if p.len() > LANES {
            // SAFETY: this arm runs on AVX2 and FMA; the lengths are asserted above.
            unsafe { avx2::weighted_rows_blocked(p, m, (stride, width), out, &mut Vec::new()) }
        } else {
            tiles::weighted_rows::<4, 16, true, true>(p, m, (stride, width), out)
        },
        _ => tiles::weighted_rows::<4, 16, false, false>(p, m, (stride, width), out),
    });
}

/// `out[pos][l] = Σ_{a < q.len()} f64(q[a][l]) · f64(m[pos · q.len() + a])` for `pos < npos`
/// and every lane `l`, each sum taken from `-0.0` in increasing `a`: for each lane, what
/// [`crate::ops::dot_f64`] of the lane's vector (column `l` of `q`) and row `pos` of `m`
/// returns. Lanes a caller does not use may hold anything (zeros cost nothing extra).
///
/// # Panics
/// If `m` has fewer than `npos` rows of `q.len()` values, or `out` is shorter than `npos`.
pub fn dot_lanes(q: &[[f32; LANES]], m: &[f32], npos: usize, out: &mut [[f64; LANES]]) {
    dot_lanes_with(isa::isa(), q, m, npos, out);
}

/// [`dot_lanes`] over matrix rows `stride` values apart (row `pos` is `m[pos · stride ..][..
/// q.len()]`): one head's keys in a cache that holds every head of a position side by side.
///
/// # Panics
/// If `m` is too short for `npos` such rows, `stride < q.len()`, or `out` is shorter than `npos`.
pub fn dot_lanes_strided(
    q: &[[f32; LANES]],
    m: &[f32],
    stride: usize,
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    dot_lanes_on(isa::isa(), q, m, stride, npos, out);
}

/// [`dot_lanes`] on an explicit tier (tests run every [`Isa::available`] one).
///
/// # Panics
/// As [`dot_lanes`], and if the running CPU does not support `isa`.
pub fn dot_lanes_with(
    isa: Isa,
    q: &[[f32; LANES]],
    m: &[f32],
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    dot_lanes_on(isa, q, m, q.len(), npos, out);
}

/// [`dot_lanes_strided`] on an explicit tier.
///
/// # Panics
/// As [`dot_lanes_strided`], and if the running CPU does not support `isa`.
pub fn dot_lanes_on(
    isa: Isa,
    q: &[[f32; LANES]],
    m: &[f32],
    stride: usize,
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    assert!(out.len() >= npos, "dot_lanes: out length");
    dot_sets_on(isa, q, 1, m, stride, npos, &mut out[..npos]);
}

/// [`dot_lanes_strided`] for `sets` query sets that share the matrix rows (the heads of one KV
/// head, or every head of latent attention): `q` holds the sets one after another, `q.len() /
/// sets` lane vectors each, and set `s`'s sums go to `out[s · npos ..][.. npos]`. Each sum is
/// the one [`dot_lanes_strided`] of its set alone gives, bit for bit; the sets only share the
/// loads (and widenings) of the matrix values.
///
/// # Panics
/// If `q.len()` is not a multiple of `sets`, `m` is too short for `npos` rows `stride` apart,
/// `stride` is less than a set's width, or `out` is shorter than `sets · npos`.
pub fn dot_sets_strided(
    q: &[[f32; LANES]],
    sets: usize,
    m: &[f32],
    stride: usize,
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    dot_sets_on(isa::isa(), q, sets, m, stride, npos, out);
}

/// [`dot_sets_strided`] on an explicit tier.
///
/// # Panics
/// As [`dot_sets_strided`], and if the running CPU does not support `isa`.
pub fn dot_sets_on(
    isa: Isa,
    q: &[[f32; LANES]],
    sets: usize,
    m: &[f32],
    stride: usize,
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    let w = q.len().checked_div(sets).unwrap_or(0);
    assert_eq!(w * sets, q.len(), "dot_sets: the sets differ in width");
    assert!(stride >= w, "dot_lanes: rows overlap");
    assert!(
        npos == 0 || (npos - 1) * stride + w <= m.len(),
        "dot_lanes: fewer matrix rows than positions"
    );
    assert!(out.len() >= sets * npos, "dot_lanes: out length");
    crate::isa::on_tier!(isa, "dot_lanes", (
        q: &[[f32; LANES]], sets: usize, m: &[f32], stride: usize, npos: usize,
        out: &mut [[f64; LANES]],
    ) {
        avx512("avx512f,fma") => tiles::dot_sets::<4, 4, 8, true>(q, sets, (m, stride), npos, out),
        avx2("avx2,fma") => tiles::dot_sets::<2, 2, 4, true>(q, sets, (m, stride), npos, out),
        _ => tiles::dot_sets::<2, 2, 4, false>(q, sets, (m, stride), npos, out),
    });
}

/// Positions whose scores a group sums at a time.
const SPAN: usize = 64;

/// The sizes of one head's absorbed attention ([`attend`]).
pub struct Absorbed {
    /// Query no-position width (rows of W_UK).
    pub nope: usize,
    /// Rotary (or NoPE `k_pe`) width.
    pub rope: usize,
    /// Latent width (`kv_lora_rank`).
    pub kl: usize,
    /// Score scale.
    pub scale: f32,
}

/// Computes `ctx [g, kl]` for the `g ≤ LANES` rows whose queries (`nope + rope` values each,
/// no-position part first) `q_rows` holds, one head: row `l` attends to positions `0 ..=
/// first + l` of the cache `lat [positions, kl]`, `pe [positions, rope]`. `w_uk` is the
/// head's W_UK widened to f32, `[nope, kl]`. Each row's result is what the one-row sums give:
/// `q_lat` from +0.0 in increasing nope index, rounded to f32; each score the f64 sum of the two
/// dot products (each from −0.0 in index order, as [`crate::ops::dot_f64`]), rounded to f32 and
/// scaled; [`softmax_inplace`]; `ctx` from +0.0 in increasing position, rounded to f32.
///
/// # Panics
/// If `q_rows` holds more than [`LANES`] rows, a row is shorter than `nope + rope`, or the cache
/// holds fewer than `first + q_rows.len()` positions.
pub fn attend(
    d: &Absorbed,
    q_rows: &[&[f32]],
    w_uk: &[f32],
    lat: &[f32],
    pe: &[f32],
    first: usize,
    ctx: &mut [f32],
) {
    attend_heads(d, q_rows, &[w_uk], lat, pe, first, ctx);
}

/// [`attend`] for several heads of the same rows side by side (`w_uk.len()` heads; `q_rows`
/// holds each head's `g ≤ LANES` rows after the previous head's, and `ctx [heads · g, kl]`
/// receives them in that order): every head reads the same cache, so the heads' scores take
/// each cached value from memory and widen it once for all of them ([`dot_sets_strided`]) and
/// their weighted sums share each load of a latent row ([`weighted_rows`]). The (head, row)
/// pairs fill the lanes in order, so a decode step's single rows of eight heads share one lane
/// vector. Each row's result is bit for bit its [`attend`] result.
///
/// # Panics
/// As [`attend`], and if `q_rows` is not `heads · g` rows or `ctx` not `heads · g · kl` values.
pub fn attend_heads(
    d: &Absorbed,
    q_rows: &[&[f32]],
    w_uk: &[&[f32]],
    lat: &[f32],
    pe: &[f32],
    first: usize,
    ctx: &mut [f32],
) {
    let (nope, rope, kl) = (d.nope, d.rope, d.kl);
    let heads = w_uk.len();
    let g = q_rows.len().checked_div(heads).unwrap_or(0);
    assert_eq!(g * heads, q_rows.len(), "attend: the heads hold different numbers of rows");
    assert!(g <= LANES, "attend: a group holds at most LANES rows");
    // q_lat = W_UKᵀ q_nope per head (sum over the nope index in order), rounded to f32.
    let mut q_lat = vec![0.0f32; heads * g * kl];
    for ((rows, w), q_lat) in q_rows.chunks(g.max(1)).zip(w_uk).zip(q_lat.chunks_mut(g * kl)) {
        let q_nope: Vec<&[f32]> = rows.iter().map(|r| &r[..nope]).collect();
        weighted_rows(&q_nope, w, kl, q_lat);
    }
    // The (head, row) pairs in lanes, in order: pair `j` (head `j / g`, row `j % g`) is lane
    // `j % LANES` of lane set `j / LANES` (unused lanes stay zero). A decode step's one row
    // per head fills a set with eight heads instead of leaving seven lanes multiplying zeros.
    let sets = (heads * g).div_ceil(LANES);
    let mut q_lanes = vec![[0.0f32; LANES]; sets * kl];
    let mut pe_lanes = vec![[0.0f32; LANES]; sets * rope];
    for (j, row) in q_rows.iter().enumerate() {
        let (s, l) = (j / LANES, j % LANES);
        for (a, v) in q_lanes[s * kl..(s + 1) * kl].iter_mut().enumerate() {
            v[l] = q_lat[j * kl + a];
        }
        for (i, v) in pe_lanes[s * rope..(s + 1) * rope].iter_mut().enumerate() {
            v[l] = row[nope + i];
        }
    }
    // score = q_lat·lat[pos] + q_pe·pe[pos] (each an f64 dot), rounded to f32, then scaled.
    let npos = first + g;
    let mut probs: Vec<Vec<f32>> =
        (0..heads * g).map(|j| Vec::with_capacity(first + j % g + 1)).collect();
    let (mut s_lat, mut s_pe) =
        (vec![[0.0f64; LANES]; sets * SPAN], vec![[0.0f64; LANES]; sets * SPAN]);
    for p0 in (0..npos).step_by(SPAN) {
        let n = SPAN.min(npos - p0);
        dot_sets_strided(&q_lanes, sets, &lat[p0 * kl..], kl, n, &mut s_lat[..sets * n]);
        dot_sets_strided(&pe_lanes, sets, &pe[p0 * rope..], rope, n, &mut s_pe[..sets * n]);
        for (j, scores) in probs.iter_mut().enumerate() {
            let (s, l) = (j / LANES, j % LANES);
            let upto = (first + j % g + 1).saturating_sub(p0).min(n);
            let (a, b) = (&s_lat[s * n..][..upto], &s_pe[s * n..][..upto]);
            scores.extend(a.iter().zip(b).map(|(a, b)| {
                #[allow(clippy::cast_possible_truncation)]
                let s = (a[l] + b[l]) as f32;
                s * d.scale
            }));
        }
    }
    for scores in &mut probs {
        softmax_inplace(scores);
    }
    // ctx = Σ p·lat over each row's positions in order.
    let p: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
    weighted_rows(&p, lat, kl, ctx);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dot_f64;

    /// Values with a wide exponent range, some zeros of either sign, so that the order of the
    /// additions shows in the last bits.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let k = u32::try_from(i).unwrap_or(0).wrapping_mul(2_654_435_761) ^ seed;
                match k % 17 {
                    0 => 0.0,
                    1 => -0.0,
                    _ => {
                        let e = f32::from(u16::try_from(k % 23).unwrap_or(0)) - 11.0;
                        let s = f32::from(u16::try_from(k % 1000).unwrap_or(0)) / 1000.0 - 0.5;
                        s * e.exp2()
                    }
                }
            })
            .collect()
    }

    /// The weighted sums one at a time: row `r`, column `a` of `[p.len(), width]` is
    /// `Σ_i p[r][i] · m[i · stride + a]` in f64 from `+0.0` in increasing `i`, rounded to f32.
    fn one_sum_at_a_time(p: &[&[f32]], m: &[f32], stride: usize, width: usize) -> Vec<f32> {
        let mut want = vec![0.0f32; p.len() * width];
        for (r, pr) in p.iter().enumerate() {
            for a in 0..width {
                let mut acc = 0.0f64;
                for (i, &x) in pr.iter().enumerate() {
                    acc += f64::from(x) * f64::from(m[i * stride + a]);
                }
                #[allow(clippy::cast_possible_truncation)]
                {
                    want[r * width + a] = acc as f32;
                }
            }
        }
        want
    }

    #[test]
    fn weighted_rows_match_one_sum_at_a_time_on_every_tier() {
        for (rows, width, n) in [
            (1, 16, 1),
            (3, 37, 5),
            (4, 512, 9),
            (9, 33, 17),
            (6, 64, 3),
            (13, 128, 20),
            (17, 48, 9),
            (33, 16, 5),
        ] {
            let m = values(n * width, 7);
            let lens: Vec<usize> = (0..rows).map(|r| (n + r) % (n + 1)).collect();
            let pv: Vec<Vec<f32>> =
                lens.iter().zip(0u32..).map(|(&l, r)| values(l, 100 + r)).collect();
            let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
            let want = one_sum_at_a_time(&p, &m, width, width);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; rows * width];
                weighted_rows_with(isa, &p, &m, width, &mut got);
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{isa} {rows}x{width}x{n} at {j}");
                }
            }
        }
    }

    #[test]
    fn avx2_prefill_sums_read_every_position_once_a_row_group_from_two_l1_sets_now_blocks_same_bits(
    ) {
        // A prefill part's shape: several sets of eight causal rows of one KV head, its 128
        // values in cache rows of 512 (2 KiB apart), over positions that cross several of the
        // AVX2 tier's blocks; odd row counts, rows shorter than their pair's partner, a width
        // with a partial last tile, and rows shorter than a block.
        for (rows, width, stride, n) in [
            (32, 128, 512, 100),
            (9, 128, 512, 70),
            (16, 40, 48, 65),
            (11, 16, 16, 33),
            (24, 128, 512, 20),
        ] {
            let m = values(n * stride, 11);
            let lens: Vec<usize> = (0..rows).map(|r| n - (r * 5) % 9).collect();
            let pv: Vec<Vec<f32>> =
                lens.iter().zip(0u32..).map(|(&l, r)| values(l, 300 + r)).collect();
            let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
            let want = one_sum_at_a_time(&p, &m, stride, width);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; rows * width];
                weighted_rows_on(isa, &p, &m, stride, width, &mut got);
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{isa} {rows}x{width}x{n} at {j}");
                }
            }
        }
    }

    #[test]
    fn a_decode_steps_sums_read_from_memory_now_name_blocks_ahead_same_bits() {
        // A decode step's shape (one vector of rows, rows of equal length, a head's values in
        // a wider row): the sums name their rows to the prefetcher a block of 32 positions
        // ahead, so lengths around and across blocks; every sum is the one-at-a-time sum.
        let (width, stride) = (48, 80);
        for (rows, n) in [(8, 31), (8, 32), (8, 33), (8, 97), (5, 70), (1, 65)] {
            let m = values(n * stride, 21);
            let pv: Vec<Vec<f32>> = (0..rows).zip(400u32..).map(|(_, s)| values(n, s)).collect();
            let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
            let q: Vec<[f32; LANES]> =
                (0..width).map(|a| std::array::from_fn(|l| pv[l % rows][a % n])).collect();
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; rows * width];
                weighted_rows_on(isa, &p, &m, stride, width, &mut got);
                let mut dots = vec![[f64::NAN; LANES]; n];
                dot_sets_on(isa, &q, 1, &m, stride, n, &mut dots);
                let want = one_sum_at_a_time(&p, &m, stride, width);
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{isa} {rows}x{n} at {j}");
                }
                for (pos, d) in dots.iter().enumerate() {
                    for (l, &dl) in d.iter().enumerate() {
                        let col: Vec<f32> = q.iter().map(|v| v[l]).collect();
                        let want = dot_f64(&col, &m[pos * stride..][..width]);
                        assert_eq!(dl.to_bits(), want.to_bits(), "{isa} score {pos} lane {l}");
                    }
                }
            }
        }
    }

    #[test]
    fn dot_lanes_match_dot_f64_on_every_tier() {
        for (w, npos) in [(1, 1), (64, 3), (512, 9), (37, 4), (33, 17)] {
            let m = values(npos * w, 3);
            let cols: Vec<Vec<f32>> = (50u32..).take(LANES).map(|seed| values(w, seed)).collect();
            let q: Vec<[f32; LANES]> =
                (0..w).map(|a| std::array::from_fn(|l| cols[l][a])).collect();
            for isa in Isa::available() {
                let mut got = vec![[f64::NAN; LANES]; npos];
                dot_lanes_with(isa, &q, &m, npos, &mut got);
                for (pos, g) in got.iter().enumerate() {
                    for (l, col) in cols.iter().enumerate() {
                        let want = dot_f64(col, &m[pos * w..(pos + 1) * w]);
                        assert_eq!(
                            g[l].to_bits(),
                            want.to_bits(),
                            "{isa} w {w} pos {pos} lane {l}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_heads_read_their_shared_keys_once_per_head_now_once_per_set_of_heads() {
        // Sets of query lanes against the same strided rows: each set's sums are its own
        // `dot_lanes` sums, whatever the tier's tile of sets and positions (and the widened
        // blocks of a row: widths around a block's 32 values).
        for (sets, w, stride, npos) in
            [(1, 31, 31, 3), (4, 32, 40, 9), (5, 33, 33, 5), (8, 128, 512, 13), (9, 64, 96, 2)]
        {
            let m = values(npos * stride, 11);
            let cols: Vec<Vec<f32>> =
                (300u32..).take(LANES * sets).map(|seed| values(w, seed)).collect();
            let cols = &cols;
            let q: Vec<[f32; LANES]> = (0..sets)
                .flat_map(|s| (0..w).map(move |a| std::array::from_fn(|l| cols[s * LANES + l][a])))
                .collect::<Vec<_>>();
            for isa in Isa::available() {
                let mut got = vec![[f64::NAN; LANES]; sets * npos];
                dot_sets_on(isa, &q, sets, &m, stride, npos, &mut got);
                for s in 0..sets {
                    for pos in 0..npos {
                        for l in 0..LANES {
                            let want = dot_f64(&cols[s * LANES + l], &m[pos * stride..][..w]);
                            let g = got[s * npos + pos][l];
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{isa} {sets}x{w} {s} {pos} {l}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_query_attention_summed_one_f64_at_a_time_now_a_head_in_strided_lanes() {
        // One head's keys and values inside a cache row of every KV head (Qwen3's layout):
        // rows `stride` apart from the head's offset, each sum still the one-at-a-time one.
        for (w, stride, off, npos) in [(64, 256, 128, 9), (37, 40, 3, 5), (128, 512, 0, 17)] {
            let m = values(npos * stride, 9);
            let head = &m[off..];
            let cols: Vec<Vec<f32>> = (70u32..).take(LANES).map(|seed| values(w, seed)).collect();
            let q: Vec<[f32; LANES]> =
                (0..w).map(|a| std::array::from_fn(|l| cols[l][a])).collect();
            let pv: Vec<Vec<f32>> = (1..=npos).zip(200u32..).map(|(l, s)| values(l, s)).collect();
            let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
            for isa in Isa::available() {
                let mut got = vec![[f64::NAN; LANES]; npos];
                dot_lanes_on(isa, &q, head, stride, npos, &mut got);
                for (pos, g) in got.iter().enumerate() {
                    for (l, col) in cols.iter().enumerate() {
                        let want = dot_f64(col, &head[pos * stride..][..w]);
                        assert_eq!(g[l].to_bits(), want.to_bits(), "{isa} dot {w}/{stride} {pos}");
                    }
                }
                let mut out = vec![f32::NAN; npos * w];
                weighted_rows_on(isa, &p, head, stride, w, &mut out);
                let want = one_sum_at_a_time(&p, head, stride, w);
                for (j, (o, v)) in out.iter().zip(&want).enumerate() {
                    assert_eq!(o.to_bits(), v.to_bits(), "{isa} sum at {j}");
                }
            }
        }
    }

    #[test]
    fn latent_heads_read_the_cache_once_per_head_now_once_per_set_and_each_row_keeps_its_bits() {
        absorbed_heads_match_one_head_at_a_time(70, 5, 5);
    }

    #[test]
    fn a_decode_step_scored_each_head_in_one_lane_of_eight_now_eight_heads_fill_the_lanes() {
        // Decode's single rows (eight heads a lane set; 33 heads: five lane sets, one nearly
        // empty) and a verification's 3 rows of 4 heads (pairs straddle lane sets).
        for (first, g, heads) in [(70, 1, 9), (130, 1, 33), (3, 3, 4), (9, 2, 8)] {
            absorbed_heads_match_one_head_at_a_time(first, g, heads);
        }
    }

    fn absorbed_heads_match_one_head_at_a_time(first: usize, g: usize, heads: usize) {
        let d = Absorbed { nope: 40, rope: 8, kl: 48, scale: 0.3 };
        let npos = first + g;
        let (lat, pe) = (values(npos * d.kl, 21), values(npos * d.rope, 22));
        let w_uk: Vec<Vec<f32>> =
            (30u32..).take(heads).map(|seed| values(d.nope * d.kl, seed)).collect();
        let q: Vec<Vec<f32>> =
            (60u32..).take(heads * g).map(|seed| values(d.nope + d.rope, seed)).collect();
        let rows: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
        let mut want = vec![0.0f32; heads * g * d.kl];
        for (h, (w, out)) in w_uk.iter().zip(want.chunks_mut(g * d.kl)).enumerate() {
            attend(&d, &rows[h * g..(h + 1) * g], w, &lat, &pe, first, out);
        }
        let w: Vec<&[f32]> = w_uk.iter().map(Vec::as_slice).collect();
        let mut got = vec![f32::NAN; heads * g * d.kl];
        attend_heads(&d, &rows, &w, &lat, &pe, first, &mut got);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{heads} heads of {g} rows: head {} row {} col {}",
                i / (g * d.kl),
                i / d.kl % g,
                i % d.kl
            );
        }
    }

    #[test]
    fn negative_zero_sums_keep_their_sign() {
        // `Iterator::sum` starts from -0.0: a dot product of negative-zero products is -0.0.
        let q = vec![[-0.0f32; LANES]; 5];
        let m = vec![1.0f32; 5];
        for isa in Isa::available() {
            let mut got = vec![[0.0f64; LANES]; 1];
            dot_lanes_with(isa, &q, &m, 1, &mut got);
            assert!(got[0].iter().all(|v| v.to_bits() == (-0.0f64).to_bits()), "{isa}");
            let mut out = [f32::NAN; 16];
            weighted_rows_with(isa, &[&[-0.0f32][..]], &m[..16.min(m.len())], 5, &mut out[..5]);
            assert!(out[..5].iter().all(|v| v.to_bits() == 0), "{isa}: columns start at +0.0");
        }
    }
}
