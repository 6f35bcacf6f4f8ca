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
//! **Pairs in lanes.** A lane holds a (head, row) pair, the pairs in order: a prefill's eight
//! rows of one head, a decode step's single rows of eight heads (before, a decode step's head
//! filled one lane of eight and seven multiplied zeros). [`heads_a_part`] chooses the heads a
//! part takes from what a part costs and how many parts the threads run at once; latent
//! attention (Kimi K3, DeepSeek V3) chooses its parts the same way
//! ([`crate::latent_parts::latent_heads`]).
//!
//! Batch invariance: each lane adds its row's f64 products in the one-row order whatever the
//! lanes, sets, blocks or threads, and each row's softmax sees only its own scores, so a row's
//! output is bit for bit the one it has alone.

use crate::qwen3::state::KvCache;
use sluice_kernels::latent::{dot_sets_strided, weighted_rows_strided, LANES};

/// Lane sets of (head, row) pairs a part runs side by side, at most (the AVX-512 score tile's
/// sets).
pub(crate) const MAX_LANE_SETS: usize = 4;
/// What reading a cached value costs beside a multiply-add, for choosing the heads of a part.
const READ: usize = 4;
/// Parts a thread should have to claim, where the rows allow: blocks cut by estimated work
/// still differ, and a thread's last part is its tail.
const PARTS_PER_THREAD: usize = 4;
/// Positions whose scores a row group takes at a time (the f64 sums of a span stay in the L1
/// cache until the rows take their scores from them).
const SPAN: usize = 128;
/// Columns of a context a part of [`Grouped::attend_spread`]'s weighted sums takes (the
/// weighted-sum tile's width).
const COLS: usize = 16;

