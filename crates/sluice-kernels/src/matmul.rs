//! Weight matrices in their stored formats and the batch-invariant matmul over them.
//!
//! `out[t, r] = Σ_c W[r, c] · x[t, c]` for a weight `W [rows, cols]` stored row-major
//! (PyTorch `Linear` layout, `[out, in]`) and activations `x [t, cols]`.
//!
//! **Canonical reduction order** (every tier must reproduce it bit for bit):
//! 16 f32 accumulators `acc[0..16]` start at +0.0; element `c` is folded into lane `c % 16`
//! with a fused multiply-add, `acc[c % 16] = fma(W[r, c], x[t, c], acc[c % 16])`, in increasing
//! `c`; then the lanes are summed as a tree: `acc[l] += acc[l + 8]` for `l < 8`, then `+4`,
//! `+2`, `+1`; the result is `acc[0]`. This is exactly what one AVX-512 register (or two AVX2
//! registers, or four NEON registers) computes, so SIMD tiers equal the scalar reference.
//! Weight elements are widened to f32 before the FMA, each format by its own scalar decode
//! (`formats/`): bf16 → f32 and E2M1 × 2^(s−127) exactly, FP8 as `f32(e4m3) · s` rounded once,
//! INT4 as `(nibble − 8) · scale` exactly. **Row-int8 folds its integers**: `f32(q)` (exact) goes into the lanes and the row's
//! f16 scale multiplies the reduced sum once, `result = f32(scale) · acc[0]` (one f32
//! multiplication, rounded). A row scale is common to the whole row, so taking it out of the
//! sum is the natural int8 dot product, and it saves one multiplication per weight in every
//! kernel, which is what let int8 matvec reach the memory bound (docs/PERFORMANCE.md, issue 4).
//! [`Matrix::get`] still returns the dequantized element `f32(q) · f32(scale)` (exact: an 8-bit
//! integer times an 11-bit f16 significand fits the 24-bit f32 one).
//!
//! [`matmul`] runs on the tier chosen by [`crate::isa::isa`] and splits output rows (and, for
//! many activation rows against few output rows, activation rows; never a reduction) across
//! the current [`crate::pool`], so neither the tier nor the thread count nor the number of
//! activation rows changes a result bit; [`matmul_with`] picks the tier
//! explicitly. The variants whose chunks finish their own cells right after computing them (an
//! activation, a weighted add into running sums: [`crate::finish`]) split calls the same way,
//! and so do the calls that run several matmuls (a layer's experts) as one ([`crate::many`]).
//! The loop nest every tier shares (row blocks, token blocks, column chunks, register tiles)
//! is in the crate's `tiled` module.

use crate::arch;
use crate::formats::{Format, Visit};
use crate::isa::{self, Isa};
use crate::packed::Packed;
use std::ops::Range;

pub(crate) use crate::cuts::{
    packed_chunks, split, token_chunk, token_range, MIN_CHUNK_ROWS, PAR_MIN_WORK,
};

pub use crate::formats::{e4m3_to_f32, e8m0_to_f32, WeightFormat, E2M1, E4M3};

/// A borrowed weight matrix `[rows, cols]` in its stored format. Buffers are raw little-endian
/// bytes with no alignment requirement (safetensors offsets need not be aligned). Each format's
/// constructor (`Matrix::f32`, `bf16`, `mxfp4`, `int8_row`, `fp8_block`, `int4_group`) lives
/// in the format's file under `formats/` and checks the buffers against the shape.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) format: WeightFormat,
    pub(crate) data: &'a [u8],
    pub(crate) scales: &'a [u8],
}

/// Decodes a span of one row through the row's format ([`Format::widen`]).
struct Widen<'m, 'a, 'o> {
    m: &'m Matrix<'a>,
    r: usize,
    c0: usize,
    out: &'o mut [f32],
}

impl Visit for Widen<'_, '_, '_> {
    type Out = ();

    fn visit<F: Format>(self) {
        F::widen(F::row(self.m, self.r), self.c0, self.out);
    }
}

/// The scalar reference dot product of one row ([`dot_row_scalar`]).
struct Dot<'m, 'a, 'x> {
    m: &'m Matrix<'a>,
    r: usize,
    x: &'x [f32],
}

impl Visit for Dot<'_, '_, '_> {
    type Out = f32;

    fn visit<F: Format>(self) -> f32 {
        let row = F::row(self.m, self.r);
        let n = self.x.len().min(self.m.cols);
        let mut w = vec![0.0f32; n];
        F::fold_values(row, 0, &mut w);
        let mut acc = [0.0f32; 16];
        for (c, (&wc, &xc)) in w.iter().zip(self.x).enumerate() {
            acc[c % 16] = wc.mul_add(xc, acc[c % 16]);
        }
        F::finish(row, reduce16(acc))
    }
}

