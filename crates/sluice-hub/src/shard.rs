//! Safetensors shard headers read over HTTP, and the split into spine and routed experts.
//!
//! A shard is an 8-byte little-endian header length N, N bytes of JSON, then the data. Two
//! range requests (bytes 0..8, then 8..8+N) give the whole header without touching the data,
//! which is enough both to plan a stream install (how many bytes are not routed experts) and
//! to fetch exactly the spine tensors later.
//!
//! Which tensors are **routed experts** is the model family's knowledge, not the hub's: the
//! caller passes a [`RoutedTensors`] list (computed by `sluice-models` from the repository's
//! `config.json` and the family's expert layout: whole per-expert tensors, or stacked `[E, ...]`
//! tensors whose every byte is some expert's slice). Everything else, shared experts included,
//! is the spine: every token uses it.
//!
//! The header is hostile input, so lengths and offsets are bounds-checked against the size
//! the hub reported and tensors may not overlap; dtype × shape agreement is left to
//! `sluice-checkpoint`, which validates the header again when it opens the install.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{HubError, Result};
use crate::fetcher::RangeFetcher;
use crate::repo::RemoteFile;

/// Largest header accepted, as in `sluice-checkpoint` and the reference implementation.
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;

/// Spine ranges closer than this are fetched as one request (the gap bytes are real file
/// bytes, so filling them costs bandwidth, never correctness).
pub const DEFAULT_COALESCE_GAP: u64 = 1024 * 1024;

/// A half-open byte range `start..end` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Span {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the span holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One tensor's absolute byte range in its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpan {
    /// Tensor name from the header.
    pub name: String,
    /// Absolute file range (data offset already added).
    pub span: Span,
    /// Whether this is a routed expert tensor.
    pub routed_expert: bool,
}

/// A shard header fetched from the hub and checked against the shard's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardHeader {
    /// Repository path of the shard.
    pub file: String,
    /// The raw first 8 + N bytes of the shard (length prefix and JSON).
    pub bytes: Vec<u8>,
    /// Size of the whole shard.
    pub file_len: u64,
    /// Every tensor, ascending by offset.
    pub tensors: Vec<TensorSpan>,
}

impl ShardHeader {
    /// Parses `bytes` (the first 8 + N bytes of `file`, whose size is `file_len`); the tensors
    /// `routed` lists are its routed experts.
    pub fn parse(
        file: &str,
        bytes: Vec<u8>,
        file_len: u64,
        routed: &RoutedTensors,
    ) -> Result<Self> {
        let bad = |reason: String| HubError::BadHeader { file: file.to_owned(), reason };
        let n = header_len(file, &bytes, file_len)?;
        let json = usize::try_from(8 + n)
            .ok()
            .and_then(|end| bytes.get(8..end))
            .ok_or_else(|| bad(format!("have {} header bytes, need {}", bytes.len(), 8 + n)))?;
        let map: serde_json::Map<String, Value> =
            serde_json::from_slice(json).map_err(|e| bad(format!("JSON: {e}")))?;
        let data_offset = 8 + n;
        let data_len = file_len - data_offset;
        let mut tensors = Vec::with_capacity(map.len());
        for (name, v) in &map {
            if name == "__metadata__" {
                continue;
            }
            let offs = v
                .get("data_offsets")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 2)
                .ok_or_else(|| bad(format!("{name}: missing data_offsets")))?;
            let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
                (Some(b), Some(e)) if b <= e && e <= data_len => (b, e),
                _ => return Err(bad(format!("{name}: data_offsets {offs:?} outside the data"))),
            };
            tensors.push(TensorSpan {
                name: name.clone(),
                span: Span { start: data_offset + b, end: data_offset + e },
                routed_expert: routed.contains(name),
            });
        }
        tensors.sort_by_key(|t| (t.span.start, t.span.end));
        for w in tensors.windows(2) {
            if w[1].span.start < w[0].span.end {
                return Err(bad(format!("tensors {} and {} overlap", w[0].name, w[1].name)));
            }
        }
        Ok(Self { file: file.to_owned(), bytes, file_len, tensors })
    }

    /// Length of the JSON header, N.
    pub fn header_len(&self) -> u64 {
        self.data_offset() - 8
    }

    /// Absolute offset of the data section, 8 + N.
    pub fn data_offset(&self) -> u64 {
        u64::try_from(self.bytes.len()).unwrap_or(u64::MAX)
    }

    /// Bytes held by routed experts.
    pub fn expert_bytes(&self) -> u64 {
        self.tensors.iter().filter(|t| t.routed_expert).map(|t| t.span.len()).sum()
    }

    /// Whether the shard holds any routed expert tensor.
    pub fn has_experts(&self) -> bool {
        self.tensors.iter().any(|t| t.routed_expert)
    }

    /// The non-expert tensors' ranges, merged where they touch or lie within `gap` bytes.
    /// The header itself (`0..data_offset`) is not included: it is already in hand.
    pub fn spine_spans(&self, gap: u64) -> Vec<Span> {
        let mut out: Vec<Span> = Vec::new();
        for t in self.tensors.iter().filter(|t| !t.routed_expert && !t.span.is_empty()) {
            match out.last_mut() {
                Some(last) if t.span.start <= last.end.saturating_add(gap) => {
                    last.end = last.end.max(t.span.end);
                }
                _ => out.push(t.span),
            }
        }
        out
    }
}