/// One layer's grouped-query attention over the rows of a pass.
pub(crate) struct Grouped<'a> {
    /// Queries `[t, heads · hd]`, normed and rotated as the family does.
    pub q: &'a [f32],
    /// The cache's keys `[positions, stride]` (a position's `kv_heads · hd` values, then
    /// padding), the pass's rows last.
    pub k: &'a [f32],
    /// The cache's values, as `k`.
    pub v: &'a [f32],
    /// Values from one cached position's row to the next (`kv_heads · hd` or more).
    pub stride: usize,
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
        let (k, v, stride, past) = (&cache.k, &cache.v, cache.stride, cache.len() - t);
        Self { q, k, v, stride, heads, kv_heads, hd, past, t, scale, window }
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
        if row_groups == 1 && self.kv_heads < threads {
            return self.attend_spread(softmax, threads);
        }
        // Positions cancel out of grouped attention's choice (every term reads them all).
        let work = Work { positions: 1, key: hd, value: hd, per_pair: 0 };
        let sets =
            heads_a_part((self.heads, groups), (self.t.min(LANES), row_groups), threads, &work);
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

    /// [`Self::attend`] for one row group (a decode step, a short verification) on more threads
    /// than KV heads, where parts of whole heads would leave threads idle or lanes empty: the
    /// scores of each KV head's (head, row) pairs span by span of positions, a pool part each;
    /// each pair's softmax, a part each; then the weighted sums tile by tile of [`COLS`]
    /// columns, a part each. Each score is its own dot product and each context value its own
    /// sum over the positions in order, so every row keeps the bits [`Self::part`] gives it.
    fn attend_spread(
        &self,
        softmax: &(dyn Fn(usize, &mut [f32]) + Sync),
        threads: usize,
    ) -> Vec<f32> {
        let (hd, t, kv_heads) = (self.hd, self.t, self.kv_heads);
        let (qw, kw) = (self.heads * hd, self.stride);
        let groups = self.heads / kv_heads.max(1);
        let pairs = groups * t;
        let lane_sets = pairs.div_ceil(LANES);
        // The positions some row sees, cut into about two spans a thread.
        let (f0, seen) = (self.first(self.past), self.past + t);
        let spans = (2 * threads).div_ceil(kv_heads).clamp(1, (seen - f0).div_ceil(SPAN));
        let span = (seen - f0).div_ceil(spans);
        let spans = (seen - f0).div_ceil(span);
        let lanes: Vec<Vec<[f32; LANES]>> = (0..kv_heads)
            .map(|kv| {
                let mut lanes = vec![[0.0f32; LANES]; lane_sets * hd];
                pair_lanes(&self.q[kv * groups * hd..], (qw, hd), (groups, t), &mut lanes);
                lanes
            })
            .collect();
        let dots = sluice_kernels::pool::map(kv_heads * spans, |i| {
            let (kv, p0) = (i / spans, f0 + (i % spans) * span);
            let n = span.min(seen - p0);
            let mut dots = vec![[0.0f64; LANES]; lane_sets * n];
            let kh = &self.k[p0 * kw + kv * hd..];
            dot_sets_strided(&lanes[kv], lane_sets, kh, kw, n, &mut dots);
            dots
        });
        let probs = sluice_kernels::pool::map(kv_heads * pairs, |i| {
            let (kv, j) = (i / pairs, i % pairs);
            let (set, l) = (j / LANES, j % LANES);
            let pos = self.past + j % t;
            let from = self.first(pos);
            let mut p = Vec::with_capacity(pos + 1 - from);
            for (si, dots) in dots[kv * spans..(kv + 1) * spans].iter().enumerate() {
                let p0 = f0 + si * span;
                let n = span.min(seen - p0);
                self.push_scores(&mut p, &dots[set * n..][..n], p0, (from, pos + 1), l);
            }
            softmax(kv * groups + j / t, &mut p);
            p
        });
        let tiles = hd.div_ceil(COLS);
        let sums = sluice_kernels::pool::map(kv_heads * tiles, |i| {
            let (kv, c0) = (i / tiles, (i % tiles) * COLS);
            let cw = COLS.min(hd - c0);
            let rows: Vec<&[f32]> =
                probs[kv * pairs..(kv + 1) * pairs].iter().map(Vec::as_slice).collect();
            let mut out = vec![0.0f32; pairs * cw];
            let first = |j: usize| self.first(self.past + j % t);
            self.weigh(&rows, &self.v[kv * hd + c0..], (cw, &first), &mut out);
            out
        });
        let mut attn = vec![0.0f32; t * qw];
        for (i, out) in sums.iter().enumerate() {
            let (kv, c0) = (i / tiles, (i % tiles) * COLS);
            let cw = COLS.min(hd - c0);
            for (j, o) in out.chunks_exact(cw).enumerate() {
                let h = kv * groups + j / t;
                attn[(j % t) * qw + h * hd + c0..][..cw].copy_from_slice(o);
            }
        }
        attn
    }

    /// Appends to `p` the scaled f32 scores in lane `l` of `dots` (one lane set's sums for the
    /// positions from `p0`) of the positions `from .. to` that `dots` holds.
    fn push_scores(
        &self,
        p: &mut Vec<f32>,
        dots: &[[f64; LANES]],
        p0: usize,
        (from, to): (usize, usize),
        l: usize,
    ) {
        let (a, b) = (from.max(p0), to.min(p0 + dots.len()));
        if a < b {
            #[allow(clippy::cast_possible_truncation)]
            p.extend(dots[a - p0..b - p0].iter().map(|d| d[l] as f32 * self.scale));
        }
    }

    /// attn_output = matmul(attn_weights, value_states) for the pairs whose weights `rows`
    /// holds, pair `j`'s from position `first(j)`, over `width` columns of one head's values
    /// (`vh`, rows the cache's stride apart): into `out [pair][width]`, the pairs at once where
    /// they start at one position (full attention), pair by pair otherwise.
    fn weigh(
        &self,
        rows: &[&[f32]],
        vh: &[f32],
        (width, first): (usize, &dyn Fn(usize) -> usize),
        out: &mut [f32],
    ) {
        let kw = self.stride;
        let f0 = first(0);
        if (0..rows.len()).all(|j| first(j) == f0) {
            weighted_rows_strided(rows, &vh[f0 * kw..], kw, width, out);
        } else {
            for (j, (p, o)) in rows.iter().zip(out.chunks_exact_mut(width)).enumerate() {
                weighted_rows_strided(&[p], &vh[first(j) * kw..], kw, width, o);
            }
        }
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
        let (hd, qw, kw) = (self.hd, self.heads * self.hd, self.stride);
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
            // Pair `j` (head `h0 + j / n`, row `t0 + j % n`) in lane `j % LANES` of lane set
            // `j / LANES`: whole sets of rows of one head in a prefill, a decode step's heads
            // side by side.
            let lane_sets = (sets * n).div_ceil(LANES);
            let lanes = &mut lanes[..lane_sets * hd];
            pair_lanes(&self.q[t0 * qw + h0 * hd..], (qw, hd), (sets, n), lanes);
            // attn_weights = matmul(query, key_states.T) * scaling + mask: row `ti` scores
            // first(pos) ..= pos; the group's first row sees the earliest position.
            let (f0, seen) = (self.first(self.past + t0), self.past + t0 + n);
            for p in &mut probs {
                p.clear();
            }
            for p0 in (f0..seen).step_by(SPAN) {
                let span = SPAN.min(seen - p0);
                let dots = &mut dots[..lane_sets * span];
                dot_sets_strided(lanes, lane_sets, &kh[p0 * kw..], kw, span, dots);
                for (j, p) in probs[..sets * n].iter_mut().enumerate() {
                    let (s, l) = (j / LANES, j % LANES);
                    let pos = self.past + t0 + j % n;
                    let dots = &dots[s * span..][..span];
                    self.push_scores(p, dots, p0, (self.first(pos), pos + 1), l);
                }
            }
            for (j, p) in probs[..sets * n].iter_mut().enumerate() {
                softmax(h0 + j / n, p);
            }
            // attn_output = matmul(attn_weights, value_states): the group's rows at once where
            // they start at one position (full attention), row by row otherwise.
            let rows: Vec<&[f32]> = probs[..sets * n].iter().map(Vec::as_slice).collect();
            let sums = &mut block[..sets * n * hd];
            let first = |j: usize| self.first(self.past + t0 + j % n);
            self.weigh(&rows, vh, (hd, &first), sums);
            // `sums` is [set][row][hd]; the part's rows are [row][set][hd].
            for (j, sum) in sums.chunks_exact(hd).enumerate() {
                let (s, l) = (j / n, j % n);
                out[((t0 - r0 + l) * sets + s) * hd..][..hd].copy_from_slice(sum);
            }
        }
        out
    }
}

