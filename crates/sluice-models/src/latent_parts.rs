//! Latent attention's parts (Kimi K3's MLA layers, DeepSeek V3): the pool runs sets of heads
//! ([`latent_heads`], as many as [`heads_a_part`] chooses for grouped attention), each part
//! widening its heads' `kv_b_proj` rows (W_UK, and DeepSeek V3's W_UV) into a buffer its thread
//! keeps ([`with_heads_widened`]), then [`latent_part`]: the absorbed attention of
//! [`sluice_kernels::latent::attend_heads`] over [`LANES`] rows at a time and the family's W_UV
//! step. The memory plans charge the kept buffers ([`widened_bytes`]).
//!
//! Batch invariance: a row's absorbed query, scores and context are its one-row f64 sums
//! whatever the rows, heads or threads of the pass (see `sluice_kernels::latent`).

use crate::grouped::{heads_a_part, Work, MAX_LANE_SETS};
use sluice_kernels::latent::LANES;
use sluice_kernels::Matrix;

thread_local! {
    /// This thread's kv_b rows widened to f32 for latent attention's parts ([`with_widened`]),
    /// kept for its life: made afresh for each part of each layer, their first-touch page
    /// faults and zero fill took more of a DeepSeek-V3 slice's decode step than the widening.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` values of this thread's buffer for widened weight rows (their contents
/// left from an earlier call: `f` writes before it reads), or on a fresh buffer if the thread
/// is already inside a call or being torn down.
pub(crate) fn with_widened<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    sluice_kernels::kept::with_kept_slice(&WIDENED, len, f)
}

/// Runs `f` on the widened `kv_b_proj` rows of `heads` (latent attention's W_UK, or W_UK and
/// W_UV): head `hi`'s `rows` rows from row `hi · per_head` of `kv_b`, one slice of `rows ·
/// kv_b.cols()` values a head, in this thread's buffer ([`with_widened`]).
pub(crate) fn with_heads_widened<R>(
    kv_b: &Matrix<'_>,
    heads: std::ops::Range<usize>,
    (per_head, rows): (usize, usize),
    f: impl FnOnce(&[&[f32]]) -> R,
) -> R {
    let (kl, len) = (kv_b.cols().max(1), (rows * kv_b.cols()).max(1));
    with_widened(heads.len() * len, |widened| {
        for (hi, w) in heads.zip(widened.chunks_exact_mut(len)) {
            for (i, row) in w.chunks_exact_mut(kl).enumerate() {
                kv_b.row_to_f32(hi * per_head + i, row);
            }
        }
        let ws: Vec<&[f32]> = widened.chunks_exact(len).collect();
        f(&ws)
    })
}

/// A family's W_UV step in [`latent_part`]: `(head of the set, its rows' latent contexts, rows,
/// their outputs)`.
pub(crate) type WuvStep<'a> = dyn FnMut(usize, &[f32], usize, &mut [f32]) + 'a;

/// The body of a latent attention part ([`latent_heads`]) for `heads` over the `t` rows of a
/// pass, [`LANES`] rows at a time: the heads' absorbed attention (`latent::attend_heads` with
/// their widened `w_uk`, the queries `q [t][h][qd]`), then the family's W_UV step `w_uv(s, c, g,
/// out)` for head `s` of the set: `c` its `g` rows' latent contexts, `out` their `[g][vd]`
/// outputs. Returns `[head of the set][row][vd]`.
pub(crate) fn latent_part(
    dims: &sluice_kernels::latent::Absorbed,
    heads: std::ops::Range<usize>,
    (q, h, t, vd): (&[f32], usize, usize, usize),
    (w_uk, lat, pe, past): (&[&[f32]], &[f32], &[f32], usize),
    w_uv: &mut WuvStep<'_>,
) -> Vec<f32> {
    let (sets, kl, qd) = (heads.len(), dims.kl, dims.nope + dims.rope);
    let qrow = |hi: usize, ti: usize| &q[ti * h * qd + hi * qd..][..qd];
    let mut out = vec![0.0f32; sets * t * vd];
    let mut ctx = vec![0.0f32; sets * LANES * kl];
    for g0 in (0..t).step_by(LANES) {
        let g = LANES.min(t - g0);
        let rows: Vec<&[f32]> =
            heads.clone().flat_map(|hi| (g0..g0 + g).map(move |ti| qrow(hi, ti))).collect();
        let c = &mut ctx[..sets * g * kl];
        sluice_kernels::latent::attend_heads(dims, &rows, w_uk, lat, pe, past + g0, c);
        for (s, c) in c.chunks_exact(g * kl).enumerate() {
            w_uv(s, c, g, &mut out[(s * t + g0) * vd..(s * t + g0 + g) * vd]);
        }
    }
    out
}

/// Bytes the threads' [`with_widened`] buffers can hold for latent attention of `heads` heads
/// that widens `rows` kv_b rows of `kl` values a head: a part takes at most [`MAX_LANE_SETS`]
/// lane sets of heads (a decode step's single rows, [`LANES`] heads a set) and each thread
/// keeps its largest, for the memory plan's fixed charge.
pub(crate) fn widened_bytes(threads: usize, heads: usize, rows: usize, kl: usize) -> u64 {
    let heads = heads.min(MAX_LANE_SETS * LANES);
    (threads * heads * rows * kl * std::mem::size_of::<f32>()) as u64
}

/// Latent attention's per-head contexts `[t, heads · vd]` (MLA: every head reads the same
/// cache), the heads run by the pool in parts of [`heads_a_part`] heads: `part(heads)` returns
/// the outputs of its heads' `t` rows, `[head][row][vd]`.
pub(crate) fn latent_heads(
    (heads, t, vd): (usize, usize, usize),
    work: &Work,
    part: &(dyn Fn(std::ops::Range<usize>) -> Vec<f32> + Sync),
) -> Vec<f32> {
    let threads = sluice_kernels::pool::with_current(sluice_kernels::Pool::threads);
    let sets = heads_a_part((heads, heads), (t.min(LANES), 1), threads, work);
    let parts = sluice_kernels::pool::map(heads / sets, |p| part(p * sets..(p + 1) * sets));
    let mut attn = vec![0.0f32; t * heads * vd];
    let outs = parts.iter().flat_map(|p| p.chunks_exact((t * vd).max(1)));
    for (hi, out) in outs.enumerate() {
        for (ti, o) in out.chunks_exact(vd.max(1)).enumerate() {
            attn[(ti * heads + hi) * vd..][..vd].copy_from_slice(o);
        }
    }
    attn
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Latent attention's parts widened their heads' kv_b rows into fresh buffers on every pass
    /// (first-touch page faults and zero fill: more of a DeepSeek-V3 slice's decode step than
    /// the widening itself); a thread now keeps one buffer, and a call inside a call gets its
    /// own.
    #[test]
    fn latent_parts_widened_into_fresh_buffers_every_pass_now_the_thread_keeps_one() {
        let first = with_widened(1000, |b| {
            b.fill(1.0);
            b.as_ptr() as usize
        });
        let again = with_widened(600, |b| {
            assert_eq!(b.len(), 600);
            b.as_ptr() as usize
        });
        assert_eq!(first, again, "the thread's buffer, kept");
        with_widened(10, |outer| {
            let inner = with_widened(20, |b| {
                assert_eq!(b.len(), 20);
                b.as_ptr() as usize
            });
            assert_ne!(inner, outer.as_ptr() as usize, "a call inside a call gets its own");
        });
    }
}
