//! Absorbed latent attention for one head over a group of rows, shared by the MLA families
//! (Kimi K3's gated NoPE MLA, DeepSeek V3's MLA): `q_lat = W_UKᵀ q_nope`, scores `(q_lat · lat
//! + q_pe · pe) · scale` over each row's own positions, softmax, and `ctx = Σ p · lat`; the
//! family multiplies `ctx` by its W_UV.
//!
//! Every sum is the f64 sum, in index order, that the families computed one (row, head) at a
//! time: [`sluice_kernels::latent`] runs [`LANES`] of them side by side without changing any
//! one's order, so the results are those bits. The group's scores are summed a span of
//! positions at a time, so what is held besides the rows' probabilities does not grow with the
//! context.

use sluice_kernels::latent::{self, LANES};
use sluice_kernels::ops::softmax_inplace;

/// Positions whose scores a group sums at a time.
const SPAN: usize = 64;

/// The sizes of one head's absorbed attention.
pub(crate) struct Dims {
    /// Query no-position width (rows of W_UK).
    pub(crate) nope: usize,
    /// Rotary (or NoPE `k_pe`) width.
    pub(crate) rope: usize,
    /// Latent width (`kv_lora_rank`).
    pub(crate) kl: usize,
    /// Score scale.
    pub(crate) scale: f32,
}

/// Computes `ctx [g, kl]` for the `g ≤ LANES` rows whose queries (`nope + rope` values each,
/// no-position part first) `q_rows` holds, one head: row `l` attends to positions `0 ..=
/// first + l` of the cache `lat [positions, kl]`, `pe [positions, rope]`. `w_uk` is the
/// head's W_UK widened to f32, `[nope, kl]`. Each row's result is what the one-row sums give.
pub(crate) fn group(
    d: &Dims,
    q_rows: &[&[f32]],
    w_uk: &[f32],
    lat: &[f32],
    pe: &[f32],
    first: usize,
    ctx: &mut [f32],
) {
    let (nope, rope, kl) = (d.nope, d.rope, d.kl);
    let g = q_rows.len();
    assert!(g <= LANES, "absorbed attention: a group holds at most LANES rows");
    // q_lat = W_UKᵀ q_nope (sum over the nope index in order), rounded to f32.
    let q_nope: Vec<&[f32]> = q_rows.iter().map(|r| &r[..nope]).collect();
    let mut q_lat = vec![0.0f32; g * kl];
    latent::weighted_rows(&q_nope, w_uk, kl, &mut q_lat);
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
        latent::dot_lanes(&q_lanes, &lat[p0 * kl..], n, &mut s_lat);
        latent::dot_lanes(&pe_lanes, &pe[p0 * rope..], n, &mut s_pe);
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
    latent::weighted_rows(&p, lat, kl, ctx);
}
