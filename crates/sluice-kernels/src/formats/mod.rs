//! Weight formats, one file each, and the table that names them.
//!
//! A format is a zero-sized type implementing [`Format`]: how to view one row of a
//! [`Matrix`], the scalar reference decode of a span of that row to f32 ([`Format::widen`],
//! which is what [`Matrix::get`] returns and what the scalar reference matmul folds), and the
//! hooks each SIMD tier calls (`avx2_decode`, `avx512_decode`, `neon_decode`, and the fused
//! one-activation-row folds `avx2_fold_one`, `avx512_fold_one`). Every hook has a default that
//! is exact (the scalar decode, or decode-into-a-buffer then the tier's shared fold), so a new
//! format works on every tier as soon as its scalar decode is written, and a SIMD hook only
//! makes it faster. The loop nest ([`crate::tiled`], [`crate::wide`]) and the register-tile
//! folds (`crate::arch`) are shared by all formats and never name one.
//!
//! **Adding a format** is one new file here (the type, its `Matrix` constructor, its decode and
//! its hooks) plus one line in the `formats!` table below, which generates the
//! [`WeightFormat`] variant, its name, and the dispatch from a runtime [`WeightFormat`] to the
//! kernels monomorphised for the type.
//!
//! The reduction order is the crate's canonical one ([`crate::matmul`]) for every format: the
//! format only decides the f32 value each weight element folds as (and, for formats whose scale
//! is common to a whole row, the one multiplication [`Format::finish`] applies to the sum).

use std::ops::Range;

use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;

#[path = "bf16.rs"]
pub(crate) mod bf16;
#[path = "f32.rs"]
pub(crate) mod float32;
pub(crate) mod fp8_block;
pub(crate) mod int4_group;
pub(crate) mod int8_row;
pub(crate) mod mxfp4;

pub use fp8_block::{e4m3_to_f32, E4M3};
pub use mxfp4::{e8m0_to_f32, E2M1};

/// The format table: generates [`WeightFormat`] (one variant per line, with its short name) and
/// the dispatch from a variant to its [`Format`] type.
macro_rules! formats {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal => $ty:ty, )*) => {
        /// Storage format of a weight matrix (one line of the table in `formats/mod.rs` each).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum WeightFormat {
            $( $(#[$doc])* $variant, )*
        }

        impl WeightFormat {
            /// Every format, in table order.
            pub const ALL: &'static [WeightFormat] = &[$(Self::$variant),*];

            /// Short lowercase name.
            pub fn name(self) -> &'static str {
                match self {
                    $( Self::$variant => $name, )*
                }
            }

            /// Calls `v.visit::<F>()` with `F` the format's type.
            #[inline]
            pub(crate) fn visit<V: Visit>(self, v: V) -> V::Out {
                match self {
                    $( Self::$variant => v.visit::<$ty>(), )*
                }
            }
        }
    };
}

formats! {
    /// Little-endian IEEE f32.
    F32 = "f32" => float32::F32,
    /// Little-endian bf16.
    Bf16 = "bf16" => bf16::Bf16,
    /// OCP MXFP4: E2M1 nibbles (low nibble first) in blocks of 32 along `cols`, one E8M0 scale
    /// byte per block (`2^(s − 127)`). GPT-OSS's `*_blocks` / `*_scales` flatten to exactly
    /// this layout (see `formats/mxfp4.rs`).
    Mxfp4 = "mxfp4" => mxfp4::Mxfp4,
    /// Row-wise int8: one signed byte per element and one little-endian f16 scale per output
    /// row; element `(r, c)` is `f32(q[r, c]) · f32(scale[r])` (exact, see [`crate::matmul`]).
    Int8Row = "int8" => int8_row::Int8Row,
    /// FP8 e4m3 (`float8_e4m3fn`) with one f32 scale per 128 × 128 block
    /// (`weight_scale_inv [ceil(rows/128), ceil(cols/128)]`, DeepSeek-V3 and Kimi K2):
    /// element `(r, c)` is `f32(e4m3) · s[r/128][c/128]`, rounded once.
    Fp8Block = "fp8" => fp8_block::Fp8Block,
    /// compressed-tensors pack-quantized INT4, symmetric, group 32 (Kimi K2 Thinking):
    /// `weight_packed` I32 `[rows, cols/8]` (element `e` at bits `4·(e % 8)` of word `e/8`,
    /// stored as `q + 8`) and `weight_scale` bf16 `[rows, cols/32]`; element `(r, c)` is
    /// `(nibble − 8) · scale[r][c/32]` (exact).
    Int4Group = "int4" => int4_group::Int4Group,
}

