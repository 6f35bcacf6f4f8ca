//! Where the spine lives on disk, resolved once at open: every **piece** (the embedding, one
//! decoder layer, the output head) is the list of its tensors' byte ranges, merged into a few
//! large spans. A layer's spine tensors are contiguous in the published shards except for the
//! routed experts sorted between them, so a layer is typically one or two spans; a gap of at
//! most [`MERGE_GAP`] bytes (a small norm vector the model keeps elsewhere) is read through
//! rather than split into another request.
//!
//! As for experts ([`crate::index`]), each span's 4096-aligned superset gets its own aligned
//! region of the piece's buffer, so the same layout serves O_DIRECT and buffered reads.

use crate::index::{align_up, Span, ALIGN};
use crate::StoreError;
use std::path::{Path, PathBuf};

/// Two tensors at most this far apart in one file are read as one span.
pub const MERGE_GAP: u64 = 1 << 20;

/// One tensor's bytes: shard index, absolute offset, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRange {
    /// Shard index (into [`SpineIndex::paths`]).
    pub file: usize,
    /// Absolute offset of the first byte in the shard.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The spans of one piece and the size of the buffer they land in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceLayout {
    name: String,
    spans: Vec<Span>,
    tensor_bytes: u64,
    buffer_len: u64,
}

impl PieceLayout {
    /// Merges `tensors` (any order) into spans, sorted by file and offset.
    pub fn new(name: impl Into<String>, tensors: &[TensorRange]) -> Self {
        let mut sorted: Vec<TensorRange> = tensors.to_vec();
        sorted.sort_by_key(|t| (t.file, t.offset));
        let mut spans: Vec<Span> = Vec::new();
        let mut cursor = 0u64;
        for t in &sorted {
            let merge = spans.last().is_some_and(|s| {
                s.file == t.file && t.offset <= (s.offset + s.len).saturating_add(MERGE_GAP)
            });
            if merge {
                let s = spans.last_mut().expect("invariant: merge implies a last span");
                s.len = s.len.max(t.offset + t.len - s.offset);
            } else {
                if let Some(prev) = spans.last() {
                    cursor += prev.region_len();
                }
                spans.push(Span { file: t.file, offset: t.offset, len: t.len, region: cursor });
            }
        }
        let buffer_len = spans.last().map_or(0, |s| s.region + s.region_len());
        Self {
            name: name.into(),
            spans,
            tensor_bytes: sorted.iter().map(|t| t.len).sum(),
            buffer_len,
        }
    }

    /// What the piece is, for messages and the plan (`layer 3`, `lm_head`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The spans to read, in disk order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Bytes of the piece's tensors.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_bytes
    }

    /// Buffer bytes the piece needs (its aligned regions end to end; a multiple of [`ALIGN`]).
    pub fn buffer_len(&self) -> u64 {
        self.buffer_len
    }

    /// Bytes an aligned read of the whole piece transfers.
    pub fn read_bytes(&self) -> u64 {
        self.spans.iter().map(Span::region_len).sum()
    }

    /// Where the tensor at `file`/`offset`/`len` sits in the piece's buffer, if the piece holds
    /// it. A scan over a handful of spans: no name is formatted or looked up.
    pub fn locate(&self, file: usize, offset: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let s = self
            .spans
            .iter()
            .find(|s| s.file == file && offset >= s.offset && offset + len <= s.offset + s.len)?;
        let start = usize::try_from(s.region + s.lead() + (offset - s.offset)).ok()?;
        Some(start..start.checked_add(usize::try_from(len).ok()?)?)
    }
}

/// Every spine piece of a model, in pass order (embedding, layers, head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpineIndex {
    pieces: Vec<PieceLayout>,
    paths: Vec<PathBuf>,
}

impl SpineIndex {
    /// An index over `pieces` whose spans name files of `paths`; checks that every span lies
    /// inside its file.
    pub fn new(pieces: Vec<PieceLayout>, paths: Vec<PathBuf>) -> Result<Self, StoreError> {
        let mut lens = Vec::with_capacity(paths.len());
        for p in &paths {
            let m = std::fs::metadata(p)
                .map_err(|source| StoreError::Io { path: p.clone(), source })?;
            lens.push(m.len());
        }
        for piece in &pieces {
            for s in &piece.spans {
                let file_len = lens.get(s.file).copied().unwrap_or(0);
                if s.offset.checked_add(s.len).is_none_or(|e| e > file_len) {
                    return Err(StoreError::SpanOutsideFile {
                        path: paths.get(s.file).cloned().unwrap_or_default(),
                        tensor: format!("spine of {}", piece.name),
                        offset: s.offset,
                        end: s.offset.saturating_add(s.len),
                        file_len,
                    });
                }
            }
        }
        Ok(Self { pieces, paths })
    }

    /// The pieces in pass order.
    pub fn pieces(&self) -> &[PieceLayout] {
        &self.pieces
    }

    /// Piece `i`, if it exists.
    pub fn piece(&self, i: usize) -> Option<&PieceLayout> {
        self.pieces.get(i)
    }

    /// The shard files, indexed by [`Span::file`].
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The shard file `file` (empty if out of range).
    pub fn path(&self, file: usize) -> &Path {
        self.paths.get(file).map_or(Path::new(""), PathBuf::as_path)
    }
}

