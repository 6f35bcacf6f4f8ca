//! The last step of every output cell: its 16-lane accumulator reduced to one sum by
//! [`reduce16`]'s tree (lane `l` plus lane `l + 8`, then `+ 4`, `+ 2`, `+ 1`), 16 cells at a
//! time on the SIMD tiers ([`Kernel::reduce16x16`]).
//!
//! One cell at a time, the tree is 15 dependent scalar additions and a few moves: at 16
//! activation rows (an expert's share of a 256-token prefill) and 768 columns (Qwen3-30B-A3B's
//! down projection) a cell has only 48 FMAs of 16 lanes, so the reduction was a share of the
//! call's time the FMAs' own size. 16 cells at once, the tree is 15 vector additions and 30
//! shuffles for all 16 (AVX-512): the shuffles only gather the lanes each addition pairs.
//! Where a row's accumulators lie side by side (the prefill nest, 16 activation rows or more)
//! [`reduce_run`] takes them 16 at a time in place; gathering each batch cell by cell
//! ([`reduce_cells`], 24 bytes a cell) cost about as much as the reductions themselves, so
//! a row group of fewer tokens ([`reduce_rows`]) takes a token's accumulators of 16 rows,
//! a row apart, straight from the group's buffer, and its 16 sums are one run of the output.
//!
//! **Exactness.** Each cell's sum takes the same additions as [`reduce16`]: at every level,
//! the same two partial sums, the lower lanes' as the first operand. Vectors only carry
//! several cells' partial sums side by side, so every cell's result is [`reduce16`]'s bit
//! for bit (tested below on every tier the CPU has, with zeros of both signs, infinities,
//! NaNs and subnormals).

use crate::matmul::reduce16;
use crate::tiled::{Kernel, Lanes};

/// A cell's accumulator that is not there: the lanes of the unused places of the last batch
/// of 16 (never emitted).
static NONE: Lanes = [0.0; 16];

/// Reduces each cell `(j, r, lanes)` of `cells` to [`reduce16`]`(lanes)` and hands it to
/// `out(j, r, sum)`, in the cells' order; full batches of 16 go through the tier's
/// [`Kernel::reduce16x16`], the rest one at a time.
///
/// # Safety
/// The running CPU supports the tier `K`.
#[inline]
pub(crate) unsafe fn reduce_cells<'a, K: Kernel>(
    cells: impl Iterator<Item = (usize, usize, &'a Lanes)>,
    mut out: impl FnMut(usize, usize, f32),
) {
    let mut batch: [(usize, usize, &Lanes); 16] = [(0, 0, &NONE); 16];
    let mut n = 0;
    for cell in cells {
        batch[n] = cell;
        n += 1;
        if n == 16 {
            // SAFETY: the caller guarantees the tier.
            let sums = unsafe { K::reduce16x16(batch.map(|(_, _, l)| l)) };
            for (&(j, r, _), s) in batch.iter().zip(sums) {
                out(j, r, s);
            }
            n = 0;
        }
    }
    for &(j, r, lanes) in &batch[..n] {
        out(j, r, reduce16(*lanes));
    }
}

/// Reduces each accumulator `lanes[k]` to [`reduce16`]`(lanes[k])` and hands it to
/// `out(k, sum)`, in order: 16 side by side at a time through the tier's
/// [`Kernel::reduce16x16`] (no batch gathered cell by cell, as [`reduce_cells`] must), the
/// last few one at a time.
///
/// # Safety
/// The running CPU supports the tier `K`.
#[inline]
pub(crate) unsafe fn reduce_run<K: Kernel>(lanes: &[Lanes], mut out: impl FnMut(usize, f32)) {
    let mut batches = lanes.chunks_exact(16);
    let mut k = 0;
    for batch in &mut batches {
        // SAFETY: the caller guarantees the tier.
        let sums = unsafe { K::reduce16x16(std::array::from_fn(|i| &batch[i])) };
        for s in sums {
            out(k, s);
            k += 1;
        }
    }
    for lanes in batches.remainder() {
        out(k, reduce16(*lanes));
        k += 1;
    }
}

