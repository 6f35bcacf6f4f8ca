//! The loop nest every tier runs a matmul in: row blocks × token blocks × column chunks ×
//! register tiles, with each (row, token) pair's 16-lane accumulator kept in memory between
//! chunks.
//!
//! A tier supplies three pieces through [`Kernel`]: `decode`, which widens a span of one
//! weight row to f32 (through the row's format, `crate::formats`); `fold`, which folds a span of widened weights into the accumulators of
//! a tile of R weight rows × N activation rows; and `fold_one`, the one-activation-row case
//! fused (decode in registers, no buffer), which a tier may leave to the buffered default.
//! This module owns everything else, identically for every tier:
//!
//! - **One activation row** (decode, the common case): row tiles of four (one for bf16:
//!   [`Format::ONE_ROW_TILE`], whose rows a tier folds one after another in one loop,
//!   [`Kernel::fold_one_rows`]), long spans, and the
//!   next tile's bytes prefetched while this one is computed (weights are read several rows at
//!   a time, which hardware prefetchers follow poorly). The kernels prefetch as they go, a
//!   cache line of the next tile per line consumed (bursts of prefetches between spans left
//!   the loads queued behind them); MXFP4's block scales are named between spans.
//! - **Several rows: decode once, reuse for every token.** Each row's [`CHUNK`]-column span is
//!   widened once per block of up to [`TOKEN_BLOCK`] activation rows into a stack buffer, so
//!   a verification pass of 8 rows pays the MXFP4 or int8 decode once, not eight times. Calls
//!   of more rows (prefill chunks) take the compute-bound nest of [`crate::wide`], and calls
//!   of 2 to 32 rows (12 for MXFP4, INT4 and FP8 on AVX-512, f32 on AVX2) on a format the tier
//!   folds from its stored bytes take [`crate::stored`].
//! - **Activations stay in L1.** A chunk of each activation row (2 KiB) is reused by all
//!   [`ROW_BLOCK`] weight rows of the block before the next chunk is touched; without this a
//!   T-row call streams all T activation rows from L2 once per weight row.
//! - **Independent FMA chains.** A tile of R × N accumulators gives R · N independent
//!   dependency chains (four rows at T = 1, 2 × 3 beyond, 4 × 6 on AVX-512's 32 registers,
//!   3 × 4 in AVX2's half tiles of the prefill nest, [`Kernel::fold_half`]),
//!   enough to hide FMA latency; a single row's lanes alone would leave the FMA units idle
//!   most of the time. A tile loads its R weight vectors once per 16-column step and each of
//!   its N activation vectors once, R + N loads per R · N FMAs.
//!
//! **Exactness.** Accumulators start at +0.0 and are stored and reloaded bit-unchanged between
//! chunks; every span starts at a multiple of 16 columns, so local index `i` lands in lane
//! `(c0 + i) % 16 = i % 16`; spans are folded in increasing column order; and the final
//! partial 16-column step folds +0.0-padded weights against −0.0-padded activations, where
//! `fma(+0, −0, acc) = acc + (−0) = acc` exactly for every `acc`, ±0.0 included. (An
//! accumulator can be −0.0: `fma(−a, b, +0)` with a product too small for a subnormal rounds to
//! −0.0. Padding both with +0.0 added +0.0, which turned such a −0.0 into +0.0 on the SIMD
//! tiers only.) So each (row, token) result is
//! the canonical reduction of [`crate::matmul`], whatever the block sizes, tile shapes, number
//! of activation rows or tier.

use std::ops::Range;

use crate::arch::prefetch;
use crate::formats::Format;
use crate::matmul::{reduce16, Matrix};
use crate::sweep::fold_tiles;

pub(crate) use crate::buffered::{fold_one_buffered, fold_stored_buffered};

/// Weight rows decoded together for each column chunk.
pub(crate) const ROW_BLOCK: usize = 8;
/// Activation rows whose accumulators are live together in a call of a few rows (a
/// verification pass).
pub(crate) const TOKEN_BLOCK: usize = 8;
/// Columns per chunk: a multiple of 128 (the largest format block, FP8's) and hence of 32
/// (MXFP4's and INT4's) and 16 (the lane count).
pub(crate) const CHUNK: usize = 512;

