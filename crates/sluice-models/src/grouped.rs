//! Grouped-query attention's scores, softmax and weighted sums over the rows of a pass, for the
//! families whose query heads share KV heads (Qwen3's `repeat_kv`, GPT-OSS's sinks and sliding
//! windows): `kv = head / groups`, each row scoring the keys of positions `first(pos) ..= pos`.
//!
//! **Sets of heads.** Every head of a KV head reads the same keys and values. The sums run
//! [`LANES`] rows of the pass at a time, one per vector lane, and several heads of one KV head
//! side by side ([`dot_sets_strided`]: each key read and widened to f64 once for all of them;
//! [`weighted_rows_strided`]: each value row loaded once for eight rows), so a 2,048-position
//! prefill no longer streams a head's keys from the L3 cache for every eight rows and every
//! head. The pool runs (set of heads, block of rows) parts, the blocks cut to about equal work
//! (later rows see more positions) and the costliest claimed first.
//!
//! Batch invariance: each lane adds its row's f64 products in the one-row order whatever the
//! lanes, sets, blocks or threads, and each row's softmax sees only its own scores, so a row's
//! output is bit for bit the one it has alone.

use crate::qwen3::state::KvCache;
use sluice_kernels::latent::{dot_sets_strided, weighted_rows_strided, LANES};

/// Heads of one KV head a part runs side by side, at most (the AVX-512 score tile's sets).
const MAX_SETS: usize = 4;
/// Parts a thread should have to claim, where the rows allow: blocks cut by estimated work
/// still differ, and a thread's last part is its tail.
const PARTS_PER_THREAD: usize = 4;
/// Positions whose scores a row group takes at a time (the f64 sums of a span stay in the L1
/// cache until the rows take their scores from them).
const SPAN: usize = 128;

/// One layer's grouped-query attention over the rows of a pass.
pub(crate) struct Grouped<'a> {
    /// Queries `[t, heads · hd]`, normed and rotated as the family does.
    pub q: &'a [f32],
    /// The cache's keys `[positions, kv_heads · hd]`, the pass's rows last.
    pub k: &'a [f32],
    /// The cache's values, as `k`.
    pub v: &'a [f32],
    /// Query heads.
    pub heads: usize,
    /// KV heads (dividing `heads`).
    pub kv_heads: usize,
    /// Head width.
    pub hd: usize,
    /// Positions cached before the pass.
    pub past: usize,
    /// Rows of the pass.
    pub t: usize,
    /// Score scale (the f32 the family multiplies each f32-rounded score by).
    pub scale: f32,
    /// A sliding window: a row at `pos` sees the last `window` positions up to its own; `None`
    /// sees every position.
    pub window: Option<usize>,
}

impl<'a> Grouped<'a> {
    /// The attention of a pass's `t` rows over `cache`, whose last `t` positions are the pass's
    /// own, with the `head_dim^-0.5` score scale HF rounds to f32 (Qwen3 and GPT-OSS alike).
    pub(crate) fn over(
        q: &'a [f32],
        cache: &'a KvCache,
        (heads, kv_heads, hd): (usize, usize, usize),
        t: usize,
        window: Option<usize>,
    ) -> Self {
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        let scale = (hd as f64).powf(-0.5) as f32;
        let (k, v, past) = (&cache.k, &cache.v, cache.len() - t);
        Self { q, k, v, heads, kv_heads, hd, past, t, scale, window }
    }
}