/// What a part of attention does, for choosing how many heads it runs side by side.
pub(crate) struct Work {
    /// Positions each row sees.
    pub positions: usize,
    /// Values of a cached position a score reads (`head_dim`; latent: `kv_lora_rank + rope`).
    pub key: usize,
    /// Values of a cached position a weighted sum reads (`head_dim`; latent: `kv_lora_rank`).
    pub value: usize,
    /// Multiply-adds per (head, row) pair that do not read the cache (latent attention's
    /// absorbed query and its W_UV).
    pub per_pair: usize,
}

/// Heads a part runs side by side: of the counts `s` dividing `divides` (a KV head's heads, or
/// every head of latent attention) whose pairs (`s · rows`, `rows ≤ LANES` a row group) fill at
/// most [`MAX_LANE_SETS`] lane sets, the one whose `heads / s · row_groups` parts finish first
/// on `threads` threads (rounds of `threads` parts times a part's cost), the largest of equal
/// ones. A part's cost, in scalar multiply-adds: the scores (a lane set costs its [`LANES`]
/// lanes, used or not), the weighted sums and other work per pair, and each read of the cache
/// ([`READ`]; the score tile reads it once per four lane sets, the sums once). A prefill takes
/// four heads of eight rows (two when four leave threads idle); a decode step as many single
/// rows as fill the threads' lane vectors.
pub(crate) fn heads_a_part(
    (heads, divides): (usize, usize),
    (rows, row_groups): (usize, usize),
    threads: usize,
    w: &Work,
) -> usize {
    let time = |s: usize| {
        let lane_sets = (s * rows).div_ceil(LANES);
        let reads = lane_sets / MAX_LANE_SETS + lane_sets % MAX_LANE_SETS + 1;
        let cost = lane_sets * LANES * w.positions * w.key
            + s * rows * (w.positions * w.value + w.per_pair)
            + READ * reads * w.positions * w.key.max(w.value);
        (heads / s * row_groups).div_ceil(threads.max(1)) * cost
    };
    (1..=divides)
        .filter(|&s| divides.is_multiple_of(s) && (s * rows).div_ceil(LANES) <= MAX_LANE_SETS)
        .min_by_key(|&s| (time(s), std::cmp::Reverse(s)))
        .unwrap_or(1)
}

