//! The weight handle every family shares: a resolved matrix `[rows, cols]` (PyTorch `Linear`
//! layout `[out, in]`) in the checkpoint, in bf16, f32 or row-int8, checked once at load and
//! turned into a kernel operand over whatever holds its bytes ([`TensorBytes`]): the mapped
//! checkpoint, or the placed spine piece it belongs to (see [`crate::spine`]). Kimi K3 calls it
//! `Mat`, the Qwen3-based families and DeepSeek-V3 `Linear`; it is one type, so a family whose
//! forward reads its matrices through it gets spine placement with no copy of this code.

use crate::spine::TensorBytes;
use sluice_checkpoint::TensorEntry;
use sluice_kernels::{Matrix, WeightFormat};

/// A resolved weight matrix `[rows, cols]` in the checkpoint.
#[derive(Debug, Clone)]
pub struct Linear {
    entry: TensorEntry,
    /// The `NAME_scale` F16 `[rows]` companion of a row-int8 matrix (docs/INT8.md).
    scale: Option<TensorEntry>,
    rows: usize,
    cols: usize,
    format: WeightFormat,
}

impl Linear {
    /// A matrix whose dtype and shape the caller's roster has checked: `entry` of `rows × cols`
    /// in `format`, with the F16 row scales `scale` of a row-int8 matrix.
    pub(crate) fn new(
        entry: TensorEntry,
        scale: Option<TensorEntry>,
        rows: usize,
        cols: usize,
        format: WeightFormat,
    ) -> Self {
        Self { entry, scale, rows, cols, format }
    }

    /// The matrix as a kernel operand over the bytes `src` holds (the mapped checkpoint, or
    /// the placed spine piece this matrix belongs to; a row-int8 matrix's scales are in the
    /// same piece).
    pub fn get<'a>(&self, src: &'a dyn TensorBytes) -> Matrix<'a> {
        let b = src
            .tensor_bytes(&self.entry)
            .expect("invariant: a spine piece holds every matrix of its layer");
        let m = match &self.scale {
            Some(s) => {
                let sb = src
                    .tensor_bytes(s)
                    .expect("invariant: a spine piece holds the scales of its int8 matrices");
                Matrix::int8_row(self.rows, self.cols, b, sb).ok()
            }
            None => self.over(self.rows, b),
        };
        m.expect("invariant: shape and byte length were checked at load")
    }

    fn over<'a>(&self, rows: usize, b: &'a [u8]) -> Option<Matrix<'a>> {
        match self.format {
            WeightFormat::F32 => Matrix::f32(rows, self.cols, b),
            _ => Matrix::bf16(rows, self.cols, b),
        }
        .ok()
    }

    /// One row of a BF16/F32 matrix as a `[1, cols]` operand over `row` (its bytes); `None` if
    /// `row` is not one row long or the matrix is row-int8 (its scale lives elsewhere).
    pub fn row_matrix<'a>(&self, row: &'a [u8]) -> Option<Matrix<'a>> {
        if self.scale.is_some() {
            return None;
        }
        self.over(1, row)
    }

    /// True for a row-int8 matrix (I8 with an F16 scale per row).
    pub fn is_int8(&self) -> bool {
        self.scale.is_some()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.entry.len / (self.rows.max(1) as u64)
    }

    /// Where the matrix is in the checkpoint.
    pub fn entry(&self) -> &TensorEntry {
        &self.entry
    }

    /// Where the matrix's scales are (row-int8 only).
    pub fn scale_entry(&self) -> Option<&TensorEntry> {
        self.scale.as_ref()
    }

    /// The tensors a pass reads for this matrix: its data, and a row-int8 matrix's scales.
    pub fn entries(&self) -> impl Iterator<Item = &TensorEntry> {
        std::iter::once(&self.entry).chain(self.scale.as_ref())
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes in the checkpoint (an int8 matrix's scales included).
    pub fn byte_len(&self) -> u64 {
        self.entry.len + self.scale.as_ref().map_or(0, |s| s.len)
    }
}
