//! Where every routed expert lives on disk, resolved once at open.
//!
//! An expert is the list of parts its family's [`ExpertLayout`] gives: byte ranges of checkpoint
//! tensors (Kimi K3: six MXFP4 tensors; Qwen3-MoE: three bf16 matrices; GPT-OSS: its slice of
//! each stacked `[E, ...]` tensor). Where parts lie close together in one shard, in any order,
//! one read fetches them ([`coalesce`]): all of a K3 expert, and a Kimi K2 expert's three
//! `weight_packed` and three `weight_scale` tensors, whose runs the published name order
//! separates only by tiny `weight_shape` tensors. Parts far apart are separate spans (GPT-OSS:
//! one per stacked tensor). The index also fixes the **slot layout**: each span's 4096-aligned
//! superset gets its own aligned region of the slot buffer, so the same layout serves O_DIRECT
//! reads (aligned offset, length and buffer) and buffered ones, and an [`ExpertView`] is the
//! parts sliced out of the slot.

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

/// Largest gap between two parts of an expert that one read bridges. Gap bytes are read and
/// thrown away, so a bridge is worth it when the gap costs less than a second request: on the
/// disks sluice targets a request costs ~100 µs of queueing and latency, which is ~100 KiB
/// of transfer at 1–2 GB/s. The gaps this is for are a few bytes (`weight_shape` tensors)
/// to a few KiB (alignment padding); a stacked tensor's other experts are megabytes away.
pub const COALESCE_MAX_GAP: u64 = 64 * 1024;

/// Of an expert's bytes, the share that bridged gaps may add at most (1/32), or one
/// [`ALIGN`] page if that is more: keeps the bytes read per expert within ~3% of its parts'
/// bytes whatever the gaps, so prefill still reads each routed expert ~once (read ÷ distinct
/// ≤ 1.05 with the alignment padding). A page is always allowed because aligned reads of two
/// spans less than a page apart read the page between them anyway.
pub const COALESCE_GAP_SHARE: u64 = 32;

/// The read rule: merges an expert's parts `(shard, offset, len)` into the spans to read.
/// Parts of one shard that overlap or touch are one span; a gap between two runs of one shard
/// is bridged when it is at most [`COALESCE_MAX_GAP`] bytes, smallest gaps first, while the
/// bridged bytes stay within max(1/[`COALESCE_GAP_SHARE`] of the parts' bytes, [`ALIGN`]).
/// Parts of different shards are never merged. Returns the spans `(shard, offset, len)` in
/// disk order and, per part, the index of the span holding it.
pub fn coalesce(parts: &[(usize, u64, u64)]) -> (Vec<(usize, u64, u64)>, Vec<usize>) {
    let (runs, run_of) = touching(parts);
    // Gaps between neighbouring runs of one shard that may be bridged, smallest first.
    let mut gaps: Vec<(u64, usize)> = runs
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0].0 == w[1].0 && w[1].1 - w[0].2 <= COALESCE_MAX_GAP)
        .map(|(i, w)| (w[1].1 - w[0].2, i))
        .collect();
    gaps.sort_unstable();
    let total: u64 = parts.iter().map(|p| p.2).sum();
    let mut budget = (total / COALESCE_GAP_SHARE).max(ALIGN);
    let mut bridged = vec![false; runs.len()];
    for (gap, i) in gaps {
        if gap > budget {
            break;
        }
        budget -= gap;
        bridged[i] = true;
    }
    // Run i joins the span of run i - 1 when the gap between them is bridged.
    let mut spans: Vec<(usize, u64, u64)> = Vec::with_capacity(runs.len());
    let mut span_of_run = vec![0usize; runs.len()];
    for (i, &(file, start, end)) in runs.iter().enumerate() {
        match spans.last_mut() {
            Some(s) if i > 0 && bridged[i - 1] => s.2 = end - s.1,
            _ => spans.push((file, start, end - start)),
        }
        span_of_run[i] = spans.len() - 1;
    }
    (spans, run_of.iter().map(|&r| span_of_run[r]).collect())
}