impl<'a> Matrix<'a> {
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Storage format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Raw weight bytes (packed nibbles for MXFP4 and INT4, signed bytes for int8, e4m3 codes
    /// for FP8).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Scale bytes: E8M0 per block for MXFP4, little-endian f16 per row for int8, f32 per
    /// 128 × 128 block for FP8, bf16 per 32-column group for INT4; empty for f32 and bf16.
    pub fn scales(&self) -> &'a [u8] {
        self.scales
    }

    /// Bytes of weights (and scales) this matrix occupies.
    pub fn byte_len(&self) -> usize {
        self.data.len() + self.scales.len()
    }

    /// Element `(r, c)` widened to f32 (slow; for references and tests).
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let mut v = [0.0f32];
        self.format.visit(Widen { m: self, r, c0: c, out: &mut v });
        v[0]
    }

    /// The stored bytes of rows `rows` (clamped to the matrix): weights, and scales (empty for
    /// formats without them), each at the buffer's bytes per row (rounded down; for FP8, whose
    /// scales serve 128 rows, an approximate span meant for prefetching only).
    #[inline]
    pub(crate) fn rows_bytes(&self, rows: std::ops::Range<usize>) -> [&'a [u8]; 2] {
        let (a, b) = (rows.start.min(self.rows), rows.end.min(self.rows));
        let per_row = |buf: &'a [u8]| {
            let n = buf.len().checked_div(self.rows).unwrap_or(0);
            &buf[a.min(b) * n..b * n]
        };
        [per_row(self.data), per_row(self.scales)]
    }

    /// Writes row `r` widened to f32 (the values [`Matrix::get`] gives) into the first
    /// `cols` elements of `out` (all of it when shorter).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        self.row_to_f32_with(isa::isa(), r, out);
    }

    /// [`Matrix::row_to_f32`] on an explicit tier: a whole row of a format whose tier decodes
    /// give its widened values bit for bit (`Format::TIER_WIDENS`) takes the tier's decode (a
    /// DeepSeek-V3 pass widens its `kv_b_proj` rows every step; the scalar reference decode
    /// took 10% of a slice's decode step), any other row the scalar reference. The same values
    /// either way.
    ///
    /// # Panics
    /// If the running CPU does not support `isa`, or `r` is not a row.
    pub fn row_to_f32_with(&self, isa: Isa, r: usize, out: &mut [f32]) {
        let n = out.len().min(self.cols);
        if n == self.cols && crate::arch::widen_row(isa, self, r, &mut out[..n]) {
            return;
        }
        self.format.visit(Widen { m: self, r, c0: 0, out: &mut out[..n] });
    }
}

/// Folds a finished 16-lane accumulator in the canonical tree order.
#[inline(always)]
pub fn reduce16(mut acc: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// Scalar reference dot product of row `r` with `x` in the canonical order: the row's folded
/// values (its format's scalar decode) folded element by element, then the format's finish.
pub fn dot_row_scalar(m: &Matrix<'_>, r: usize, x: &[f32]) -> f32 {
    m.format.visit(Dot { m, r, x })
}

/// Scalar reference for [`matmul`]: single-threaded, element by element.
pub fn matmul_scalar(m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    for ti in 0..t {
        let xr = &x[ti * m.cols..(ti + 1) * m.cols];
        for r in 0..m.rows {
            out[ti * m.rows + r] = dot_row_scalar(m, r, xr);
        }
    }
}

/// `out[t, r] = Σ_c W[r, c] · x[t, c]` in the canonical order (see the module docs), on the
/// process-wide tier [`isa::isa`] and the current [`crate::pool`].
///
/// # Panics
/// If `x` is not `t * cols` long or `out` is not `t * rows` long (callers size them from the
/// matrix shape, so a mismatch is a programming error).
pub fn matmul(m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    matmul_with(isa::isa(), m, x, t, out);
}

/// [`matmul`] on an explicit tier (tests and benchmarks run every [`Isa::available`] tier).
///
/// # Panics
/// If the running CPU does not support `isa`, or on the length mismatches [`matmul`] panics on.
pub fn matmul_with(isa: Isa, m: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    assert_eq!(x.len(), t * m.cols, "matmul: x length");
    assert_eq!(out.len(), t * m.rows, "matmul: out length");
    assert!(isa.is_available(), "matmul: the {isa} tier is not supported by this CPU");
    let out_ptr = OutPtr::new(out);
    for_chunks(isa, x, t, m.rows, m.cols, &|tk, r, pack| {
        // SAFETY: `isa` is available (asserted above); `out` is `t * rows` long and exclusively
        // borrowed until `for_chunks` returns, which is after every chunk has finished, and
        // the chunks' (token, row) ranges are disjoint, so each cell is written by exactly one
        // chunk and read by none.
        unsafe { run_cells(isa, m, x, tk, r, &out_ptr, pack) };
    });
}

/// What [`for_chunks`] runs for each chunk: `f(tokens, rows, pack)`.
pub(crate) type ChunkFn<'f> = dyn Fn(Range<usize>, Range<usize>, Option<&Packed<'_>>) + Sync + 'f;

