//! The AVX2 tier's weighted sums ([`super::weighted_rows_on`]) for a prefill's calls of more
//! than one vector of rows: blocks of positions that every row pair of the call folds while
//! the block's values are in L1.
//!
//! **Why.** A KV cache row holds every KV head's values (Qwen3-30B-A3B and GPT-OSS: 512
//! floats, 2 KiB), so a tile's 16 columns of successive positions lie 2 KiB apart: all in two
//! of the L1's 64 sets, where at most 16–24 lines fit. The generic tiles ([`super::tiles`])
//! stream every position of the call once per group of rows, and on AVX2 they reached ~50% of
//! the tier's f64 FMA peak (the same tiles with the cache rows 2,112 bytes apart: ~57%; the
//! generic tile of 4 rows × 16 columns also keeps accumulators on the stack: 16 of AVX2's 16
//! registers). Here a block of [`BLOCK`] positions' tile is read from L2 once per call,
//! widened into a 4 KiB buffer, and folded from L1 by every pair of rows; a pair's tile holds 8
//! accumulators, the pair's two weights broadcast and one vector of 4 values at a time: 11
//! registers. The rows' weights are widened once per call, block-major (row after row, every
//! row's block would fall in the same L1 sets again).
//!
//! **Exactness.** Each column's sum is the generic one: from +0.0, the terms all the group's
//! rows have (positions below the group's shortest row) in increasing position, block after
//! block, then the row's own remaining terms in increasing position; every term fused
//! (`fma(weight, value, acc)`: the product of two values widened from f32 is exact in f64, so
//! fusing changes nothing); columns past the last whole tile one sum at a time.

use std::arch::x86_64::{
    __m256d, _mm256_broadcast_sd, _mm256_fmadd_pd, _mm256_loadu_pd, _mm256_storeu_pd,
};

thread_local! {
    /// This thread's widened weights, kept for its life: a prefill part's are half a MiB (32 rows
    /// of 2,048 positions), which made afresh every call would be page faults and zero fill.
    static WIDE: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer for widened weights ([`crate::kept`]); `f` writes what it
/// reads.
pub(super) fn with_wide<R>(f: impl FnOnce(&mut Vec<f64>) -> R) -> R {
    crate::kept::with_kept(&WIDE, Vec::new, f)
}

/// Columns of a tile.
const COLS: usize = 16;
/// Positions of a block: their widened tile (4 KiB) and the rows' weights of the block stay in
/// L1 while every pair of rows folds them.
const BLOCK: usize = 32;

/// `out[r · width + a] = Σ_i p[r][i] · m[i · stride + a]` (see [`super::weighted_rows_on`]),
/// with `wide` as scratch for the rows' widened weights.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `out.len() == p.len() · width`; `(n - 1) · stride + width
/// <= m.len()` for the longest row's `n` (the caller's assertions).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_rows_blocked(
    p: &[&[f32]],
    m: &[f32],
    (stride, width): (usize, usize),
    out: &mut [f32],
    wide: &mut Vec<f64>,
) {
    // Pairs of rows, the last row alone if the count is odd: (first row, rows, joint terms).
    let groups: Vec<(usize, usize, usize)> = (0..p.len())
        .step_by(2)
        .map(|r| {
            let n = 2.min(p.len() - r);
            (r, n, p[r..r + n].iter().map(|x| x.len()).min().unwrap_or(0))
        })
        .collect();
    let longest = groups.iter().map(|g| g.2).max().unwrap_or(0);
    // The rows' joint weights widened once, block-major: block `k`'s weights of row `r` at
    // `(k · rows + r) · BLOCK` (row after row, a row's 2,048 weights would put every row's
    // block in the same L1 sets).
    let rows = p.len();
    // Grown only: every entry `weights` reads is written below first (a row's entries past
    // its joint terms are never read), so what earlier calls left needs no zeroing.
    let need = longest.div_ceil(BLOCK) * rows * BLOCK;
    if wide.len() < need {
        wide.resize(need, 0.0);
    }
    for &(r, n, joint) in &groups {
        for (k, row) in p[r..r + n].iter().enumerate() {
            // A block's weights at a time (one at a time, the index arithmetic took about a
            // tenth of the call).
            for (kb, chunk) in row[..joint].chunks(BLOCK).enumerate() {
                let at = (kb * rows + r + k) * BLOCK;
                for (d, &x) in wide[at..at + chunk.len()].iter_mut().zip(chunk) {
                    *d = f64::from(x);
                }
            }
        }
    }
    let weights = |kb: usize, r: usize| &wide[(kb * rows + r) * BLOCK..][..BLOCK];
    let mut acc = vec![[[0.0f64; COLS]; 2]; groups.len()];
    let mut block = [[0.0f64; COLS]; BLOCK];
    let mut a0 = 0;
    while a0 + COLS <= width {
        acc.iter_mut().for_each(|a| *a = [[0.0; COLS]; 2]);
        for b0 in (0..longest).step_by(BLOCK) {
            // The block's values of the tile, widened, position after position.
            let bn = BLOCK.min(longest - b0);
            for (k, dst) in block.iter_mut().enumerate().take(bn) {
                let row = &m[(b0 + k) * stride + a0..][..COLS];
                for (d, &x) in dst.iter_mut().zip(row) {
                    *d = f64::from(x);
                }
            }
            // The next block's lines of the tile (or the next tile's first block's), named to
            // the L2 while the pairs fold this one: 2,048 cache rows 2 KiB apart sit in 32 of
            // the L2's sets too, so without it the tile came from L3 with nothing to hide it.
            let next = if b0 + BLOCK < longest { (b0 + BLOCK, a0) } else { (0, a0 + COLS) };
            if next.1 + COLS <= width {
                let n1 = (next.0 + BLOCK).min(longest);
                super::tiles::name_rows(&m[next.1..], (stride, COLS), next.0..n1);
            }
            for (&(r, n, joint), acc) in groups.iter().zip(acc.iter_mut()) {
                let span = (0, BLOCK.min(joint.saturating_sub(b0)));
                if span.1 == 0 {
                    continue;
                }
                // SAFETY: the tier is this function's; `span.1 <= BLOCK`.
                unsafe {
                    let kb = b0 / BLOCK;
                    if n == 2 {
                        fold::<2>([weights(kb, r), weights(kb, r + 1)], &block, span, acc);
                    } else {
                        fold::<1>([weights(kb, r)], &block, span, acc);
                    }
                }
            }
        }
        for (&(r, n, joint), acc) in groups.iter().zip(&mut acc) {
            for (k, acc) in acc.iter_mut().enumerate().take(n) {
                // The row's own terms, past the group's joint ones, in increasing position.
                for (i, &pi) in p[r + k].iter().enumerate().skip(joint) {
                    let pv = f64::from(pi);
                    for (a, &lv) in acc.iter_mut().zip(&m[i * stride + a0..][..COLS]) {
                        *a = pv.mul_add(f64::from(lv), *a);
                    }
                }
                for (o, &a) in out[(r + k) * width + a0..][..COLS].iter_mut().zip(acc.iter()) {
                    #[allow(clippy::cast_possible_truncation)]
                    {
                        *o = a as f32;
                    }
                }
            }
        }
        a0 += COLS;
    }
    super::tiles::columns_one_at_a_time::<true>(p, (m, stride, width), a0, out);
}

