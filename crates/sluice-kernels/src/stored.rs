//! The nest of calls of a few activation rows (2 to [`STORED_ROWS`]) on formats a tier folds
//! straight from their stored bytes ([`Kernel::stored_rows`]): no widened copy of the weights.
//!
//! An expert of a mixture-of-experts layer sees only its share of a prefill's tokens (16 of
//! 256 for Qwen3-30B-A3B, 8 of 128 experts a token; about 5 for Kimi K3), and a speculative
//! verification pass is 2 to 8 rows. At so few activation rows a weight is used so few
//! times that reading it from memory takes as long as folding it, and the other nests put
//! the two one after the other: the few-row nest ([`crate::tiled`]) widens each chunk of 8
//! rows into a buffer and the wide nest ([`crate::wide`]) a chunk of 64 rows into a panel,
//! each pass waiting on memory before the folds start. Here each tile reads its rows' stored
//! bytes and widens them in registers as it folds, so the loads from memory run under the
//! FMAs, a token group's later sweeps find the stored bytes (half the widened ones' size for
//! bf16) in L2, and the second token group's sweep names the span the group folds next to the
//! prefetcher (measured in docs/PERFORMANCE.md, issue 20, session 21).
//!
//! **Formats** (AVX-512, [`crate::formats::Format::avx512_tile`]): bf16, row int8 and f32
//! up to 32 rows (one tile, `arch::avx512::fold_stored_tile`, over each format's widening of
//! 16 columns: zero extension and a shift, sign extension and an exact conversion, or plain
//! loads; int8's row scale still multiplies the reduced sum), 1.6× as fast as the panel at
//! 2-4 rows for int8, 1.25× for f32, about even at 32 (session 22); MXFP4 and INT4 groups (one
//! nibble tile, `formats/mxfp4_avx512.rs`) up to the few rows where widening each block
//! again for every token group of six still costs less than waiting on memory
//! ([`crate::formats::Format::AVX512_TILE_ROWS`]); FP8 blocks up to 12 rows (16 codes widened
//! through halves in a register a step, `formats/fp8_block.rs`; a layer of 32 DeepSeek-V3
//! experts from memory at 3 to 8 rows each 1.24–2.3× the buffered nest, session 39).
//!
//! **AVX2** ([`crate::formats::Format::avx2_tile`], `arch/avx2/stored.rs`): bf16 and row
//! int8 up to 32 rows, f32 up to 12, in tiles of 2 rows × 3 tokens whose 16-lane
//! accumulators are register pairs, one 8-lane half of a step at a time; at 2 rows bf16 ran
//! 2.9× and int8 1.6× as fast as the buffered few-row nest (session 26); FP8 up to 6 rows
//! (its own tile of 16 codes widened through halves, folded a half step at a time; a layer
//! from memory at 2 to 4 rows 1.13–1.99×, session 39, and 5 / 6 rows 1.22–1.31×, session
//! 40); MXFP4 up to 8 rows and INT4 up to 6 in
//! `arch::avx2::fold_nibble_tile`, a row at a time over the span (two rows' accumulators, a
//! block's four widened registers and the decoder's tables spilled out of the 16 registers),
//! 1.10–1.98× and 1.03–1.79× (session 39).
//!
//! The blocking is otherwise the wide nest's: row groups of [`GROUP`] rows whose
//! accumulators live in the thread's scratch between chunks of [`WIDE_CHUNK`] columns, token
//! groups of the tier's tile ([`crate::sweep`]), tiles of up to 4 rows. The call's
//! activations are copied once into the scratch's panel (which this nest does not otherwise
//! use), rows on cache lines and off the 4 KiB stride, so that no activation load straddles two
//! lines and the group's rows do not all fall in one L1 set; where they do not fit there, a
//! token group's chunk is copied into the stage for every row group (session 38: read where
//! they lie, bf16 gained 4–11% at 16–24 rows and MXFP4 lost 5–9% at 12).
//!
//! **Exactness** is every nest's: accumulators start at +0.0, are stored and reloaded
//! bit-unchanged between chunks, every span starts at a multiple of 16 columns and spans are
//! folded in increasing column order, and the widened values are the format's
//! `fold_values`. Only rows whose width is a multiple of 16 come here (no partial last step),
//! so every result is the canonical reduction of [`crate::matmul`].