const _: () = assert!(CHUNK.is_multiple_of(128));

/// One 16-lane accumulator.
pub(crate) type Lanes = [f32; 16];

/// Copies each activation row `x[j]` into `stage[j]` whole, if there is a stage: what the
/// default [`Kernel::fold_wide`] and [`Kernel::fold_half_wide`] do before they fold.
fn copy_stage<const N: usize>(stage: Option<[&mut [f32]; N]>, x: &[&[f32]; N]) {
    for (s, xj) in stage.into_iter().flatten().zip(x) {
        s.copy_from_slice(xj);
    }
}

/// The length of a fold's span: every weight and activation slice's, a multiple of 16 columns
/// (what every tier's `fold` and `fold_half` asserts before it reads).
///
/// # Panics
/// If the slices' lengths differ or are not a multiple of 16.
#[inline(always)]
pub(crate) fn span_len<const R: usize, const N: usize>(w: &[&[f32]; R], x: &[&[f32]; N]) -> usize {
    let len = w.first().map_or(0, |s| s.len());
    assert!(len.is_multiple_of(16), "fold span");
    assert!(w.iter().all(|s| s.len() == len) && x.iter().all(|s| s.len() == len));
    len
}

/// The two per-tier pieces of the loop nest.
pub(crate) trait Kernel {
    /// Whether the tier has 32 vector registers that each hold a 16-lane accumulator
    /// (AVX-512): its `fold` then takes tiles of 4 weight rows × up to 6 activation rows
    /// (24 accumulators, 4 weight registers, 1 activation register), which keeps the FMA units
    /// busy with 10 loads per 24 FMAs. Otherwise tiles of whole accumulators are at most
    /// 2 × 3 (12 of AVX2's 16 registers as accumulators).
    const WIDE: bool = false;

    /// Whether the tier's registers hold half a 16-lane accumulator (AVX2), so that the
    /// prefill nest ([`crate::wide`]) folds one 8-lane half at a time
    /// ([`Kernel::fold_half`]) in tiles of 3 weight rows × 4 activation rows, on a weight
    /// panel stored half-split.
    const HALVES: bool = false;

    /// Widens elements `c0 .. c0 + out.len()` of `row` to the f32 values the matmul folds
    /// (`Format::fold_values`: [`Matrix::get`]'s, except an int8 row's integers, whose row scale
    /// is applied to the reduced sum), except that a zero weight may come out as either +0.0 or −0.0: the sign of a zero weight never
    /// changes a folded result (see the module docs: `fma(±0, x, acc)` is `acc` for a non-zero
    /// `acc`, +0.0 for a zero one, and the same NaN for an infinite or NaN `x`).
    ///
    /// # Safety
    /// The running CPU supports the tier. The span lies inside the row, `c0` is a multiple
    /// of [`Format::BLOCK`], and so is `out.len()` unless the span ends the row
    /// (implementations assert what they rely on).
    unsafe fn decode<F: Format>(row: F::Row<'_>, c0: usize, out: &mut [f32]);

    /// For every `r < R`, `j < N` and `i` in increasing order,
    /// `acc[r][j][i % 16] = fma(w[r][i], x[j][i], acc[r][j][i % 16])`. Every slice has the
    /// same length, a multiple of 16 (implementations assert it).
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn fold<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    );