/// Runs of overlapping or touching parts `(shard, offset, len)`, in disk order, as
/// `(shard, start, end)`, and per part the index of the run holding it.
fn touching(parts: &[(usize, u64, u64)]) -> (Vec<(usize, u64, u64)>, Vec<usize>) {
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&k| (parts[k].0, parts[k].1, parts[k].2));
    let mut runs: Vec<(usize, u64, u64)> = Vec::new();
    let mut run_of = vec![0usize; parts.len()];
    for &k in &order {
        let (file, off, len) = parts[k];
        let end = off.saturating_add(len);
        match runs.last_mut() {
            Some(r) if r.0 == file && off <= r.2 => r.2 = r.2.max(end),
            _ => runs.push((file, off, end)),
        }
        run_of[k] = runs.len() - 1;
    }
    (runs, run_of)
}

/// [`touching`]'s runs as spans: an expert's own bytes, no bridged gap.
fn touching_runs(parts: &[(usize, u64, u64)]) -> Vec<Span> {
    let (runs, _) = touching(parts);
    runs.into_iter()
        .map(|(file, start, end)| Span { file, offset: start, len: end - start, region: 0 })
        .collect()
}

/// One expert's spans and the position of its parts in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLoc {
    spans: Vec<Span>,
    /// The expert's own bytes: runs of touching parts, no bridged gap ([`Self::stored_spans`]).
    stored: Vec<Span>,
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
        if entries.len() > MAX_PARTS {
            return Err(StoreError::Config(format!(
                "an expert of {} parts; at most {MAX_PARTS} are supported",
                entries.len()
            )));
        }
        let ranges: Vec<(usize, u64, u64)> =
            entries.iter().map(|t| (t.shard, t.offset, t.len)).collect();
        let (runs, of_part) = coalesce(&ranges);
        let stored = touching_runs(&ranges);
        let mut spans: Vec<Span> = Vec::with_capacity(runs.len());
        let mut cursor = 0u64;
        for &(file, offset, len) in &runs {
            let s = Span { file, offset, len, region: cursor };
            cursor += s.region_len();
            spans.push(s);
        }
        let parts = entries
            .iter()
            .zip(&of_part)
            .map(|(t, &k)| {
                let s = &spans[k];
                Part { start: s.region + s.lead() + (t.offset - s.offset), len: t.len }
            })
            .collect();
        let buffer_len = spans.last().map_or(0, |s| s.region + s.region_len());
        let bytes = entries.iter().map(|t| t.len).sum();
        Ok(Self { spans, stored, parts, bytes, buffer_len })
    }

    /// The byte spans to read, in disk order (gaps between parts may be bridged: their bytes
    /// are read and thrown away).
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The expert's own bytes, in disk order: runs of touching parts, never a bridged gap (whose
    /// bytes may be another tensor's, such as `weight_shape`). What a stream install fetches,
    /// hashes and punches back: filling or punching a bridged read span there would write over
    /// or drop the spine bytes in its gaps. `region` is 0 (these are not read into a slot).
    pub fn stored_spans(&self) -> &[Span] {
        &self.stored
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
    fn adjacent_parts_coalesce_into_one_span_in_any_order() {
        let (spans, of) = coalesce(&[(0, 300, 100), (0, 100, 200), (0, 400, 50)]);
        assert_eq!(spans, vec![(0, 100, 350)]);
        assert_eq!(of, vec![0, 0, 0]);
    }

    #[test]
    fn small_gaps_are_bridged_and_large_ones_are_not() {
        // Kimi K2's published order: packed, scale, then an 8-byte `weight_shape` before the
        // next projection: three runs, two 8-byte gaps, one read.
        let (p, sc) = (7_340_032u64, 917_504u64);
        let k2 = [(0, 1000, p), (0, 1000 + p, sc), (0, 1008 + p + sc, p)];
        let (spans, of) = coalesce(&k2);
        assert_eq!(spans, vec![(0, 1000, 2 * p + sc + 8)]);
        assert_eq!(of, vec![0, 0, 0]);
        // A gap over COALESCE_MAX_GAP stays a gap, however large the expert.
        let far = 1000 + p + COALESCE_MAX_GAP + 1;
        let (spans, of) = coalesce(&[(0, 1000, p), (0, far, p)]);
        assert_eq!(spans, vec![(0, 1000, p), (0, far, p)]);
        assert_eq!(of, vec![0, 1]);
        // Exactly COALESCE_MAX_GAP is bridged.
        let (spans, _) = coalesce(&[(0, 0, p), (0, p + COALESCE_MAX_GAP, p)]);
        assert_eq!(spans, vec![(0, 0, 2 * p + COALESCE_MAX_GAP)]);
    }

    #[test]
    fn bridged_gaps_stay_within_a_share_of_the_expert() {
        // 640,000 bytes of parts allow 20,000 bytes of gaps: the 8,000- and 12,000-byte gaps
        // are bridged (smallest first), the 16,000-byte one no longer fits.
        let parts = [(0, 0, 160_000), (0, 172_000, 160_000), (0, 348_000, 160_000)];
        let parts = [parts[0], parts[1], parts[2], (0, 516_000, 160_000)];
        let (spans, of) = coalesce(&parts);
        assert_eq!(spans, vec![(0, 0, 332_000), (0, 348_000, 328_000)]);
        assert_eq!(of, vec![0, 0, 1, 1]);
        let gaps: u64 = spans.iter().map(|s| s.2).sum::<u64>() - 640_000;
        assert!(gaps <= 640_000 / COALESCE_GAP_SHARE);
        // A small expert may always bridge up to a page of gaps.
        let (spans, _) = coalesce(&[(0, 0, 100), (0, 2100, 100), (0, 4700, 100)]);
        assert_eq!(spans, vec![(0, 0, 2200), (0, 4700, 100)]);
    }

    #[test]
    fn parts_in_different_shards_are_never_merged() {
        let (spans, of) = coalesce(&[(1, 0, 100), (0, 100, 100), (1, 100, 100), (0, 0, 100)]);
        assert_eq!(spans, vec![(0, 0, 200), (1, 0, 200)]);
        assert_eq!(of, vec![1, 0, 1, 0]);
    }

    #[test]
    fn overlapping_parts_share_one_span() {
        // A part inside another, and one that overlaps its end.
        let (spans, of) = coalesce(&[(0, 100, 400), (0, 200, 50), (0, 450, 100)]);
        assert_eq!(spans, vec![(0, 100, 450)]);
        assert_eq!(of, vec![0, 0, 0]);
    }

    #[test]
    fn a_coalesced_expert_hands_out_its_parts_across_the_gap() {
        // down.packed, down.scale, down.shape (gap), gate.packed, gate.scale: one span whose
        // region holds the gap, each part at its own place in the slot.
        let arr = [
            entry("gate.packed", 0, 5024, 4000),
            entry("gate.scale", 0, 9024, 500),
            entry("down.packed", 0, 500, 4000),
            entry("down.scale", 0, 4500, 500),
        ];
        let loc = ExpertLoc::locate(&arr, &[PathBuf::from("a")], &[20_000]).expect("locates");
        assert!(loc.is_contiguous());
        let s = loc.spans()[0];
        assert_eq!((s.offset, s.len, s.read_offset()), (500, 9024, 0));
        let starts: Vec<u64> = loc.parts().iter().map(|p| p.start).collect();
        assert_eq!(starts, vec![5024, 9024, 500, 4500]);
        assert_eq!(loc.bytes(), 9000, "the gap is read, not served");
        assert_eq!(loc.read_bytes(), 3 * 4096);
        let buf: Vec<u8> =
            (0..loc.buffer_len()).map(|i| u8::try_from(i % 251).expect("small")).collect();
        let v = loc.view(&buf).expect("fits");
        assert_eq!(v.part(1), &buf[9024..9524]);
    }

    /// A stream install fetched, hashed and punched an expert's bridged read span, so the
    /// spine bytes in its gaps (Kimi K2's `weight_shape` between an expert's parts) were
    /// punched to zeros after a refused range: its stored spans are the parts only.
    #[test]
    fn stream_installs_punched_the_spine_bytes_between_an_experts_parts() {
        let arr = [
            entry("down.packed", 0, 500, 4000),
            entry("down.scale", 0, 4500, 500),
            entry("gate.packed", 0, 5024, 4000),
        ];
        let loc = ExpertLoc::locate(&arr, &[PathBuf::from("a")], &[20_000]).expect("locates");
        assert!(loc.is_contiguous(), "the read bridges the 24-byte gap");
        let stored: Vec<(u64, u64)> =
            loc.stored_spans().iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(stored, vec![(500, 4500), (5024, 4000)], "the gap is not the expert's");
    }

    #[test]
    fn a_span_past_the_end_of_its_file_is_refused() {
        let arr = [0, 1, 2, 3, 4, 5].map(|k| entry("w", 0, 100 * k, 100));
        let err = ExpertLoc::locate(&arr, &[PathBuf::from("shard")], &[550]).expect_err("refused");
        assert!(err.to_string().contains("shard: tensor w spans bytes 500..600"), "{err}");
    }
}