/// Adds to `acc[..R]` the terms `start..end` of a block (its positions in increasing order) of
/// the tile's 16 columns of the `R` rows whose widened weights of the block are `rows`, the
/// block's `i`-th position's widened values at `block[i]`.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `end <= BLOCK`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fold<const R: usize>(
    rows: [&[f64]; R],
    block: &[[f64; COLS]; BLOCK],
    (start, end): (usize, usize),
    acc: &mut [[f64; COLS]],
) {
    assert!(acc.len() >= R, "latent::avx2::fold: accumulators");
    debug_assert!(end <= BLOCK && rows.iter().all(|r| r.len() >= end));
    let mut v: [[__m256d; 4]; R] = std::array::from_fn(|r| {
        // SAFETY: `acc[r]` holds 16 f64, four vectors of 4.
        std::array::from_fn(|c| unsafe { _mm256_loadu_pd(acc[r].as_ptr().add(4 * c)) })
    });
    for i in start..end {
        // SAFETY: `i < end <= BLOCK`, and `rows[r]` and `block` hold `BLOCK` each.
        unsafe {
            let b: [__m256d; R] =
                std::array::from_fn(|r| _mm256_broadcast_sd(rows[r].get_unchecked(i)));
            let row = block.get_unchecked(i).as_ptr();
            for c in 0..4 {
                let t = _mm256_loadu_pd(row.add(4 * c));
                for (v, &b) in v.iter_mut().zip(&b) {
                    v[c] = _mm256_fmadd_pd(b, t, v[c]);
                }
            }
        }
    }
    for (a, v) in acc.iter_mut().zip(&v) {
        for (c, &x) in v.iter().enumerate() {
            // SAFETY: `a` holds 16 f64.
            unsafe { _mm256_storeu_pd(a.as_mut_ptr().add(4 * c), x) };
        }
    }
}