    /// [`Kernel::fold`] one 8-lane half at a time (lanes 0–7 over the whole span, then lanes
    /// 8–15), so that an accumulator is one 8-lane register, on weights stored **half-split**:
    /// each `w[r]` holds lanes 0–7 of every 16-column step (`8k + l` is column `16k + l`),
    /// then lanes 8–15 (`len / 2 + 8k + l` is column `16k + 8 + l`); activations stay in
    /// column order. Every lane takes the same FMAs in the same order as in `fold`, hence the
    /// same bits. Only tiers with [`Kernel::HALVES`] are given split weights; the default is
    /// the element-by-element reference of the split order.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn fold_half<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
    ) {
        for (wr, ar) in w.iter().zip(acc) {
            let half = wr.len() / 2;
            for (xj, lanes) in x.iter().zip(ar.iter_mut()) {
                assert!(wr.len() == xj.len() && wr.len().is_multiple_of(16), "fold lengths");
                for (k, xc) in xj.chunks_exact(16).enumerate() {
                    for (l, (a, &xl)) in lanes.iter_mut().zip(xc).enumerate() {
                        let wl = wr[(l / 8) * half + 8 * k + l % 8];
                        *a = wl.mul_add(xl, *a);
                    }
                }
            }
        }
    }

    /// [`Kernel::fold_half`] as the prefill nest ([`crate::wide`]) calls it, with the extras
    /// of [`Kernel::fold_wide`] (which change no result): `ahead`'s cache lines named to the
    /// prefetcher, one per 16-column step from its start while any are left, and with `stage`, every activation
    /// value the fold loads also stored at the same place of `stage[j]`. The default stores
    /// the whole span first and prefetches nothing.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn fold_half_wide<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: &[u8],
        stage: Option<[&mut [f32]; N]>,
    ) {
        let _ = ahead;
        copy_stage(stage, &x);
        // SAFETY: guaranteed by the caller.
        unsafe { Self::fold_half(w, x, acc) }
    }

    /// [`Kernel::fold`] as the prefill nest ([`crate::wide`]) calls it, with two extras that
    /// change no result: the cache lines of `ahead` are named to the prefetcher, one per
    /// 16-column step from its start (at most `ahead.len() / 64` of them: an activation row's
    /// span, or the stored bytes of a weight row's next span), and with `stage`,
    /// every activation vector the fold loads is also stored at the same place of
    /// `stage[j]` (each as long as the span). The default stores the whole span first and
    /// prefetches nothing; a tier overrides it to do both inside its fold loop.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    ///
    /// # Panics
    /// If the slices' lengths differ or are not a multiple of 16.
    unsafe fn fold_wide<const R: usize, const N: usize>(
        w: [&[f32]; R],
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: &[u8],
        stage: Option<[&mut [f32]; N]>,
    ) {
        let _ = ahead;
        copy_stage(stage, &x);
        // SAFETY: guaranteed by the caller.
        unsafe { Self::fold(w, x, acc) }
    }

    /// The one-activation-row case fused: for every `r < R` and `i` in increasing order,
    /// `acc[r][i % 16] = fma(W_r[c0 + i], x[i], acc[r][i % 16])`, where `W_r` is row `r`
    /// widened as by `decode`. `c0` and `x.len()` are multiples of 16 and of
    /// [`Format::BLOCK`].
    ///
    /// The default decodes [`CHUNK`] columns at a time into a buffer and calls `fold`; a tier
    /// overrides it to keep the widened weights in registers.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn fold_one<F: Format, const R: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        // SAFETY: guaranteed by the caller.
        unsafe { fold_one_buffered::<Self, F, R>(rows, c0, x, acc) }
    }

    /// [`Kernel::fold_one`] of each of `rows` in turn, over all of `x` from column 0 (a
    /// multiple of 16 and of [`Format::BLOCK`] long), into `acc[i][0]`: what a format read one
    /// row at a time ([`Format::ONE_ROW_TILE`] 1) takes, so that a tier can keep the loop over
    /// rows in its own code. The default folds each row in [`ONE_SPAN`] spans.
    ///
    /// # Safety
    /// The running CPU supports the tier; `acc` holds an entry per row.
    unsafe fn fold_one_rows<F: Format, const TB: usize>(
        rows: &[F::Row<'_>],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        for (&row, a) in rows.iter().zip(acc) {
            for c0 in (0..x.len()).step_by(ONE_SPAN) {
                let span = &x[c0..(c0 + ONE_SPAN).min(x.len())];
                // SAFETY: guaranteed by the caller; spans start at multiples of `ONE_SPAN`.
                unsafe { Self::fold_one::<F, 1>([row], c0, span, [&mut a[0]]) };
            }
        }
    }

    /// The most activation rows of a call for which the tier folds `F`'s rows straight from
    /// their stored bytes ([`Kernel::fold_stored`]) rather than through widened copies (what
    /// the nest of [`crate::stored`] needs); 0 where it never does.
    fn stored_rows<F: Format>() -> usize {
        0
    }

    /// [`Kernel::fold`] of `R` rows read from their stored bytes (columns `c0 ..` as many as
    /// every `x[j]` holds: a multiple of 16 and of [`Format::BLOCK`], as is `c0`), widened in
    /// registers; when `ahead` is not 0, the bytes `ahead` on from each row's span are named
    /// to the prefetcher as the span is read. The default decodes into a buffer and folds it.
    ///
    /// # Safety
    /// The running CPU supports the tier; the span lies inside the rows.
    unsafe fn fold_stored<F: Format, const R: usize, const N: usize>(
        rows: [F::Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let _ = ahead;
        // SAFETY: guaranteed by the caller.
        unsafe { fold_stored_buffered::<Self, F, R, N>(rows, c0, x, acc) }
    }

    /// Sets every accumulator of `acc` to +0.0 with stores as wide as the loads the tier's
    /// kernels read them with: a load is served from a pending store only when one store
    /// covers it, so a 64-byte load of lanes written by 16-byte stores (what `fill` compiles to
    /// outside the tier's code) waits until those stores retire, after every older instruction,
    /// on a one-row call the previous rows' whole dependency chains. The default fills them.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn zero(acc: &mut [Lanes]) {
        acc.fill([0.0; 16]);
    }

    /// [`reduce16`] of each of 16 accumulators, bit for bit: every cell takes the same
    /// additions of the same pairs of lanes in the same order, 16 cells at once (see
    /// [`crate::reduce`]). The default is [`reduce16`] cell by cell.
    ///
    /// # Safety
    /// The running CPU supports the tier.
    unsafe fn reduce16x16(acc: [&Lanes; 16]) -> [f32; 16] {
        acc.map(|a| reduce16(*a))
    }
}