/// The tensors that hold a model's routed experts, by name as its family's layout gives them
/// (without a checkpoint's name prefix such as `language_model.`). Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutedTensors(Arc<BTreeSet<String>>);

impl RoutedTensors {
    /// No routed experts (a dense model, or a repository that is no model): a stream install
    /// of it is a full one.
    pub fn none() -> Self {
        Self::default()
    }

    /// Exactly the tensors `names`.
    pub fn new(names: BTreeSet<String>) -> Self {
        Self(Arc::new(names))
    }

    /// Whether tensor `name` of a shard is listed: the name itself, or the name less a dotted
    /// prefix (`language_model.model.layers.1...` for `model.layers.1...`).
    pub fn contains(&self, name: &str) -> bool {
        if self.0.contains(name) {
            return true;
        }
        name.match_indices('.').any(|(i, _)| self.0.contains(&name[i + 1..]))
    }

    /// How many tensors are listed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no tensor is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn header_len(file: &str, bytes: &[u8], file_len: u64) -> Result<u64> {
    let bad = |reason: String| HubError::BadHeader { file: file.to_owned(), reason };
    let prefix: [u8; 8] = bytes
        .get(..8)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| bad(format!("file of {file_len} bytes is too short")))?;
    let n = u64::from_le_bytes(prefix);
    if n == 0 || n > MAX_HEADER_LEN {
        return Err(bad(format!("header length {n} outside 1..={MAX_HEADER_LEN}")));
    }
    // n ≤ 100 MiB, so 8 + n cannot overflow.
    if 8 + n > file_len {
        return Err(bad(format!("header length {n} runs past the end ({file_len} bytes)")));
    }
    Ok(n)
}

/// Fetches and parses the header of a remote shard with two range requests.
pub fn fetch_header(
    fetcher: &RangeFetcher,
    file: &RemoteFile,
    routed: &RoutedTensors,
) -> Result<ShardHeader> {
    if file.size < 8 {
        return Err(HubError::BadHeader {
            file: file.path.clone(),
            reason: format!("file of {} bytes is too short", file.size),
        });
    }
    let prefix = fetcher.fetch_range(&file.path, 0, 8)?;
    let n = header_len(&file.path, &prefix, file.size)?;
    let mut bytes = prefix;
    bytes.extend(fetcher.fetch_range(&file.path, 8, n)?);
    ShardHeader::parse(&file.path, bytes, file.size, routed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(entries: &[(&str, u64, u64)], data_len: u64) -> (Vec<u8>, u64) {
        let mut m = serde_json::Map::new();
        m.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        for (n, b, e) in entries {
            m.insert(
                (*n).into(),
                serde_json::json!({"dtype": "U8", "shape": [e - b], "data_offsets": [b, e]}),
            );
        }
        let json = serde_json::to_vec(&m).expect("json");
        let mut bytes = u64::try_from(json.len()).expect("len").to_le_bytes().to_vec();
        bytes.extend(json);
        let total = u64::try_from(bytes.len()).expect("len") + data_len;
        (bytes, total)
    }

    fn k3ish() -> RoutedTensors {
        RoutedTensors::new(["a.experts.0.w1", "a.experts.1.w1"].map(String::from).into())
    }

    #[test]
    fn routed_tensors_match_with_or_without_a_prefix() {
        let r =
            RoutedTensors::new(["model.layers.1.mlp.experts.gate_up_proj_blocks".into()].into());
        assert!(r.contains("model.layers.1.mlp.experts.gate_up_proj_blocks"));
        assert!(r.contains("language_model.model.layers.1.mlp.experts.gate_up_proj_blocks"));
        assert!(!r.contains("model.layers.1.mlp.experts.gate_up_proj_bias"));
        assert!(!r.contains("layers.1.mlp.experts.gate_up_proj_blocks"));
        assert!(!RoutedTensors::none().contains("model.layers.1.mlp.experts.0.w1.weight"));
    }

    #[test]
    fn spine_spans_coalesce_and_skip_experts() {
        let (bytes, total) = header(
            &[
                ("a.norm", 0, 10),
                ("a.attn", 10, 30),
                ("a.experts.0.w1", 30, 100),
                ("a.shared_experts.w1", 100, 120),
                ("a.experts.1.w1", 120, 200),
                ("b.norm", 200, 210),
            ],
            210,
        );
        let h = ShardHeader::parse("s.safetensors", bytes, total, &k3ish()).expect("parse");
        let d = h.data_offset();
        assert_eq!(h.expert_bytes(), 150);
        let spans = h.spine_spans(0);
        assert_eq!(
            spans,
            vec![
                Span { start: d, end: d + 30 },
                Span { start: d + 100, end: d + 120 },
                Span { start: d + 200, end: d + 210 },
            ]
        );
        assert_eq!(h.spine_spans(70), vec![Span { start: d, end: d + 120 }, spans[2]]);
    }

    #[test]
    fn hostile_headers_are_refused() {
        let (bytes, total) = header(&[("a", 0, 10), ("b", 5, 20)], 20);
        assert!(ShardHeader::parse("s", bytes, total, &k3ish()).is_err());
        let (bytes, total) = header(&[("a", 0, 50)], 20);
        assert!(ShardHeader::parse("s", bytes, total, &k3ish()).is_err());
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend(b"{}");
        assert!(ShardHeader::parse("s", bytes, 100, &k3ish()).is_err());
        assert!(ShardHeader::parse("s", vec![1, 2], 2, &k3ish()).is_err());
    }
}
