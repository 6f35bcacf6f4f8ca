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
            avx2::with_wide(|wide| unsafe {
                avx2::weighted_rows_blocked(p, m, (stride, width), out, wide)
            })
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
mod tests;