impl Grouped<'_> {
    /// The per-head contexts `[t, heads · hd]` (HF's `attn_output.transpose(1, 2)`), each row's
    /// scaled scores turned into weights in place by `softmax(head, scores)`.
    pub(crate) fn attend(&self, softmax: &(dyn Fn(usize, &mut [f32]) + Sync)) -> Vec<f32> {
        let (hd, qw) = (self.hd, self.heads * self.hd);
        let threads = sluice_kernels::pool::with_current(sluice_kernels::Pool::threads);
        let groups = self.heads / self.kv_heads.max(1);
        let row_groups = self.t.div_ceil(LANES);
        let sets = heads_per_set(groups, self.heads, row_groups, threads);
        let head_sets = self.heads / sets;
        let want = (PARTS_PER_THREAD * threads).div_ceil(head_sets).clamp(1, row_groups.max(1));
        let blocks = self.blocks(want);
        let parts = sluice_kernels::pool::map(head_sets * blocks.len(), |i| {
            let (r0, r1) = blocks[blocks.len() - 1 - i / head_sets];
            (r0, r1, self.part((i % head_sets) * sets, sets, (r0, r1), softmax))
        });
        let mut attn = vec![0.0f32; self.t * qw];
        for (i, (r0, r1, out)) in parts.iter().enumerate() {
            let h0 = (i % head_sets) * sets;
            for (ti, row) in (*r0..*r1).zip(out.chunks_exact(sets * hd)) {
                attn[ti * qw + h0 * hd..][..sets * hd].copy_from_slice(row);
            }
        }
        attn
    }

    /// The first position the row at `pos` sees.
    fn first(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// Up to `want` blocks of whole row groups (`[r0, r1)`, in order) of about equal work, a
    /// row's work taken as the positions it sees.
    fn blocks(&self, want: usize) -> Vec<(usize, usize)> {
        let cost = |g: usize| -> usize {
            let (t0, t1) = (g * LANES, ((g + 1) * LANES).min(self.t));
            (t0..t1).map(|ti| self.past + ti + 1 - self.first(self.past + ti)).sum()
        };
        let row_groups = self.t.div_ceil(LANES);
        let total: usize = (0..row_groups).map(cost).sum();
        let mut blocks = Vec::with_capacity(want);
        let (mut start, mut done) = (0, 0);
        for g in 0..row_groups {
            done += cost(g);
            // Cut after the group that takes the running work past the next share.
            if done * want >= total * (blocks.len() + 1) || g + 1 == row_groups {
                blocks.push((start * LANES, ((g + 1) * LANES).min(self.t)));
                start = g + 1;
            }
        }
        blocks
    }

    /// Heads `h0 .. h0 + sets` (one KV head's) for rows `r0 .. r1`: `[r1 − r0][sets][hd]`.
    fn part(
        &self,
        h0: usize,
        sets: usize,
        (r0, r1): (usize, usize),
        softmax: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) -> Vec<f32> {
        let (hd, qw, kw) = (self.hd, self.heads * self.hd, self.kv_heads * self.hd);
        let kv = h0 / (self.heads / self.kv_heads);
        // This KV head's keys and values: rows `kw` apart in the cache, from the head's offset.
        let (kh, vh) = (&self.k[kv * hd..], &self.v[kv * hd..]);
        let mut out = vec![0.0f32; (r1 - r0) * sets * hd];
        let mut lanes = vec![[0.0f32; LANES]; sets * hd];
        let mut dots = vec![[0.0f64; LANES]; sets * SPAN];
        let mut probs: Vec<Vec<f32>> = vec![Vec::new(); sets * LANES];
        let mut block = vec![0.0f32; sets * LANES * hd];
        for t0 in (r0..r1).step_by(LANES) {
            let n = LANES.min(r1 - t0);
            for (s, lanes) in lanes.chunks_exact_mut(hd).enumerate() {
                query_lanes(&self.q[t0 * qw + (h0 + s) * hd..], qw, n, lanes);
            }
            // attn_weights = matmul(query, key_states.T) * scaling + mask: row `ti` scores
            // first(pos) ..= pos; the group's first row sees the earliest position.
            let (f0, seen) = (self.first(self.past + t0), self.past + t0 + n);
            for p in &mut probs {
                p.clear();
            }
            for p0 in (f0..seen).step_by(SPAN) {
                let span = SPAN.min(seen - p0);
                let dots = &mut dots[..sets * span];
                dot_sets_strided(&lanes, sets, &kh[p0 * kw..], kw, span, dots);
                for (j, p) in probs[..sets * n].iter_mut().enumerate() {
                    let (s, l) = (j / n, j % n);
                    let pos = self.past + t0 + l;
                    let (from, to) = (self.first(pos).max(p0), (pos + 1).min(p0 + span));
                    #[allow(clippy::cast_possible_truncation)]
                    p.extend(
                        dots[s * span..][from.saturating_sub(p0)..to.saturating_sub(p0)]
                            .iter()
                            .map(|d| d[l] as f32 * self.scale),
                    );
                }
            }
            for (j, p) in probs[..sets * n].iter_mut().enumerate() {
                softmax(h0 + j / n, p);
            }
            // attn_output = matmul(attn_weights, value_states): the group's rows at once where
            // they start at one position (full attention), row by row otherwise.
            let rows = &probs[..sets * n];
            let sums = &mut block[..sets * n * hd];
            if self.first(self.past + t0 + n - 1) == f0 {
                let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                weighted_rows_strided(&rows, &vh[f0 * kw..], kw, hd, sums);
            } else {
                for (j, (p, o)) in rows.iter().zip(sums.chunks_exact_mut(hd)).enumerate() {
                    let f = self.first(self.past + t0 + j % n);
                    weighted_rows_strided(&[p.as_slice()], &vh[f * kw..], kw, hd, o);
                }
            }
            // `sums` is [set][row][hd]; the part's rows are [row][set][hd].
            for (j, sum) in sums.chunks_exact(hd).enumerate() {
                let (s, l) = (j / n, j % n);
                out[((t0 - r0 + l) * sets + s) * hd..][..hd].copy_from_slice(sum);
            }
        }
        out
    }
}

/// Heads of one KV head a part runs side by side: the most of 4, 2 or 1 (the score tile takes
/// sets four at a time, then one at a time) up to [`MAX_SETS`] that divide the
/// KV head's `groups` heads and still leave a part for every thread (a decode step has one
/// row group, so its parts are the head sets).
fn heads_per_set(groups: usize, heads: usize, row_groups: usize, threads: usize) -> usize {
    [4, 2, 1]
        .into_iter()
        .filter(|&s| s <= MAX_SETS)
        .find(|&s| groups.is_multiple_of(s) && (heads / s) * row_groups >= threads)
        .unwrap_or(1)
}

