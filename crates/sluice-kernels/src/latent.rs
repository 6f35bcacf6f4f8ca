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
//! lanes (the scores, each position's values broadcast to all of them), and [`attend`] runs one
//! head's absorbed attention for up to [`LANES`] rows on them (the families multiply its context
//! by their W_UV). Every lane adds the same
//! products in the same order as the one-at-a-time sum, starting from the same zero (`+0.0` for
//! the column sums, as the model code started them; `-0.0` for the dot products, as
//! `Iterator::sum` starts), and the product of two f32 values is exact in f64, so every result
//! is bit for bit the one-at-a-time result on every tier (so is a fused multiply-add, which the
//! AVX tiers use: rounding an exact product first changes nothing). The bodies are plain Rust
//! compiled once per tier under `#[target_feature]` and picked by [`crate::isa::isa`].

use crate::isa::{self, Isa};
use crate::ops::softmax_inplace;

/// Rows of the pass whose dot products share one vector in [`dot_lanes`].
pub const LANES: usize = 8;

/// Rows that share each load of a matrix row in [`weighted_rows`].
const ROWS: usize = 4;
/// Latent columns one [`weighted_rows`] tile keeps in registers per row.
const COLS: usize = 16;
/// Positions one [`dot_lanes`] tile computes at once.
const POSITIONS: usize = 4;

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
        avx512("avx512f,fma") => weighted_rows_body::<true>(p, m, stride, width, out),
        avx2("avx2,fma") => weighted_rows_body::<true>(p, m, stride, width, out),
        _ => weighted_rows_body::<false>(p, m, stride, width, out),
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
    assert!(stride >= q.len(), "dot_lanes: rows overlap");
    assert!(
        npos == 0 || (npos - 1) * stride + q.len() <= m.len(),
        "dot_lanes: fewer matrix rows than positions"
    );
    assert!(out.len() >= npos, "dot_lanes: out length");
    crate::isa::on_tier!(isa, "dot_lanes", (
        q: &[[f32; LANES]], m: &[f32], stride: usize, npos: usize, out: &mut [[f64; LANES]],
    ) {
        avx512("avx512f,fma") => dot_lanes_body::<true>(q, m, stride, npos, out),
        avx2("avx2,fma") => dot_lanes_body::<true>(q, m, stride, npos, out),
        _ => dot_lanes_body::<false>(q, m, stride, npos, out),
    });
}

/// [`weighted_rows`] for every tier: groups of [`ROWS`] rows, then single rows.
#[inline(always)]
fn weighted_rows_body<const FUSED: bool>(
    p: &[&[f32]],
    m: &[f32],
    stride: usize,
    width: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r + ROWS <= p.len() {
        row_group::<ROWS, FUSED>(
            &p[r..r + ROWS],
            m,
            (stride, width),
            &mut out[r * width..(r + ROWS) * width],
        );
        r += ROWS;
    }
    while r < p.len() {
        row_group::<1, FUSED>(&p[r..=r], m, (stride, width), &mut out[r * width..(r + 1) * width]);
        r += 1;
    }
}