/// Accumulators of one block: `[row][token]`, for token blocks of up to `TB` rows.
type BlockAcc<const TB: usize> = [[Lanes; TB]; ROW_BLOCK];

/// Widened weights of one chunk of a row block.
type ChunkBuf = [[f32; CHUNK]; ROW_BLOCK];

/// A value on a 64-byte boundary: the chunk buffer and the accumulators live on the stack,
/// where an array of f32 is only 4-byte aligned (and behind an `Option`'s tag), so without
/// this their 16-lane loads could straddle two cache lines (the wide nest's scratch, measured
/// in docs/PERFORMANCE.md, issue 20, session 13).
#[repr(C, align(64))]
struct Aligned<T>(T);

const _: () = assert!(align_of::<Option<Aligned<ChunkBuf>>>() == 64);

/// `emit(ti, r, Σ_c W[r, c] · x[ti, c])` for every `r` in `rows` and `ti < t`, each sum in the
/// canonical order, on the tier `K`.
///
/// # Safety
/// The running CPU supports the tier `K`.
///
/// # Panics
/// If `x` is not `t * m.cols()` long or `rows` runs past `m.rows()`.
pub(crate) unsafe fn run<K: Kernel, F: Format>(
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    emit: impl FnMut(usize, usize, f32),
) {
    // Every span the nest hands a format starts at a multiple of `CHUNK` or `ONE_SPAN`
    // columns (or is a row's last partial 16 columns), so the format's blocks never straddle
    // two spans.
    const { assert!(CHUNK.is_multiple_of(F::BLOCK) && ONE_SPAN.is_multiple_of(F::BLOCK)) };
    // A one-row call (the common case) keeps one accumulator per row, not TOKEN_BLOCK: the
    // fixed cost of a call is mostly initialising these buffers. A few rows keep small token
    // blocks; a prefill chunk takes wide ones, so each weight chunk is decoded once per 64
    // activation rows.
    match t {
        // SAFETY: guaranteed by the caller.
        1 => unsafe { run_blocks::<K, F, 1>(m, x, t, rows, emit) },
        // SAFETY: guaranteed by the caller (the wide nest hands the call to `crate::stored`).
        _ if crate::stored::serves::<K, F>(m, t) => unsafe {
            crate::wide::run::<K, F>(m, x, t, rows, emit)
        },
        // SAFETY: guaranteed by the caller.
        2..=TOKEN_BLOCK => unsafe { run_blocks::<K, F, TOKEN_BLOCK>(m, x, t, rows, emit) },
        // SAFETY: guaranteed by the caller.
        _ => unsafe { crate::wide::run::<K, F>(m, x, t, rows, emit) },
    }
}