/// Reduces a row group's accumulators `acc` (its `rows` rows one after the other, `t` tokens
/// each) to [`reduce16`] of each and hands them to `out(token, row, sum)`: a token's sums of 16
/// rows at a time, through the tier's [`Kernel::reduce16x16`] over accumulators a row apart,
/// so that the 16 sums of a token are one run of the output; rows past the last 16 one cell
/// at a time. (Gathered cell by cell in rows' order, [`reduce_cells`]' batches took 5–13% of
/// an expert's call at 8–24 activation rows, and the 16 sums of a batch went to 16 output
/// rows.)
///
/// # Safety
/// The running CPU supports the tier `K`.
///
/// # Panics
/// If `acc` holds fewer than `rows · t` accumulators.
#[inline]
pub(crate) unsafe fn reduce_rows<K: Kernel>(
    acc: &[Lanes],
    t: usize,
    rows: usize,
    mut out: impl FnMut(usize, usize, f32),
) {
    let acc = &acc[..rows * t];
    let full = rows - rows % 16;
    for i0 in (0..full).step_by(16) {
        for j in 0..t {
            let lanes: [&Lanes; 16] = std::array::from_fn(|k| &acc[(i0 + k) * t + j]);
            // SAFETY: the caller guarantees the tier.
            let sums = unsafe { K::reduce16x16(lanes) };
            for (k, s) in sums.into_iter().enumerate() {
                out(j, i0 + k, s);
            }
        }
    }
    for i in full..rows {
        for j in 0..t {
            out(j, i, reduce16(acc[i * t + j]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Portable;

    /// Accumulators whose sums round differently in every order but [`reduce16`]'s, with
    /// zeros of both signs, infinities of both signs, NaNs and subnormals among them.
    fn cells(seed: u32) -> Vec<Lanes> {
        let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
        let specials =
            [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-41, f32::MAX];
        (0..64)
            .map(|c| {
                std::array::from_fn(|l| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    let v = f32::from_bits((s & 0x807F_FFFF) | ((100 + s % 56) << 23));
                    // A few cells carry a special value in one lane.
                    if c % 9 == 0 && l == (c / 9) % 16 {
                        specials[(c / 9) % specials.len()]
                    } else {
                        v
                    }
                })
            })
            .collect()
    }

    fn check<K: Kernel>(name: &str) {
        for seed in 1..20 {
            let acc = cells(seed);
            for len in [0, 1, 15, 16, 17, 33, 64] {
                let mut got = Vec::new();
                let it = acc[..len].iter().enumerate().map(|(i, l)| (i / 5, i % 5, l));
                // SAFETY: only called for tiers the CPU has (below).
                unsafe { reduce_cells::<K>(it, |j, r, s| got.push((j, r, s.to_bits()))) };
                let want: Vec<(usize, usize, u32)> = acc[..len]
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i / 5, i % 5, reduce16(*l).to_bits()))
                    .collect();
                assert_eq!(got, want, "{name}, seed {seed}, {len} cells");
                let mut run = Vec::new();
                // SAFETY: as above.
                unsafe {
                    reduce_run::<K>(&acc[..len], |k, s| run.push((k / 5, k % 5, s.to_bits())))
                };
                assert_eq!(run, want, "{name}, seed {seed}, {len} accumulators side by side");
            }
            // A row group of `rows` rows × `t` tokens, row after row.
            for (rows, t) in [(1, 1), (16, 1), (16, 3), (17, 2), (33, 1), (15, 4), (32, 2)] {
                let mut got = Vec::new();
                // SAFETY: as above.
                unsafe { reduce_rows::<K>(&acc, t, rows, |j, i, s| got.push((i, j, s.to_bits()))) };
                got.sort_unstable();
                let want: Vec<(usize, usize, u32)> = (0..rows)
                    .flat_map(|i| (0..t).map(move |j| (i, j)))
                    .map(|(i, j)| (i, j, reduce16(acc[i * t + j]).to_bits()))
                    .collect();
                assert_eq!(got, want, "{name}, seed {seed}, {rows} rows x {t} tokens");
            }
        }
    }

    #[test]
    fn sixteen_cells_reduced_at_once_equal_reduce16_bit_for_bit_on_every_tier() {
        check::<Portable>("portable");
        #[cfg(target_arch = "x86_64")]
        {
            if crate::isa::Isa::Avx2.is_available() {
                check::<crate::arch::avx2::Avx2>("avx2");
            }
            if crate::isa::Isa::Avx512.is_available() {
                check::<crate::arch::avx512::Avx512>("avx512");
            }
        }
        #[cfg(target_arch = "aarch64")]
        check::<crate::arch::aarch64::Neon>("neon");
    }
}