/// Puts the queries of `sets` consecutive heads of `n ≤ LANES` consecutive rows in vector
/// lanes, as [`dot_sets_strided`] takes them: pair `j` (head `j / n`, row `j % n`) is lane
/// `j % LANES` of lane set `j / LANES`, `lanes[set · hd + a][l]` its query value `a` (`q`
/// starts at the first row's first head, rows `qw` apart, heads `hd`); lanes past the last
/// pair hold 0.0.
fn pair_lanes(
    q: &[f32],
    (qw, hd): (usize, usize),
    (sets, n): (usize, usize),
    lanes: &mut [[f32; LANES]],
) {
    for (set, lanes) in lanes.chunks_exact_mut(hd).enumerate() {
        for (a, lane) in lanes.iter_mut().enumerate() {
            for (l, v) in lane.iter_mut().enumerate() {
                let j = set * LANES + l;
                *v = if j < sets * n { q[(j % n) * qw + (j / n) * hd + a] } else { 0.0 };
            }
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
        let (hd, qw, kw) = (g.hd, g.heads * g.hd, g.stride);
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
        grouped_rows_match_one_row_at_a_time(5, 21, &[None, Some(6)]);
    }

    #[test]
    fn a_decode_step_scored_each_head_in_one_lane_of_eight_now_a_kv_heads_heads_share_them() {
        // A decode step (one row: pairs of heads fill the lanes) and a verification's 3 rows
        // (pairs straddle the lane sets).
        grouped_rows_match_one_row_at_a_time(30, 1, &[None, Some(6)]);
        grouped_rows_match_one_row_at_a_time(9, 3, &[None, Some(6)]);
    }

    #[test]
    fn a_decode_step_on_more_threads_than_kv_heads_left_threads_idle_now_spans_share_the_keys() {
        // 3 and 7 threads for 2 KV heads take `attend_spread`: scores in spans of positions
        // (several spans here, a window's first positions inside the second), sums by columns.
        grouped_rows_match_one_row_at_a_time(300, 1, &[None, Some(200)]);
        grouped_rows_match_one_row_at_a_time(300, 2, &[None, Some(200), Some(6)]);
    }

    #[test]
    fn cache_rows_of_two_kib_put_a_tiles_positions_in_two_l1_sets_now_padded_and_pads_never_read() {
        // The padded layout: rows `row_stride(width)` apart whose pads hold NaN here (the cache
        // holds zeros), so a sum that read one would not match.
        let width = 2 * 256;
        let stride = sluice_kernels::lines::row_stride(width);
        assert_eq!((stride, (4 * stride).is_multiple_of(1024)), (width + 16, false));
        for (past, t) in [(40, 9), (70, 1)] {
            grouped_rows_match_one_row_at_a_time_in((2, 256, stride), past, t, &[None, Some(6)]);
        }
    }

    fn grouped_rows_match_one_row_at_a_time(past: usize, t: usize, windows: &[Option<usize>]) {
        grouped_rows_match_one_row_at_a_time_in((2, 24, 48), past, t, windows);
    }

    fn grouped_rows_match_one_row_at_a_time_in(
        (kv_heads, hd, stride): (usize, usize, usize),
        past: usize,
        t: usize,
        windows: &[Option<usize>],
    ) {
        let heads = 4 * kv_heads;
        let positions = past + t;
        let padded = |vals: Vec<f32>| -> Vec<f32> {
            let mut rows = vec![f32::NAN; positions * stride];
            for (dst, src) in rows.chunks_exact_mut(stride).zip(vals.chunks_exact(kv_heads * hd)) {
                dst[..src.len()].copy_from_slice(src);
            }
            rows
        };
        let (q, k, v) = (
            values(t * heads * hd, 1),
            padded(values(positions * kv_heads * hd, 2)),
            padded(values(positions * kv_heads * hd, 3)),
        );
        for &window in windows {
            let (q, k, v, scale) = (&q[..], &k[..], &v[..], 0.2);
            let g = Grouped { q, k, v, stride, heads, kv_heads, hd, past, t, scale, window };
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
        // Qwen3-30B-A3B: 32 heads, 8 a KV head, head_dim 128.
        let gqa = Work { positions: 1, key: 128, value: 128, per_pair: 0 };
        assert_eq!(heads_a_part((32, 8), (8, 256), 16, &gqa), 4, "a 2,048-row prefill");
        assert_eq!(heads_a_part((32, 8), (8, 256), 2, &gqa), 4);
        assert_eq!(heads_a_part((12, 6), (8, 4), 2, &gqa), 3);
        assert_eq!(heads_a_part((4, 1), (8, 9), 2, &gqa), 1);
        // Kimi K3 (DeepSeek V3 has the same widths, 128 heads).
        let k3 = |positions| Work { positions, key: 576, value: 512, per_pair: 256 * 512 };
        assert_eq!(heads_a_part((96, 96), (8, 1), 16, &k3(512)), 3, "32 parts for 16 threads");
        assert_eq!(heads_a_part((96, 96), (8, 1), 2, &k3(512)), 4);
        assert_eq!(heads_a_part((128, 128), (8, 1), 16, &k3(512)), 4, "DeepSeek V3");
        assert_eq!(heads_a_part((3, 3), (8, 1), 16, &k3(512)), 1);
    }

    #[test]
    fn a_decode_step_ran_a_head_in_one_lane_of_eight_now_heads_share_the_lanes() {
        let gqa = Work { positions: 1, key: 128, value: 128, per_pair: 0 };
        assert_eq!(heads_a_part((32, 8), (1, 1), 2, &gqa), 8, "a KV head's 8 heads, one set");
        assert_eq!(heads_a_part((32, 8), (1, 1), 16, &gqa), 2, "16 parts for 16 threads");
        let k3 = Work { positions: 4096, key: 576, value: 512, per_pair: 256 * 512 };
        assert_eq!(heads_a_part((96, 96), (1, 1), 16, &k3), 6, "16 parts of one lane set");
        assert_eq!(heads_a_part((96, 96), (1, 1), 2, &k3), 24, "4 parts of 3 lane sets");
        assert_eq!(heads_a_part((96, 96), (3, 1), 2, &k3), 8, "3 rows: 24 pairs, 3 lane sets");
    }
}