/// [`run`] with token blocks of up to `TB` activation rows.
///
/// # Safety
/// The running CPU supports the tier `K`.
unsafe fn run_blocks<K: Kernel, F: Format, const TB: usize>(
    m: &Matrix<'_>,
    x: &[f32],
    t: usize,
    rows: Range<usize>,
    mut emit: impl FnMut(usize, usize, f32),
) {
    let cols = m.cols();
    assert_eq!(x.len(), t * cols, "matmul: x length");
    assert!(rows.end <= m.rows(), "matmul: row range");
    // Columns before the final partial 16-column step (if any).
    let main_cols = cols - cols % 16;
    // The chunk buffer only serves calls of several activation rows: a one-row call, the
    // common case, never zeroes its 16 KiB.
    let mut chunk_buf: Option<Aligned<ChunkBuf>> =
        if t > 1 { Some(Aligned([[0.0f32; CHUNK]; ROW_BLOCK])) } else { None };
    let mut acc_lines: Aligned<BlockAcc<TB>> = Aligned([[[0.0; 16]; TB]; ROW_BLOCK]);
    let acc = &mut acc_lines.0;
    let mut xpad = [[0.0f32; 16]; TB];
    // The first block's weights; each block then prefetches the next one's, spread over its
    // chunks (weights of a row block are contiguous, scales too).
    for bytes in m.rows_bytes(rows.start..rows.start + ROW_BLOCK) {
        prefetch(bytes);
    }
    for r0 in rows.clone().step_by(ROW_BLOCK) {
        let rb = ROW_BLOCK.min(rows.end - r0);
        let block: [F::Row<'_>; ROW_BLOCK] =
            std::array::from_fn(|i| F::row(m, (r0 + i).min(r0 + rb - 1)));
        // The one-row kernels prefetch the next tile's weights themselves as they go; side data
        // a format names (MXFP4's block scales, a sixteenth of its bytes) is named here.
        let next =
            [&[][..], F::prefetch_side(m, r0 + ROW_BLOCK..(r0 + 2 * ROW_BLOCK).min(rows.end))];
        for t0 in (0..t).step_by(TB) {
            let tb = TB.min(t - t0);
            for a in &mut acc[..rb] {
                // SAFETY: guaranteed by the caller.
                unsafe { K::zero(&mut a[..tb]) };
            }
            for (j, p) in xpad[..tb].iter_mut().enumerate() {
                let xr = &x[(t0 + j) * cols..(t0 + j + 1) * cols];
                *p = [-0.0; 16];
                p[..cols - main_cols].copy_from_slice(&xr[main_cols..]);
            }
            let next = if t0 == 0 && tb == 1 { next } else { [&[][..]; 2] };
            let b = Block::<F, TB> { rows: &block[..rb], acc: &mut *acc, next };
            match chunk_buf.as_mut() {
                Some(w) if tb > 1 => {
                    // SAFETY: the caller guarantees the tier.
                    unsafe { b.rows::<K>(x, (t0, tb, cols), &mut w.0, &xpad) };
                }
                _ => {
                    // SAFETY: the caller guarantees the tier.
                    unsafe { b.one_row::<K>(&x[t0 * cols..(t0 + 1) * cols], &xpad[0]) };
                }
            }
            let cells = acc[..rb]
                .iter()
                .enumerate()
                .flat_map(|(r, a)| a[..tb].iter().enumerate().map(move |(j, lanes)| (j, r, lanes)));
            // SAFETY: the caller guarantees the tier.
            unsafe {
                crate::reduce::reduce_cells::<K>(cells, |j, r, s| {
                    emit(t0 + j, r0 + r, F::finish(block[r], s));
                });
            }
        }
    }
}

/// Columns of one fused [`Kernel::fold_one`] call: long spans keep the per-call cost small,
/// while leaving room to interleave prefetches of the next block.
const ONE_SPAN: usize = 1024;

const _: () = assert!(ONE_SPAN.is_multiple_of(CHUNK));

/// One row block and one token block of a call.
struct Block<'a, 'r, F: Format, const TB: usize> {
    /// The block's weight rows.
    rows: &'a [F::Row<'r>],
    /// Accumulators, `[row][token]` relative to the blocks.
    acc: &'a mut BlockAcc<TB>,
    /// The next row block's bytes, to prefetch while this one is computed (empty for all but
    /// the first token block).
    next: [&'r [u8]; 2],
}

impl<F: Format, const TB: usize> Block<'_, '_, F, TB> {
    /// A single activation row `x` (`cols` long): fused decode and fold in row tiles of four;
    /// the final partial 16-column step (if any) through `w` and the padded `xpad`.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn one_row<K: Kernel>(mut self, x: &[f32], xpad: &Lanes) {
        let cols = x.len();
        let main_cols = cols - cols % 16;
        let n = self.rows.len();
        if F::ONE_ROW_TILE == 1 {
            // Whole rows, one after another, in one call: the next row's loads issue while
            // the last FMAs of this one finish (a row's lanes are one dependency chain).
            for bytes in self.next {
                prefetch(bytes);
            }
            // SAFETY: the caller guarantees the tier.
            unsafe { K::fold_one_rows::<F, TB>(self.rows, &x[..main_cols], &mut self.acc[..n]) };
        } else {
            let mut r = 0;
            while r < n {
                // SAFETY: the caller guarantees the tier (every arm).
                r += unsafe {
                    match (n - r).min(F::ONE_ROW_TILE) {
                        4.. => one::<K, F, 4, TB>(&mut self, r, &x[..main_cols]),
                        2 | 3 => one::<K, F, 2, TB>(&mut self, r, &x[..main_cols]),
                        _ => one::<K, F, 1, TB>(&mut self, r, &x[..main_cols]),
                    }
                };
            }
        }
        if main_cols < cols {
            let mut w = [[0.0f32; 16]; ROW_BLOCK];
            for (wr, &row) in w.iter_mut().zip(self.rows) {
                // SAFETY: the caller guarantees the tier; the span is the row's last columns.
                unsafe { K::decode::<F>(row, main_cols, &mut wr[..cols - main_cols]) };
                wr[cols - main_cols..16].fill(0.0);
            }
            let span = Span { w: &w, rb: n, tb: 1, acc: self.acc };
            // SAFETY: the caller guarantees the tier.
            unsafe { span.fold::<K>(0..16, |_| &xpad[..]) };
        }
    }

    /// `tb` activation rows from `t0`: each chunk decoded once into `w`, then folded in
    /// register tiles.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn rows<K: Kernel>(
        self,
        x: &[f32],
        (t0, tb, cols): (usize, usize, usize),
        w: &mut ChunkBuf,
        xpad: &[Lanes; TB],
    ) {
        let rb = self.rows.len();
        let chunks = cols.div_ceil(CHUNK);
        for c0 in (0..cols).step_by(CHUNK) {
            let len = CHUNK.min(cols - c0);
            let main = len - len % 16;
            for bytes in self.next {
                prefetch(share(bytes, c0 / CHUNK, chunks));
            }
            for (wr, &row) in w.iter_mut().zip(self.rows) {
                // SAFETY: the caller guarantees the tier; the span `c0..c0 + len` lies in the
                // row, `c0` is a multiple of `CHUNK` (so of every format's block) and `len` is
                // either `CHUNK` or the rest of the row.
                unsafe { K::decode::<F>(row, c0, &mut wr[..len]) };
                wr[len..len.next_multiple_of(16)].fill(0.0);
            }
            let span = Span { w, rb, tb, acc: &mut *self.acc };
            let xs = |j: usize| &x[(t0 + j) * cols + c0..][..main];
            // SAFETY: the caller guarantees the tier.
            unsafe { span.fold::<K>(0..main, xs) };
            if main < len {
                let span = Span { w, rb, tb, acc: &mut *self.acc };
                // SAFETY: the caller guarantees the tier.
                unsafe { span.fold::<K>(main..main + 16, |j| &xpad[j][..]) };
            }
        }
    }
}