/// An [`ALIGN`]-aligned byte buffer, zeroed or about to be filled by reads, whose disjoint ranges may be written
/// concurrently by read jobs (the owner of the buffer enforces who touches what when).
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer owns its allocation of plain bytes; concurrent access goes through the
// `unsafe` accessors, whose callers guarantee disjoint writers and no reader during a write.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` exposes bytes only through the `unsafe` accessors.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes (rounded up to [`ALIGN`], at least one page).
    pub(crate) fn new(len: u64) -> Result<Self, StoreError> {
        // SAFETY: zeroed: every byte is initialised.
        unsafe { Self::alloc(len, true) }
    }

    /// Allocates like [`Self::new`] without zeroing, for a buffer that reads are about to fill:
    /// zeroing it first would write every byte twice (and, for an aligned allocation, in a
    /// `memset` of its own on the thread that allocates).
    ///
    /// # Safety
    ///
    /// Every byte of the buffer must be written (through [`Self::range_mut`]) before
    /// [`Self::bytes`] is called; a buffer may be dropped unread.
    pub(crate) unsafe fn uninit(len: u64) -> Result<Self, StoreError> {
        // SAFETY: the caller writes every byte before any is read.
        unsafe { Self::alloc(len, false) }
    }

    /// # Safety
    ///
    /// With `zeroed` false, as for [`Self::uninit`].
    unsafe fn alloc(len: u64, zeroed: bool) -> Result<Self, StoreError> {
        let bytes = align_up(len.max(1));
        let size = usize::try_from(bytes).map_err(|_| StoreError::Alloc { bytes })?;
        let align = usize::try_from(ALIGN).map_err(|_| StoreError::Alloc { bytes })?;
        let layout = std::alloc::Layout::from_size_align(size, align)
            .map_err(|_| StoreError::Alloc { bytes })?;
        // SAFETY: `layout` has a non-zero size and a power-of-two alignment.
        let raw = unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        let ptr = std::ptr::NonNull::new(raw).ok_or(StoreError::Alloc { bytes })?;
        Ok(Self { ptr, layout })
    }

    /// Bytes in the buffer.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The whole buffer for reading.
    ///
    /// # Safety
    ///
    /// No one may write the buffer while the returned slice lives.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds `len()` initialised bytes (zeroed by `new`, or written
        // before this call as `uninit` requires) and lives as long as `self`; the caller rules
        // out concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// Bytes `start..start + len` for writing, or `None` if the range is out of bounds.
    ///
    /// # Safety
    ///
    /// No other reference to these bytes may exist while the returned slice lives.
    #[allow(clippy::mut_from_ref)] // Exclusivity per range is the caller's contract, above.
    pub(crate) unsafe fn range_mut(&self, start: usize, len: usize) -> Option<&mut [u8]> {
        if start.checked_add(len)? > self.len() {
            return None;
        }
        // SAFETY: `start + len <= len()`, so the range is inside the allocation; the caller
        // guarantees no other reference to it exists.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` or `alloc` with `self.layout` and is freed
        // exactly once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(file: usize, offset: u64, len: u64) -> TensorRange {
        TensorRange { file, offset, len }
    }

    #[test]
    fn adjacent_and_near_tensors_merge_and_far_ones_split() {
        // Two tensors, a small gap, a third; then experts (far away); then two more; another file.
        let tensors = [
            t(0, 10_000, 1000),
            t(0, 5000, 5000),
            t(0, 11_500, 300),
            t(0, 50_000_000, 2000),
            t(0, 50_002_000, 96),
            t(1, 4096, 8192),
        ];
        let p = PieceLayout::new("layer 1", &tensors);
        let spans: Vec<(usize, u64, u64, u64)> =
            p.spans().iter().map(|s| (s.file, s.offset, s.len, s.region)).collect();
        assert_eq!(
            spans,
            vec![(0, 5000, 6800, 0), (0, 50_000_000, 2096, 8192), (1, 4096, 8192, 12_288)]
        );
        assert_eq!(p.buffer_len(), 20_480);
        assert_eq!(p.tensor_bytes(), 1000 + 5000 + 300 + 2000 + 96 + 8192);
        // 5000 % 4096 = 904 bytes of lead in the first region.
        assert_eq!(p.locate(0, 10_000, 1000), Some(904 + 5000..904 + 6000));
        // 50_000_000 % 4096 = 128.
        assert_eq!(p.locate(0, 50_002_000, 96), Some(8192 + 128 + 2000..8192 + 128 + 2096));
        assert_eq!(p.locate(1, 4096, 8192), Some(12_288..20_480));
        assert_eq!(p.locate(1, 0, 10), None, "not in the piece");
        assert_eq!(p.locate(0, 11_700, 200), None, "runs past the span");
    }

    #[test]
    fn spans_outside_their_file_are_refused() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, &[0u8; 1000]).expect("write");
        let path = f.path().to_path_buf();
        let ok = PieceLayout::new("lm_head", &[t(0, 0, 1000)]);
        assert!(SpineIndex::new(vec![ok], vec![path.clone()]).is_ok());
        let bad = PieceLayout::new("lm_head", &[t(0, 500, 501)]);
        let err = SpineIndex::new(vec![bad], vec![path]).expect_err("past the end");
        assert!(err.to_string().contains("spine of lm_head spans bytes 500..1001"), "{err}");
    }

    #[test]
    fn aligned_buffers_hand_out_checked_ranges() {
        let b = AlignedBuf::new(5000).expect("allocates");
        assert_eq!(b.len(), 8192);
        // SAFETY: this test is the buffer's only user.
        let r = unsafe { b.range_mut(4096, 4096) }.expect("in range");
        r.fill(7);
        // SAFETY: the writer above is gone.
        let all = unsafe { b.bytes() };
        assert_eq!(all[4096], 7);
        assert_eq!(all.as_ptr() as usize % 4096, 0);
        // SAFETY: out of range, so no slice is made.
        assert!(unsafe { b.range_mut(4097, 4096) }.is_none());
    }
}