impl WeightFormat {
    /// The shape of the scale tensor a `rows × cols` weight in this format comes with, or
    /// `None` for formats without one (f32, bf16). Loaders compare it with the checkpoint's
    /// declared shape through [`WeightFormat::check_scale_shape`].
    pub fn scale_shape(self, rows: usize, cols: usize) -> Option<[usize; 2]> {
        match self {
            Self::F32 | Self::Bf16 => None,
            Self::Mxfp4 => Some([rows, cols / 32]),
            Self::Int8Row => Some([rows, 1]),
            Self::Fp8Block => Some([rows.div_ceil(128), cols.div_ceil(128)]),
            Self::Int4Group => Some([rows, cols / 32]),
        }
    }

    /// Checks a scale tensor's declared shape against the weight's: an error naming the
    /// format and both shapes when they contradict each other (a `[rows]` shape is accepted
    /// for row-int8's one scale per row).
    pub fn check_scale_shape(
        self,
        rows: usize,
        cols: usize,
        got: &[usize],
    ) -> Result<(), KernelError> {
        let Some(want) = self.scale_shape(rows, cols) else {
            return Ok(());
        };
        let ok = got == want || (self == Self::Int8Row && got == [rows]);
        if ok {
            Ok(())
        } else {
            Err(KernelError::ScaleShape {
                format: self.name(),
                rows,
                cols,
                expected: want,
                got: format!("shape {got:?}"),
            })
        }
    }
}

/// A generic action over the format types (the dispatch target of [`WeightFormat::visit`]).
pub(crate) trait Visit {
    /// The action's result.
    type Out;
    /// Runs the action for format `F`.
    fn visit<F: Format>(self) -> Self::Out;
}