/// Folds one activation row `x` (a whole number of 16-column steps) into rows `r..r + R` of
/// the block, in spans of [`ONE_SPAN`] columns with a share of the next block's prefetches
/// between spans; returns R.
///
/// # Safety
/// The running CPU supports the tier `K`; `x.len()` suits [`Kernel::fold_one`].
unsafe fn one<K: Kernel, F: Format, const R: usize, const TB: usize>(
    b: &mut Block<'_, '_, F, TB>,
    r: usize,
    x: &[f32],
) -> usize {
    let spans = x.len().div_ceil(ONE_SPAN);
    let parts = b.rows.len().div_ceil(R) * spans;
    let rows: [F::Row<'_>; R] = std::array::from_fn(|i| b.rows[r + i]);
    for (k, c0) in (0..x.len()).step_by(ONE_SPAN).enumerate() {
        for bytes in b.next {
            prefetch(share(bytes, (r / R) * spans + k, parts));
        }
        // The block's accumulators themselves, not a copy: a copy's narrower stores (this
        // code is not compiled for the tier) cannot be forwarded to the kernel's full-width
        // loads, which then wait for every older instruction to retire (see `Kernel::zero`).
        let mut it = b.acc[r..r + R].iter_mut();
        let a: [&mut Lanes; R] =
            std::array::from_fn(|_| &mut it.next().expect("invariant: R rows")[0]);
        // SAFETY: guaranteed by the caller; spans start at multiples of `ONE_SPAN`.
        unsafe { K::fold_one::<F, R>(rows, c0, &x[c0..(c0 + ONE_SPAN).min(x.len())], a) };
    }
    R
}

/// Part `k` of `n` equal parts of `bytes` (the last part takes the remainder).
fn share(bytes: &[u8], k: usize, n: usize) -> &[u8] {
    let part = bytes.len().div_ceil(n.max(1));
    let start = (k * part).min(bytes.len());
    &bytes[start..(start + part).min(bytes.len())]
}

/// The widened weights and the accumulators of one block, for folding one column span.
struct Span<'a, const W: usize, const TB: usize> {
    w: &'a [[f32; W]; ROW_BLOCK],
    rb: usize,
    tb: usize,
    acc: &'a mut BlockAcc<TB>,
}

impl<const W: usize, const TB: usize> Span<'_, W, TB> {
    /// Folds columns `cols` of the widened weights (indices into the chunk buffer) against
    /// `x(j)`, the same span of activation row `j` of the block, for all `rb × tb` pairs, in
    /// register tiles.
    ///
    /// # Safety
    /// The running CPU supports the tier `K`.
    unsafe fn fold<'x, K: Kernel>(self, cols: Range<usize>, x: impl Fn(usize) -> &'x [f32]) {
        if cols.is_empty() {
            return;
        }
        let w = |r: usize| &self.w[r][cols.clone()];
        // SAFETY: the caller guarantees the tier.
        unsafe { fold_tiles::<K>(&w, self.rb, self.tb, self.acc.as_flattened_mut(), TB, &x, None) };
    }
}
