//! [`LineVec`]: a growable run of f32 values whose storage starts on a cache line, for the
//! attention caches the f64 sums ([`crate::latent`]) stream.
//!
//! A `Vec<f32>` large enough for the allocator to map it afresh starts 16 bytes past a page
//! (the allocator's header), so every row of a cache whose rows are a whole number of lines
//! long (Qwen3's 4 KV heads × 128 values, GPT-OSS's 8 × 64, a latent row of 512 + 64) straddles
//! two cache lines wherever a 16-value tile of it starts. Measured on a Zen 5 core, one KV
//! head's 2,048 positions read from memory (`attention_sums`-shaped, rows of 512 floats): the
//! weighted sums ran at 18 GFLOP/s with the rows 16 bytes past a line against 22 on the line,
//! and the prefetching a decode step's sums do ([`crate::latent`]) took them to 42 on the line
//! and left them at 17 off it. Here the values live in 64-byte-aligned blocks of 16, so the
//! first value is on a line and every row of a whole number of lines is too.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Values a cache line holds.
const LINE: usize = 16;

/// One cache line of values.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; LINE]);

/// Values a cache row of `width` values keeps in a [`LineVec`] of rows (the row and its
/// padding): whole cache lines, and an odd number of them from 8 lines (512 bytes) up. A row
/// of 2 KiB (a Qwen3-30B-A3B or GPT-OSS KV cache row, 512 floats)
/// put one tile's 16 columns of successive positions into two of the L1 cache's 64 sets and 32
/// of the L2's, so the weighted sums of a long context read the tile from L3 again for every
/// group of rows; rows an odd number of lines apart step through every set (AVX-512 weighted
/// sums 1.2×, a decode step's 1.3× in `attention_sums`, for 3% more memory). Rows below 8
/// lines are left whole-line: padding them would cost up to a third.
pub fn row_stride(width: usize) -> usize {
    let lines = width.div_ceil(LINE);
    LINE * if lines >= 8 && lines.is_multiple_of(2) { lines + 1 } else { lines }
}

/// A growable run of f32 values whose first value starts a cache line; it derefs to `[f32]`
/// and grows as a `Vec` does (amortized doubling).
#[derive(Clone, Default)]
pub struct LineVec {
    /// `len.div_ceil(LINE)` lines; the values of the last one past `len` are unspecified.
    lines: Vec<Line>,
    /// Values held.
    len: usize,
}

impl LineVec {
    /// An empty run.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty run with room for `values` values.
    pub fn with_capacity(values: usize) -> Self {
        Self { lines: Vec::with_capacity(values.div_ceil(LINE)), len: 0 }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no value is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values the storage holds without growing (a whole number of lines).
    pub fn capacity(&self) -> usize {
        self.lines.capacity() * LINE
    }

    /// Keeps the first `len` values (nothing if `len` is not less than [`Self::len`]).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.lines.truncate(len.div_ceil(LINE));
        }
    }

    /// Drops every value, keeping the storage.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Appends `values`, each written once (a restored snapshot's caches are hundreds of
    /// megabytes: no zero fill before the copy).
    pub fn extend_from_slice(&mut self, values: &[f32]) {
        let start = self.len;
        // The rest of the last, partly filled line first; then whole lines (the last of them
        // padded with zeros).
        let head = ((LINE - start % LINE) % LINE).min(values.len());
        self.len += head;
        self[start..].copy_from_slice(&values[..head]);
        let rest = &values[head..];
        self.lines.extend(rest.chunks(LINE).map(|c| {
            let mut line = Line([0.0; LINE]);
            line.0[..c.len()].copy_from_slice(c);
            line
        }));
        self.len += rest.len();
    }
}

impl Deref for LineVec {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` over `[f32; 16]` with alignment 64 and size 64 (no
        // padding), so the lines are `16 · lines.len()` initialised f32 values side by side,
        // and `len ≤ 16 · lines.len()`; the borrow of `self` keeps them alive and unaliased by
        // writes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for LineVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, through the unique borrow of `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl From<&[f32]> for LineVec {
    fn from(values: &[f32]) -> Self {
        let mut v = Self::new();
        v.extend_from_slice(values);
        v
    }
}

impl From<Vec<f32>> for LineVec {
    fn from(values: Vec<f32>) -> Self {
        Self::from(values.as_slice())
    }
}

impl Extend<f32> for LineVec {
    fn extend<I: IntoIterator<Item = f32>>(&mut self, values: I) {
        for v in values {
            if self.len.is_multiple_of(LINE) {
                self.lines.push(Line([0.0; LINE]));
            }
            self.len += 1;
            let last = self.len - 1;
            self[last] = v;
        }
    }
}

impl FromIterator<f32> for LineVec {
    fn from_iter<I: IntoIterator<Item = f32>>(values: I) -> Self {
        let mut v = Self::new();
        v.extend(values);
        v
    }
}

impl PartialEq for LineVec {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for LineVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_rows_of_a_power_of_two_lines_shared_l1_sets_now_an_odd_number_of_lines() {
        // (width, stride): rows of 8 lines or more an odd number of lines; shorter rows whole
        // lines only.
        for (w, want) in
            [(512, 528), (256, 272), (128, 144), (96, 96), (100, 112), (144, 144), (64, 64)]
        {
            assert_eq!(row_stride(w), want, "width {w}");
        }
        for w in (1..2_000).step_by(7) {
            let s = row_stride(w);
            assert!(s >= w && s.is_multiple_of(LINE) && s - w < 2 * LINE, "width {w}: {s}");
            assert!(s < 8 * LINE || (s / LINE) % 2 == 1, "width {w}: {s}");
        }
    }

    #[test]
    fn a_cache_vec_started_16_bytes_past_a_line_now_every_length_starts_on_one() {
        let mut v = LineVec::new();
        let mut want = Vec::new();
        for n in [1usize, 15, 16, 17, 100, 4096, 3, 70_000] {
            let values: Vec<f32> = (0..n).map(|i| (want.len() + i) as f32 * 0.5).collect();
            v.extend_from_slice(&values);
            want.extend_from_slice(&values);
            assert_eq!(&v[..], &want[..]);
            assert_eq!(v.as_ptr() as usize % 64, 0, "the values start a cache line");
            assert!(v.capacity() >= v.len());
        }
        v.truncate(33);
        want.truncate(33);
        assert_eq!(&v[..], &want[..]);
        v.extend((0..40).map(|i| i as f32));
        want.extend((0..40).map(|i| i as f32));
        assert_eq!(&v[..], &want[..]);
        assert_eq!(v.clone(), v);
        let collected: LineVec = want.iter().copied().collect();
        assert_eq!(&collected[..], &want[..]);
        v.clear();
        assert!(v.is_empty());
    }
}