/// Heads of latent attention (MLA: every head reads the same latent cache) a pool part runs
/// side by side ([`sluice_kernels::latent::attend_heads`]): the most of 4, 2 or 1 that divide
/// `heads` and still leave every thread two parts (the parts cost the same; one a thread would
/// leave no slack for a slow one).
pub(crate) fn latent_heads_per_set(heads: usize, threads: usize) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|&s| heads.is_multiple_of(s) && heads / s >= 2 * threads)
        .unwrap_or(1)
}

/// Puts the queries of one head of `n ≤ LANES` consecutive rows in vector lanes, as
/// [`dot_sets_strided`] takes them: `lanes[a][l] = q[l · qw + a]` for `l < n` (`q` starts at
/// the first row's head, rows `qw` apart), and 0.0 in the lanes past `n`.
pub(crate) fn query_lanes(q: &[f32], qw: usize, n: usize, lanes: &mut [[f32; LANES]]) {
    for (a, lane) in lanes.iter_mut().enumerate() {
        for (l, v) in lane.iter_mut().enumerate() {
            *v = if l < n { q[l * qw + a] } else { 0.0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_kernels::ops::{dot_f64, softmax_inplace};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                #[allow(clippy::cast_precision_loss)]
                let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                u * 2.0 - 1.0
            })
            .collect()
    }

    /// Row `ti`, head `h` one sum at a time: each score an f64 dot rounded to f32 and scaled,
    /// the softmax, each context value an f64 sum from +0.0 in increasing position.
    fn one_row(g: &Grouped<'_>, ti: usize, h: usize) -> Vec<f32> {
        let (hd, qw, kw) = (g.hd, g.heads * g.hd, g.kv_heads * g.hd);
        let kv = h / (g.heads / g.kv_heads);
        let pos = g.past + ti;
        let q = &g.q[ti * qw + h * hd..][..hd];
        let from = g.first(pos);
        #[allow(clippy::cast_possible_truncation)]
        let mut p: Vec<f32> = (from..=pos)
            .map(|j| dot_f64(q, &g.k[j * kw + kv * hd..][..hd]) as f32 * g.scale)
            .collect();
        softmax_inplace(&mut p);
        (0..hd)
            .map(|a| {
                let mut acc = 0.0f64;
                for (j, &pj) in (from..=pos).zip(&p) {
                    acc += f64::from(pj) * f64::from(g.v[j * kw + kv * hd + a]);
                }
                #[allow(clippy::cast_possible_truncation)]
                let v = acc as f32;
                v
            })
            .collect()
    }

    #[test]
    fn heads_that_share_keys_give_each_row_its_one_row_sums_whatever_the_threads() {
        let (heads, kv_heads, hd, past, t) = (8, 2, 24, 5, 21);
        let positions = past + t;
        let (q, k, v) = (
            values(t * heads * hd, 1),
            values(positions * kv_heads * hd, 2),
            values(positions * kv_heads * hd, 3),
        );
        for window in [None, Some(6)] {
            let g =
                Grouped { q: &q, k: &k, v: &v, heads, kv_heads, hd, past, t, scale: 0.2, window };
            let mut want = Vec::with_capacity(t * heads * hd);
            for ti in 0..t {
                for h in 0..heads {
                    want.extend(one_row(&g, ti, h));
                }
            }
            for threads in [1, 2, 3, 7] {
                let pool = sluice_kernels::Pool::new(threads).expect("a pool");
                let got = pool.install(|| g.attend(&|_, p| softmax_inplace(p)));
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "window {window:?}, {threads} threads: row {} head {} value {}",
                        i / (heads * hd),
                        i / hd % heads,
                        i % hd
                    );
                }
            }
        }
    }

    #[test]
    fn heads_run_side_by_side_only_where_every_thread_keeps_a_part() {
        assert_eq!(heads_per_set(8, 32, 256, 16), 4);
        assert_eq!(heads_per_set(8, 32, 1, 16), 2, "a decode step: 16 parts for 16 threads");
        assert_eq!(heads_per_set(8, 32, 1, 2), 4);
        assert_eq!(heads_per_set(6, 12, 4, 2), 2);
        assert_eq!(heads_per_set(1, 4, 9, 2), 1);
        assert_eq!(heads_per_set(8, 8, 1, 64), 1);
        assert_eq!(latent_heads_per_set(96, 16), 2, "Kimi K3: 48 parts for 16 threads");
        assert_eq!(latent_heads_per_set(96, 2), 4);
        assert_eq!(latent_heads_per_set(128, 16), 4, "DeepSeek V3: 32 parts for 16 threads");
        assert_eq!(latent_heads_per_set(6, 1), 2);
        assert_eq!(latent_heads_per_set(6, 2), 1);
        assert_eq!(latent_heads_per_set(3, 16), 1);
    }
}
