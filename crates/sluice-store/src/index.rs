//! Where every routed expert lives on disk, resolved once at open.
//!
//! An expert is the list of parts its family's [`ExpertLayout`] gives: byte ranges of checkpoint
//! tensors (Kimi K3: six MXFP4 tensors; Qwen3-MoE: three bf16 matrices; GPT-OSS: its slice of
//! each stacked `[E, ...]` tensor). Where parts are adjacent in one shard, in any order (all of a
//! K3 expert, in the published shards), one read fetches them; otherwise there is one span per
//! run of adjacent parts (GPT-OSS: one per stacked tensor). The index also fixes the **slot
//! layout**: each span's 4096-aligned superset gets its own aligned region of the slot buffer,
//! so the same layout serves O_DIRECT reads (aligned offset, length and buffer) and buffered
//! ones, and an [`ExpertView`] is the parts sliced out of the slot.

use crate::layout::{resolve, ExpertLayout, MAX_PARTS};
use crate::{ExpertView, StoreError};
use sluice_checkpoint::{Checkpoint, TensorEntry};
use std::path::{Path, PathBuf};

/// Alignment of read offsets, lengths and buffers for O_DIRECT (and of slot regions).
pub const ALIGN: u64 = 4096;

/// Rounds `x` up to a multiple of [`ALIGN`].
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// One contiguous byte range of a shard, and where its aligned superset lands in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Shard index (into [`ExpertIndex::paths`]).
    pub file: usize,
    /// Absolute offset of the first wanted byte in the shard.
    pub offset: u64,
    /// Wanted bytes.
    pub len: u64,
    /// Offset in the slot buffer where the aligned read region starts (a multiple of [`ALIGN`]).
    pub region: u64,
}

impl Span {
    /// File offset the aligned read starts at (`offset` rounded down).
    pub fn read_offset(&self) -> u64 {
        self.offset - self.lead()
    }

    /// Bytes between the aligned read offset and the first wanted byte.
    pub fn lead(&self) -> u64 {
        self.offset % ALIGN
    }

    /// Length of the aligned read region (a multiple of [`ALIGN`]).
    pub fn region_len(&self) -> u64 {
        align_up(self.lead() + self.len)
    }

    /// Bytes from the aligned read offset through the last wanted byte: a read must deliver
    /// at least this many (the rest of the region may lie past the end of the file).
    pub fn needed(&self) -> u64 {
        self.lead() + self.len
    }
}

/// Where one part of an expert sits in the slot buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Offset in the slot buffer.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One expert's spans and the position of its parts in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLoc {
    spans: Vec<Span>,
    parts: Vec<Part>,
    bytes: u64,
    buffer_len: u64,
}

impl ExpertLoc {
    /// Locates an expert from the entries of its parts (in layout order; each covering exactly
    /// the part's bytes), checking every byte lies inside its file.
    pub fn locate(
        entries: &[TensorEntry],
        paths: &[PathBuf],
        file_lens: &[u64],
    ) -> Result<Self, StoreError> {
        for t in entries {
            let file_len = file_lens.get(t.shard).copied().unwrap_or(0);
            let end = t.offset.checked_add(t.len);
            if end.is_none_or(|e| e > file_len) {
                return Err(StoreError::SpanOutsideFile {
                    path: paths.get(t.shard).cloned().unwrap_or_default(),
                    tensor: t.name.clone(),
                    offset: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                });
            }
        }
        // Disk order; runs of adjacent tensors merge into one span.
        if entries.len() > MAX_PARTS {
            return Err(StoreError::Config(format!(
                "an expert of {} parts; at most {MAX_PARTS} are supported",
                entries.len()
            )));
        }
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by_key(|&k| (entries[k].shard, entries[k].offset));
        let mut spans: Vec<Span> = Vec::with_capacity(1);
        let mut parts = vec![Part { start: 0, len: 0 }; entries.len()];
        let mut cursor = 0u64;
        for &k in &order {
            let t = &entries[k];
            let extends =
                spans.last().is_some_and(|s| s.file == t.shard && s.offset + s.len == t.offset);
            if !extends {
                if let Some(prev) = spans.last() {
                    cursor += prev.region_len();
                }
                spans.push(Span { file: t.shard, offset: t.offset, len: 0, region: cursor });
            }
            let s = spans.last_mut().expect("invariant: a span was pushed above");
            parts[k] = Part { start: s.region + s.lead() + (t.offset - s.offset), len: t.len };
            s.len = t.offset + t.len - s.offset;
        }
        let buffer_len = spans.last().map_or(0, |s| s.region + s.region_len());
        let bytes = entries.iter().map(|t| t.len).sum();
        Ok(Self { spans, parts, bytes, buffer_len })
    }