/// One weight format: its row view, its scalar decode, and its SIMD hooks (see the module
/// docs). Spans handed to the decode hooks start at a multiple of 16 columns (of
/// [`Format::BLOCK`] where that is larger) and, except a row's last, are multiples of it.
pub(crate) trait Format: Sized + 'static {
    /// Columns of the format's smallest self-contained unit that the SIMD decodes rely on:
    /// every span starts at a multiple of it, and the matrix width is one (16 for formats
    /// decoded element by element).
    const BLOCK: usize = 16;

    /// One weight row in the stored format.
    type Row<'a>: Copy;

    /// Row `r` of `m` (which has this format).
    fn row<'a>(m: &Matrix<'a>, r: usize) -> Self::Row<'a>;

    /// The scalar reference decode: elements `c0 .. c0 + out.len()` of `row` as f32, the
    /// values [`Matrix::get`] returns. Any `c0` and length inside the row.
    fn widen(row: Self::Row<'_>, c0: usize, out: &mut [f32]);

    /// The values the matmul folds: [`Format::widen`]'s, unless the format takes a
    /// row-wide scale out of the sum ([`Format::finish`]).
    #[inline]
    fn fold_values(row: Self::Row<'_>, c0: usize, out: &mut [f32]) {
        Self::widen(row, c0, out);
    }

    /// The row's dot product from the canonical reduction of its folded values.
    #[inline]
    fn finish(_row: Self::Row<'_>, sum: f32) -> f32 {
        sum
    }

    /// Whether the tiers' decodes give [`Format::widen`]'s values bit for bit, signed zeros
    /// included, so that [`Matrix::row_to_f32`] may widen a row on the tier: not where the
    /// folded values are not the widened ones ([`Format::finish`]: int8), nor where a decode
    /// turns a negative zero positive, which no sum sees (MXFP4 on AVX2).
    const TIER_WIDENS: bool = false;

    /// Weight rows a one-activation-row tile takes side by side (4, 2 or 1): several rows give
    /// independent FMA chains where decoding a value costs more than loading it; a format whose
    /// decode is a shift (bf16) reads its rows one after another, one sequential stream the
    /// hardware prefetchers follow (four rows' streams, each a row apart, kept a decode step's
    /// bf16 reads at 62–83% of the memory rate on a Zen 5 core; one row: 1.24–1.27× faster
    /// decode at 2 threads there, 2–3% slower at 16 threads of a Xeon host).
    const ONE_ROW_TILE: usize = 4;

    /// Bytes of one row's weights: the distance from a tile of rows to the next one's, which
    /// the one-row kernels prefetch as they go (the x86 ones; NEON's take the buffered path).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn row_bytes(row: Self::Row<'_>) -> usize;

    /// Bytes of rows `rows`' side data (scales) that the loop nest should name to the
    /// prefetcher while the block before them is computed; empty by default.
    fn prefetch_side<'a>(_m: &Matrix<'a>, _rows: Range<usize>) -> &'a [u8] {
        &[]
    }

    /// AVX2 + FMA decode of a span (same contract as [`Format::fold_values`], except that a
    /// zero weight may come out with either sign; see [`crate::tiled::Kernel::decode`]).
    ///
    /// # Safety
    /// The running CPU supports AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_decode(row: Self::Row<'_>, c0: usize, out: &mut [f32]) {
        Self::fold_values(row, c0, out);
    }

    /// AVX-512F decode of a span (as [`Format::avx2_decode`]).
    ///
    /// # Safety
    /// The running CPU supports AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_decode(row: Self::Row<'_>, c0: usize, out: &mut [f32]) {
        Self::fold_values(row, c0, out);
    }

    /// NEON decode of a span (as [`Format::avx2_decode`]).
    ///
    /// # Safety
    /// The running CPU supports Advanced SIMD.
    #[cfg(target_arch = "aarch64")]
    unsafe fn neon_decode(row: Self::Row<'_>, c0: usize, out: &mut [f32]) {
        Self::fold_values(row, c0, out);
    }

    /// The most activation rows of a call that [`Format::avx512_tile`] folds straight from the
    /// stored bytes (at most [`crate::stored::STORED_ROWS`]); 0, the default, where the format
    /// has no such tile and the prefill nest widens the rows into a panel first. A format whose
    /// decode costs more than its fold gains from not waiting on memory sets a few rows, as
    /// each token group of six widens the stored bytes again where the panel widens them once.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = 0;

    /// AVX-512F fold of a tile of `R` rows straight from their stored bytes against `N`
    /// activation rows ([`crate::tiled::Kernel::fold_stored`]): for every `r < R`, `j < N`
    /// and `i` in increasing order, `acc[r][j][i % 16] = fma(W_r[c0 + i], x[j][i], ...)`,
    /// `W_r` as [`Format::fold_values`] widens row `r`. When `ahead` is not 0, the bytes
    /// `ahead` on from each row's span are named to the prefetcher as the span is read. The
    /// default decodes into a buffer and folds it.
    ///
    /// # Safety
    /// The running CPU supports AVX-512F; `c0` and the span's length (every `x[j]`'s) are
    /// multiples of 16 and of [`Format::BLOCK`], and the span lies inside the rows.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [Self::Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let _ = ahead;
        // SAFETY: guaranteed by the caller.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx512::Avx512, Self, R, N>(
                rows, c0, x, acc,
            )
        }
    }

    /// The most activation rows of a call that [`Format::avx2_tile`] folds straight from the
    /// stored bytes (as [`Format::AVX512_TILE_ROWS`]); 0, the default, where a few activation
    /// rows take the buffered few-row nest.
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = 0;

    /// AVX2 + FMA fold of a tile of `R` rows straight from their stored bytes against `N`
    /// activation rows (as [`Format::avx512_tile`]). The default decodes into a buffer and
    /// folds it.
    ///
    /// # Safety
    /// The running CPU supports AVX2 and FMA; otherwise as [`Format::avx512_tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [Self::Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        let _ = ahead;
        // SAFETY: guaranteed by the caller.
        unsafe {
            crate::tiled::fold_stored_buffered::<crate::arch::avx2::Avx2, Self, R, N>(
                rows, c0, x, acc,
            )
        }
    }

    /// AVX2 one-activation-row fold ([`crate::tiled::Kernel::fold_one`]); the default
    /// decodes into a buffer and folds it.
    ///
    /// # Safety
    /// The running CPU supports AVX2 and FMA; `c0` and `x.len()` are multiples of 16 (of
    /// [`Format::BLOCK`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [Self::Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx2::Avx2, Self, R>(rows, c0, x, acc)
        }
    }

    /// AVX2 fold of each of `rows` in turn against one activation row, over all of `x`
    /// ([`crate::tiled::Kernel::fold_one_rows`]); the default folds each row with
    /// [`Format::avx2_fold_one`].
    ///
    /// # Safety
    /// As [`Format::avx2_fold_one`]; `acc` holds an entry per row.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_fold_rows<const TB: usize>(
        rows: &[Self::Row<'_>],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        for (&row, a) in rows.iter().zip(acc) {
            // SAFETY: guaranteed by the caller.
            unsafe { Self::avx2_fold_one::<1>([row], 0, x, [&mut a[0]]) };
        }
    }

    /// AVX-512F fold of each of `rows` in turn (as [`Format::avx2_fold_rows`]).
    ///
    /// # Safety
    /// As [`Format::avx2_fold_rows`], for AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_fold_rows<const TB: usize>(
        rows: &[Self::Row<'_>],
        x: &[f32],
        acc: &mut [[Lanes; TB]],
    ) {
        for (&row, a) in rows.iter().zip(acc) {
            // SAFETY: guaranteed by the caller.
            unsafe { Self::avx512_fold_one::<1>([row], 0, x, [&mut a[0]]) };
        }
    }

    /// AVX-512F one-activation-row fold (as [`Format::avx2_fold_one`]).
    ///
    /// # Safety
    /// As [`Format::avx2_fold_one`], for AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_fold_one<const R: usize>(
        rows: [Self::Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            crate::tiled::fold_one_buffered::<crate::arch::avx512::Avx512, Self, R>(
                rows, c0, x, acc,
            )
        }
    }
}

/// `Ok` when a buffer has the byte length its shape implies, else the error naming it.
pub(crate) fn check_len(
    what: &'static str,
    rows: usize,
    cols: usize,
    format: WeightFormat,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Length { what, rows, cols, format: format.name(), expected, got })
    }
}

/// `Ok` when a scale buffer has the byte length of the scale shape the weight implies
/// (`elem` bytes per scale), else [`KernelError::ScaleShape`] naming the format and both
/// shapes.
pub(crate) fn check_scales(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    elem: usize,
    got: usize,
) -> Result<(), KernelError> {
    let expected = format.scale_shape(rows, cols).unwrap_or([0, 0]);
    if expected[0] * expected[1] * elem == got {
        Ok(())
    } else {
        Err(KernelError::ScaleShape {
            format: format.name(),
            rows,
            cols,
            expected,
            got: format!("{got} bytes ({elem} per scale)"),
        })
    }
}