use std::ops::Range;

use crate::formats::Format;
use crate::matmul::Matrix;
use crate::sweep::{group, tile_rows};
use crate::tiled::{Kernel, Lanes};
use crate::wide::{group_rows, GROUP, PANEL_STRIDE, WIDE_CHUNK};

/// The most activation rows a call folds from the stored bytes (more: the panel pays).
pub(crate) const STORED_ROWS: usize = 32;

/// Whether [`run`] serves a call of `t` activation rows against `m` on the tier `K`.
pub(crate) fn serves<K: Kernel, F: Format>(m: &Matrix<'_>, t: usize) -> bool {
    t <= K::stored_rows::<F>().min(STORED_ROWS) && m.cols().is_multiple_of(16)
}

/// Floats from one staged activation row to the next in [`run`]'s call-wide stage: the row
/// in whole lines, and one line more, so that rows whose length is a multiple of 4 KiB do
/// not all fall in the same L1 sets.
pub(crate) fn whole_stride(cols: usize) -> usize {
    cols.next_multiple_of(16) + 16
}

/// `emit(ti, r, Σ_c W[r, c] · x[ti, c])` for every `r` in `rows` and `ti < t`, in the
/// canonical order, with `acc` (at least `GROUP * t` accumulators) as the row group's, and
/// the activations staged once for the call in `whole` where they fit there (rows
/// [`whole_stride`] floats apart), else a token group's chunk at a time in `stage` (the pair
/// `(stage, whole)`).
///
/// # Safety
/// The running CPU supports the tier `K`; [`serves`] holds.
pub(crate) unsafe fn run<K: Kernel, F: Format>(
    acc: &mut [Lanes],
    (stage, whole): (&mut [f32], &mut [f32]),
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    mut emit: impl FnMut(usize, usize, f32),
) {
    let cols = m.cols();
    // The call's activations staged once, on cache lines and off the 4 KiB stride, where they
    // fit in `whole`: copied a token group's chunk at a time for every row group instead, the
    // copies took 2% of a 256-token prefill (an expert's 16 rows at 768 and 2,048 columns).
    let stride = whole_stride(cols);
    let once = t * stride <= whole.len();
    if once {
        for (i, w) in whole.chunks_exact_mut(stride).take(t).enumerate() {
            w[..cols].copy_from_slice(&x[i * cols..][..cols]);
        }
    }
    // The token group whose sweep names the next span to the prefetcher: the second (the
    // first reads what the previous chunk's second named), or the only one.
    let first = group::<K>(t, false);
    let namer = if first < t { first } else { 0 };
    for g0 in rows.clone().step_by(GROUP) {
        let gr = GROUP.min(rows.end - g0);
        let acc = &mut acc[..gr * t];
        acc.fill([0.0; 16]);
        let views = group_rows::<F>(m, g0, gr);
        let g = Group::<F> { rows: &views, gr, t };
        for c0 in (0..cols).step_by(WIDE_CHUNK) {
            let len = WIDE_CHUNK.min(cols - c0);
            // Bytes from a row's span to the span the group folds next: the same row's next
            // chunk, or the row a group on's first chunk (none after the last group).
            let row_bytes = F::row_bytes(views[0]);
            let next = if c0 + len < cols {
                row_bytes * len / cols
            } else if g0 + GROUP < rows.end {
                GROUP * row_bytes - row_bytes * c0 / cols
            } else {
                0
            };
            let mut j = 0;
            while j < t {
                let n = group::<K>(t - j, false);
                let (xs, xstride) = if once {
                    (&whole[j * stride + c0..], stride)
                } else {
                    // The group's activations on cache lines, rows a line off the 4 KiB
                    // stride.
                    for (i, st) in stage.chunks_exact_mut(PANEL_STRIDE).take(n).enumerate() {
                        st[..len].copy_from_slice(&x[(j + i) * cols + c0..][..len]);
                    }
                    (&*stage, PANEL_STRIDE)
                };
                let ahead = if j == namer { next } else { 0 };
                // SAFETY: guaranteed by the caller (every arm).
                unsafe {
                    match n {
                        6 => g.sweep::<K, 6>(acc, (xs, xstride), c0, len, j, ahead),
                        5 => g.sweep::<K, 5>(acc, (xs, xstride), c0, len, j, ahead),
                        4 => g.sweep::<K, 4>(acc, (xs, xstride), c0, len, j, ahead),
                        3 => g.sweep::<K, 3>(acc, (xs, xstride), c0, len, j, ahead),
                        2 => g.sweep::<K, 2>(acc, (xs, xstride), c0, len, j, ahead),
                        _ => g.sweep::<K, 1>(acc, (xs, xstride), c0, len, j, ahead),
                    }
                }
                j += n;
            }
        }
        // SAFETY: the caller guarantees the tier.
        unsafe {
            crate::reduce::reduce_rows::<K>(acc, t, gr, |j, i, s| {
                emit(j, g0 + i, F::finish(views[i], s));
            });
        }
    }
}