    /// The byte spans to read, in disk order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Position of each part in the slot buffer (layout order).
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// True when one read fetches the whole expert.
    pub fn is_contiguous(&self) -> bool {
        self.spans.len() == 1
    }

    /// Bytes of the expert's parts.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Slot bytes this expert needs (its aligned regions, end to end).
    pub fn buffer_len(&self) -> u64 {
        self.buffer_len
    }

    /// Bytes an aligned read of this expert transfers (the sum of its region lengths).
    pub fn read_bytes(&self) -> u64 {
        self.spans.iter().map(Span::region_len).sum()
    }

    /// The expert's parts sliced out of a slot buffer filled per this layout, or `None` if
    /// `buf` is too short.
    pub fn view<'a>(&self, buf: &'a [u8]) -> Option<ExpertView<'a>> {
        let mut parts: [&'a [u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        for (slice, p) in parts.iter_mut().zip(&self.parts) {
            let start = usize::try_from(p.start).ok()?;
            let end = start.checked_add(usize::try_from(p.len).ok()?)?;
            *slice = buf.get(start..end)?;
        }
        ExpertView::new(&parts[..self.parts.len()])
    }
}

/// Every routed expert of every MoE layer, located.
#[derive(Debug, Clone)]
pub struct ExpertIndex {
    layers: Vec<Vec<ExpertLoc>>,
    paths: Vec<PathBuf>,
    slot_bytes: u64,
}

impl ExpertIndex {
    /// Resolves and checks (dtype, shape, inside the tensor, inside the file) the parts
    /// `layout` gives for each of the `experts` routed experts of every layer in `moe_layers`,
    /// out of `num_layers` layers. The tensors need not be mapped (a stream install's are not).
    pub fn build(
        ckpt: &Checkpoint,
        num_layers: usize,
        moe_layers: &[usize],
        experts: usize,
        layout: &dyn ExpertLayout,
    ) -> Result<Self, StoreError> {
        let paths = ckpt.shard_paths().to_vec();
        let file_lens = paths
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .map(|m| m.len())
                    .map_err(|source| StoreError::Io { path: p.clone(), source })
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let mut layers = vec![Vec::new(); num_layers];
        for &l in moe_layers {
            let Some(slot) = layers.get_mut(l) else {
                return Err(StoreError::Config(format!(
                    "MoE layer {l} is outside the model's {num_layers} layers"
                )));
            };
            let mut locs = Vec::with_capacity(experts);
            for e in 0..experts {
                let ents = resolve(ckpt, layout, l, e, false)?;
                locs.push(ExpertLoc::locate(&ents, &paths, &file_lens)?);
            }
            *slot = locs;
        }
        Ok(Self::from_layers(layers, paths))
    }

    /// An index from already located experts (`layers[l]` empty for layers without experts).
    pub fn from_layers(layers: Vec<Vec<ExpertLoc>>, paths: Vec<PathBuf>) -> Self {
        let slot_bytes = layers.iter().flatten().map(ExpertLoc::buffer_len).max().unwrap_or(0);
        Self { layers, paths, slot_bytes }
    }