/// `R` rows of [`weighted_rows`]: [`COLS`] columns at a time, the terms all `R` rows have
/// sharing each load of `m`, then each row's own remaining terms, then the columns left over
/// one at a time. Each column's sum adds its terms in increasing index whichever part of the
/// loop adds them.
#[inline(always)]
fn row_group<const R: usize, const FUSED: bool>(
    p: &[&[f32]],
    m: &[f32],
    (stride, width): (usize, usize),
    out: &mut [f32],
) {
    let joint = p.iter().map(|r| r.len()).min().unwrap_or(0);
    let mut a0 = 0;
    while a0 + COLS <= width {
        let mut acc = [[0.0f64; COLS]; R];
        for i in 0..joint {
            let row: &[f32; COLS] = m[i * stride + a0..i * stride + a0 + COLS]
                .try_into()
                .expect("invariant: a slice of COLS values");
            let l = row.map(f64::from);
            for (acc, pr) in acc.iter_mut().zip(p) {
                let pv = f64::from(pr[i]);
                for (a, &lv) in acc.iter_mut().zip(&l) {
                    *a = madd::<FUSED>(pv, lv, *a);
                }
            }
        }
        for (acc, pr) in acc.iter_mut().zip(p) {
            for (i, &pi) in pr.iter().enumerate().skip(joint) {
                let pv = f64::from(pi);
                let row = &m[i * stride + a0..i * stride + a0 + COLS];
                for (a, &lv) in acc.iter_mut().zip(row) {
                    *a = madd::<FUSED>(pv, f64::from(lv), *a);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (o, &a) in out[r * width + a0..r * width + a0 + COLS].iter_mut().zip(acc) {
                #[allow(clippy::cast_possible_truncation)]
                {
                    *o = a as f32;
                }
            }
        }
        a0 += COLS;
    }
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

/// [`dot_lanes`] for every tier: [`POSITIONS`] positions at a time, then one at a time.
#[inline(always)]
fn dot_lanes_body<const FUSED: bool>(
    q: &[[f32; LANES]],
    m: &[f32],
    stride: usize,
    npos: usize,
    out: &mut [[f64; LANES]],
) {
    let w = q.len();
    let mut pos = 0;
    while pos + POSITIONS <= npos {
        let rows: [&[f32]; POSITIONS] = std::array::from_fn(|j| &m[(pos + j) * stride..][..w]);
        out[pos..pos + POSITIONS].copy_from_slice(&position_tile::<POSITIONS, FUSED>(q, rows));
        pos += POSITIONS;
    }
    while pos < npos {
        out[pos] = position_tile::<1, FUSED>(q, [&m[pos * stride..][..w]])[0];
        pos += 1;
    }
}

/// The [`dot_lanes`] sums of `P` positions (`rows`, each `q.len()` long): each position's
/// value at `a` is broadcast to the lanes and multiplied by the lanes' values at `a`.
#[inline(always)]
fn position_tile<const P: usize, const FUSED: bool>(
    q: &[[f32; LANES]],
    rows: [&[f32]; P],
) -> [[f64; LANES]; P] {
    let mut acc = [[-0.0f64; LANES]; P];
    for (a, qa) in q.iter().enumerate() {
        let qv = qa.map(f64::from);
        for (acc, row) in acc.iter_mut().zip(&rows) {
            let mv = f64::from(row[a]);
            for (s, &x) in acc.iter_mut().zip(&qv) {
                *s = madd::<FUSED>(x, mv, *s);
            }
        }
    }
    acc
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
    let (nope, rope, kl) = (d.nope, d.rope, d.kl);
    let g = q_rows.len();
    assert!(g <= LANES, "attend: a group holds at most LANES rows");
    // q_lat = W_UKᵀ q_nope (sum over the nope index in order), rounded to f32.
    let q_nope: Vec<&[f32]> = q_rows.iter().map(|r| &r[..nope]).collect();
    let mut q_lat = vec![0.0f32; g * kl];
    weighted_rows(&q_nope, w_uk, kl, &mut q_lat);
    // The rows as lanes: lane l holds row l (unused lanes stay zero).
    let mut q_lanes = vec![[0.0f32; LANES]; kl];
    let mut pe_lanes = vec![[0.0f32; LANES]; rope];
    for (l, row) in q_rows.iter().enumerate() {
        for (a, v) in q_lanes.iter_mut().enumerate() {
            v[l] = q_lat[l * kl + a];
        }
        for (j, v) in pe_lanes.iter_mut().enumerate() {
            v[l] = row[nope + j];
        }
    }
    // score = q_lat·lat[pos] + q_pe·pe[pos] (each an f64 dot), rounded to f32, then scaled.
    let npos = first + g;
    let mut probs: Vec<Vec<f32>> = (0..g).map(|l| Vec::with_capacity(first + l + 1)).collect();
    let (mut s_lat, mut s_pe) = ([[0.0f64; LANES]; SPAN], [[0.0f64; LANES]; SPAN]);
    for p0 in (0..npos).step_by(SPAN) {
        let n = SPAN.min(npos - p0);
        dot_lanes(&q_lanes, &lat[p0 * kl..], n, &mut s_lat);
        dot_lanes(&pe_lanes, &pe[p0 * rope..], n, &mut s_pe);
        for (l, scores) in probs.iter_mut().enumerate() {
            let upto = (first + l + 1).saturating_sub(p0).min(n);
            scores.extend(s_lat[..upto].iter().zip(&s_pe[..upto]).map(|(a, b)| {
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

    #[test]
    fn weighted_rows_match_one_sum_at_a_time_on_every_tier() {
        for (rows, width, n) in [(1, 16, 1), (3, 37, 5), (4, 512, 9), (9, 33, 17), (6, 64, 3)] {
            let m = values(n * width, 7);
            let lens: Vec<usize> = (0..rows).map(|r| (n + r) % (n + 1)).collect();
            let pv: Vec<Vec<f32>> =
                lens.iter().zip(0u32..).map(|(&l, r)| values(l, 100 + r)).collect();
            let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
            let mut want = vec![0.0f32; rows * width];
            for (r, pr) in p.iter().enumerate() {
                for a in 0..width {
                    let mut acc = 0.0f64;
                    for (i, &x) in pr.iter().enumerate() {
                        acc += f64::from(x) * f64::from(m[i * width + a]);
                    }
                    #[allow(clippy::cast_possible_truncation)]
                    {
                        want[r * width + a] = acc as f32;
                    }
                }
            }
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
                for (r, pr) in p.iter().enumerate() {
                    for a in 0..w {
                        let mut acc = 0.0f64;
                        for (i, &x) in pr.iter().enumerate() {
                            acc += f64::from(x) * f64::from(head[i * stride + a]);
                        }
                        #[allow(clippy::cast_possible_truncation)]
                        let want = acc as f32;
                        assert_eq!(out[r * w + a].to_bits(), want.to_bits(), "{isa} sum {r} {a}");
                    }
                }
            }
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