/// One row group of a call: its rows, how many, and the call's shape.
struct Group<'g, 'm, F: Format> {
    rows: &'g [F::Row<'m>; GROUP],
    gr: usize,
    t: usize,
}

impl<F: Format> Group<'_, '_, F> {
    /// Folds columns `c0 .. c0 + len` of every row of the group against tokens `j .. j + N`
    /// (the staged rows `stage`, `stride` floats apart, from token `j`'s column `c0`), in
    /// tiles of [`tile_rows`] rows; the first token group's tiles name the next tile's bytes
    /// to the prefetcher.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`; the span lies in the rows.
    unsafe fn sweep<K: Kernel, const N: usize>(
        &self,
        acc: &mut [Lanes],
        (stage, stride): (&[f32], usize),
        c0: usize,
        len: usize,
        j: usize,
        ahead: usize,
    ) {
        let xs: [&[f32]; N] = std::array::from_fn(|i| &stage[i * stride..][..len]);
        let most = tile_rows::<K>(N, false);
        let mut r = 0;
        while r < self.gr {
            // SAFETY: guaranteed by the caller (every arm).
            r += unsafe {
                match most.min(self.gr - r) {
                    4 => self.tile::<K, 4, N>(acc, xs, c0, r, j, ahead),
                    3 => self.tile::<K, 3, N>(acc, xs, c0, r, j, ahead),
                    2 => self.tile::<K, 2, N>(acc, xs, c0, r, j, ahead),
                    _ => self.tile::<K, 1, N>(acc, xs, c0, r, j, ahead),
                }
            };
        }
    }

    /// One R × N tile (rows `r .. r + R`, tokens `j .. j + N`); returns R.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`; the span lies in the rows.
    unsafe fn tile<K: Kernel, const R: usize, const N: usize>(
        &self,
        acc: &mut [Lanes],
        xs: [&[f32]; N],
        c0: usize,
        r: usize,
        j: usize,
        ahead: usize,
    ) -> usize {
        let rows: [F::Row<'_>; R] = std::array::from_fn(|i| self.rows[r + i]);
        let mut it = acc[r * self.t..].chunks_exact_mut(self.t);
        let a: [&mut [Lanes; N]; R] = std::array::from_fn(|_| {
            let row = it.next().expect("invariant: R rows of accumulators");
            (&mut row[j..j + N]).try_into().expect("invariant: N tokens were sliced")
        });
        // SAFETY: guaranteed by the caller.
        unsafe { K::fold_stored::<F, R, N>(rows, c0, xs, a, ahead) };
        R
    }
}