    /// The expert `expert` of `layer`, if it exists.
    pub fn get(&self, layer: usize, expert: u32) -> Option<&ExpertLoc> {
        self.layers.get(layer)?.get(usize::try_from(expert).ok()?)
    }

    /// Routed experts in `layer` (0 for a layer without experts or outside the model).
    pub fn experts(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, Vec::len)
    }

    /// Number of layers (with or without experts).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Routed experts over all layers.
    pub fn total_experts(&self) -> usize {
        self.layers.iter().map(Vec::len).sum()
    }

    /// True when every expert is one contiguous span.
    pub fn all_contiguous(&self) -> bool {
        self.layers.iter().flatten().all(ExpertLoc::is_contiguous)
    }

    /// Slot size that fits every expert: the largest expert's aligned regions (each region
    /// already includes up to [`ALIGN`]` - 1` bytes of slack before and after its span).
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::DType;

    fn entry(name: &str, shard: usize, offset: u64, len: u64) -> TensorEntry {
        TensorEntry { name: name.into(), shard, dtype: DType::U8, shape: vec![len], offset, len }
    }

    #[test]
    fn adjacent_tensors_in_any_order_are_one_span() {
        // Disk order w3s, w1p, w2s, w1s, w3p, w2p starting at an unaligned offset.
        let lens = [512u64, 32, 512, 32, 512, 32];
        let disk = [5usize, 0, 3, 1, 4, 2];
        let mut off = 8000u64;
        let mut ents: Vec<TensorEntry> = (0..6).map(|k| entry("t", 0, 0, lens[k])).collect();
        for &k in &disk {
            ents[k].offset = off;
            off += lens[k];
        }
        let arr: [TensorEntry; 6] = ents.clone().try_into().expect("six");
        let loc = ExpertLoc::locate(&arr, &[PathBuf::from("a")], &[20_000]).expect("locates");
        assert!(loc.is_contiguous());
        let s = loc.spans()[0];
        assert_eq!((s.offset, s.len, s.region, s.read_offset()), (8000, 1632, 0, 4096));
        assert_eq!(loc.buffer_len(), 8192);
        for (k, (part, ent)) in loc.parts().iter().zip(&ents).enumerate() {
            assert_eq!(part.start, ent.offset - 4096, "tensor {k}");
        }
    }

    #[test]
    fn scattered_tensors_get_one_aligned_region_per_run() {
        let arr = [
            entry("w1p", 0, 100, 10),
            entry("w1s", 0, 110, 5),
            entry("w2p", 1, 5000, 10),
            entry("w2s", 0, 9000, 5),
            entry("w3p", 1, 5010, 10),
            entry("w3s", 1, 5020, 5),
        ];
        let paths = [PathBuf::from("a"), PathBuf::from("b")];
        let loc = ExpertLoc::locate(&arr, &paths, &[10_000, 10_000]).expect("locates");
        let spans: Vec<(usize, u64, u64, u64)> =
            loc.spans().iter().map(|s| (s.file, s.offset, s.len, s.region)).collect();
        assert_eq!(spans, vec![(0, 100, 15, 0), (0, 9000, 5, 4096), (1, 5000, 25, 8192)]);
        let starts: Vec<u64> = loc.parts().iter().map(|p| p.start).collect();
        assert_eq!(starts, vec![100, 110, 8192 + 904, 4096 + 808, 8192 + 914, 8192 + 924]);
        assert_eq!(loc.buffer_len(), 3 * 4096);
        assert_eq!(loc.bytes(), 45);
    }

    #[test]
    fn a_span_past_the_end_of_its_file_is_refused() {
        let arr = [0, 1, 2, 3, 4, 5].map(|k| entry("w", 0, 100 * k, 100));
        let err = ExpertLoc::locate(&arr, &[PathBuf::from("shard")], &[550]).expect_err("refused");
        assert!(err.to_string().contains("shard: tensor w spans bytes 500..600"), "{err}");
    }
}