/// Runs `f(tokens, rows, pack)` over the chunks of a call of `t` activation rows `x` on a
/// matrix of `rows` rows ([`split`], which weighs the call as `work_cols` columns) on the
/// current pool, or once over everything on the calling thread. Where the tier packs a
/// prefill's activations ([`crate::packed`]), they are packed first, in blocks of tokens if
/// need be, each block cut into chunks on its own and its chunks handed the pack.
pub(crate) fn for_chunks(
    isa: Isa,
    x: &[f32],
    t: usize,
    rows: usize,
    work_cols: usize,
    f: &ChunkFn<'_>,
) {
    let cols = x.len().checked_div(t).unwrap_or(0);
    crate::packed::in_blocks(isa, x, t, cols, &mut |tokens, pack| {
        let (t0, n) = (tokens.start, tokens.len());
        crate::pool::with_current(|pool| {
            if pack.is_some() {
                let cs = packed_chunks(pool.threads(), rows, work_cols, n);
                let run = |i: usize| {
                    let (tk, r) = cs[i].clone();
                    f(t0 + tk.start..t0 + tk.end, r, pack);
                };
                if cs.len() > 1 {
                    pool.run(cs.len(), &run);
                } else {
                    run(0);
                }
                return;
            }
            let Some((cuts, token_chunks)) = split(pool.threads(), rows, work_cols, n) else {
                f(tokens.clone(), 0..rows, pack);
                return;
            };
            let cuts: &[usize] = &cuts;
            let row_chunks = cuts.len() - 1;
            let tc = token_chunk(n, token_chunks, false);
            pool.run(row_chunks * token_chunks, &|i| {
                let (ri, ti) = (i % row_chunks, i / row_chunks);
                let tokens = token_range(ti, tc, n);
                f(t0 + tokens.start..t0 + tokens.end, cuts[ri]..cuts[ri + 1], pack);
            });
        });
    });
}

/// An output buffer shared by the chunks of one call ([`matmul_with`], and the variants in
/// [`crate::finish`], whose chunks finish their cells into a second buffer too).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32);

// SAFETY: the pointer is only dereferenced through `OutPtr::write` and `OutPtr::cells`, at
// cells that one chunk owns (the chunks' (token, row) ranges are disjoint), while the
// `&mut [f32]` it came from is held by the call.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The buffer `out`, which the caller holds exclusively until its chunks have finished.
    pub(crate) fn new(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr())
    }

    /// Writes `v` at element `i`.
    ///
    /// # Safety
    /// `i` is inside the buffer, and no other thread accesses element `i` during the call.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { self.0.add(i).write(v) };
    }

    /// Elements `i..i + len` as a slice.
    ///
    /// # Safety
    /// The range is inside the buffer, and no other reference to it exists while the slice lives.
    pub(crate) unsafe fn cells<'a>(&self, i: usize, len: usize) -> &'a mut [f32] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(i), len) }
    }
}

/// Computes the cells `(ti, r)` for `ti` in `tokens` and `r` in `rows` on `isa` (see
/// [`crate::tiled`]), from the call's packed activations `pack` if it has them (which hold
/// `tokens`: see [`for_chunks`]).
///
/// # Safety
/// The CPU supports `isa`; `out` points to `x.len() / m.cols() * m.rows()` f32 whose cells
/// `(ti, r)` for `ti` in `tokens` and `r` in `rows` no other thread accesses during the call.
pub(crate) unsafe fn run_cells(
    isa: Isa,
    m: &Matrix<'_>,
    x: &[f32],
    tokens: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    out: &OutPtr,
    pack: Option<&Packed<'_>>,
) {
    assert!(rows.end <= m.rows, "matmul: row range");
    assert!(tokens.end * m.cols <= x.len(), "matmul: token range");
    let (t0, t) = (tokens.start, tokens.len());
    // The output's pointer and row count as values the closure owns: read through `out` and
    // `m`, the compiler loaded both again for every cell, since the cell's store might have
    // changed them.
    let (out, n) = (*out, m.rows);
    let emit = move |ti: usize, r: usize, v: f32| {
        assert!(ti < t && r < n, "matmul: output cell");
        // SAFETY: `t0 + ti < tokens.end` and `r < m.rows` (asserted), so the cell is inside
        // the buffer, and the caller gives this call sole access to these cells.
        unsafe { out.write((t0 + ti) * n + r, v) };
    };
    let x = &x[t0 * m.cols..tokens.end * m.cols];
    let pack = pack.map(|p| {
        assert!(
            t0 >= p.first && tokens.end <= p.first + p.tokens,
            "matmul: chunk outside its pack"
        );
        (p, t0 - p.first)
    });
    arch::run(isa, m, x, t, rows, pack, emit);
}
