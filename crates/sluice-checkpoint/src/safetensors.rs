//! Hardened parsing of safetensors headers, written by hand.
//!
//! A safetensors file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON, and
//! a data section. The JSON maps tensor names to `{dtype, shape, data_offsets}` (offsets are
//! relative to the data section) plus an optional `__metadata__` string map.
//!
//! Checkpoints come from the internet, so every field is treated as hostile: the header
//! length is bounded, offsets are checked against the real data length, `dtype × shape` is
//! computed with overflow-checked arithmetic and must equal the byte range, and no two
//! tensors may share a byte. Gaps between tensors are allowed (some writers align data)
//! and pass silently. After [`parse_header`] succeeds, every [`TensorInfo`] range is known to
//! lie inside the file, which is what lets the checkpoint hand out slices without checks.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer as _, MapAccess, Visitor};
use serde::Deserialize;
use sluice_core::DType;

use crate::{CheckpointError, Result};

/// Largest header sluice accepts: 100 MiB, the limit the reference implementation uses.
/// Kimi K3 shards, with about 5,000 tensors each, have headers under 1 MiB.
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;

/// Name of the optional metadata entry in a header.
pub(crate) const METADATA_KEY: &str = "__metadata__";

/// One validated tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name as written in the header.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<u64>,
    /// Absolute offset of the tensor's first byte in the file (8 + header length + begin).
    pub data_start: u64,
    /// Length in bytes; equals the element count times `dtype.size()`.
    pub len: u64,
}

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    /// Every tensor, in file order (ascending `data_start`).
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map, empty when absent.
    pub metadata: BTreeMap<String, String>,
    /// Absolute offset of the data section (8 + header length).
    pub data_offset: u64,
    /// Length of the whole file in bytes.
    pub file_len: u64,
}

/// Parses and validates the header of a safetensors file held entirely in `file` (usually a
/// memory map). `path` is used only to name the file in errors.
pub fn parse_header(path: &Path, file: &[u8]) -> Result<SafetensorsHeader> {
    let file_len = u64::try_from(file.len())
        .map_err(|_| CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: u64::MAX })?;
    let prefix = file
        .get(..8)
        .ok_or_else(|| CheckpointError::FileTooShort { path: path.to_path_buf(), len: file_len })?;
    let n = header_len(path, prefix, file_len)?;
    let json = usize::try_from(n).ok().and_then(|n| file.get(8..8 + n)).ok_or_else(|| {
        CheckpointError::HeaderPastEnd { path: path.to_path_buf(), len: n, file_len }
    })?;
    parse_json(path, json, file_len)
}

/// Reads and validates the header of the safetensors file at `path` with ordinary reads,
/// without mapping the file. Reads at most 8 + [`MAX_HEADER_LEN`] bytes.
pub fn read_header(path: &Path) -> Result<SafetensorsHeader> {
    let mut file =
        crate::checkpoint::open_regular(path).map_err(|e| CheckpointError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| CheckpointError::io(path, e))?.len();
    if file_len < 8 {
        return Err(CheckpointError::FileTooShort { path: path.to_path_buf(), len: file_len });
    }
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| CheckpointError::io(path, e))?;
    let n = header_len(path, &prefix, file_len)?;
    let n_usize = usize::try_from(n)
        .map_err(|_| CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: n })?;
    let mut json = vec![0u8; n_usize];
    file.read_exact(&mut json).map_err(|e| CheckpointError::io(path, e))?;
    parse_json(path, &json, file_len)
}

/// Decodes and bounds-checks the header length prefix.
fn header_len(path: &Path, prefix: &[u8], file_len: u64) -> Result<u64> {
    let bytes: [u8; 8] = prefix
        .try_into()
        .map_err(|_| CheckpointError::FileTooShort { path: path.to_path_buf(), len: file_len })?;
    let n = u64::from_le_bytes(bytes);
    if n == 0 {
        return Err(CheckpointError::HeaderEmpty { path: path.to_path_buf() });
    }
    if n > MAX_HEADER_LEN {
        return Err(CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: n });
    }
    // n ≤ 100 MiB, so 8 + n cannot overflow.
    if 8 + n > file_len {
        return Err(CheckpointError::HeaderPastEnd { path: path.to_path_buf(), len: n, file_len });
    }
    Ok(n)
}

/// One header entry as written, before validation.
#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// A header value: either the metadata map or a tensor entry.
enum RawItem {
    Metadata(BTreeMap<String, String>),
    Tensor(RawEntry),
}

/// Collects the header's key/value pairs in order, keeping duplicates so they can be reported,
/// and records the key whose value is being parsed so a type error can name its tensor.
struct HeaderVisitor<'a> {
    current: &'a mut Option<String>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = Vec<(String, RawItem)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(key) = map.next_key::<String>()? {
            *self.current = Some(key.clone());
            let item = if key == METADATA_KEY {
                RawItem::Metadata(map.next_value()?)
            } else {
                RawItem::Tensor(map.next_value()?)
            };
            *self.current = None;
            items.push((key, item));
        }
        Ok(items)
    }
}

/// Parses the JSON header and validates every entry against the file length.
fn parse_json(path: &Path, json: &[u8], file_len: u64) -> Result<SafetensorsHeader> {
    let text = std::str::from_utf8(json).map_err(|e| CheckpointError::HeaderNotUtf8 {
        path: path.to_path_buf(),
        valid_up_to: e.valid_up_to(),
    })?;
    if !text.trim_start().starts_with('{') {
        return Err(CheckpointError::BadStructure {
            path: path.to_path_buf(),
            reason: "safetensors header is not a JSON object".to_owned(),
        });
    }
    let mut current = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let items = de
        .deserialize_map(HeaderVisitor { current: &mut current })
        .and_then(|items| de.end().map(|()| items))
        .map_err(|source| classify_json_error(path, current, source))?;

    // The caller bounded the header by the file length, so neither step saturates in practice.
    let header_end = u64::try_from(json.len()).unwrap_or(u64::MAX).saturating_add(8);
    let data_len = file_len.saturating_sub(header_end);
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(items.len());
    for (name, item) in items {
        match item {
            RawItem::Metadata(map) => metadata = map,
            RawItem::Tensor(raw) => {
                tensors.push(validate_entry(path, name, raw, header_end, data_len)?)
            }
        }
    }
    check_unique(path, &tensors)?;
    tensors.sort_by_key(|t| (t.data_start, t.len));
    check_no_overlap(path, &tensors)?;
    Ok(SafetensorsHeader { tensors, metadata, data_offset: header_end, file_len })
}

/// Attributes a serde error: type errors inside an entry name that entry; syntax errors and
/// errors outside any entry are plain [`CheckpointError::BadJson`].
fn classify_json_error(
    path: &Path,
    current: Option<String>,
    source: serde_json::Error,
) -> CheckpointError {
    let path = path.to_path_buf();
    match (current, source.classify()) {
        (Some(key), serde_json::error::Category::Data) if key == METADATA_KEY => {
            CheckpointError::BadMetadata { path, source }
        }
        (Some(tensor), serde_json::error::Category::Data) => {
            CheckpointError::BadEntry { path, tensor, source }
        }
        _ => CheckpointError::BadJson { path, source },
    }
}

/// Checks one entry's dtype, offsets and length; returns it with an absolute start offset.
fn validate_entry(
    path: &Path,
    name: String,
    raw: RawEntry,
    header_end: u64,
    data_len: u64,
) -> Result<TensorInfo> {
    let path_buf = || path.to_path_buf();
    let Some(dtype) = DType::from_safetensors(&raw.dtype) else {
        return Err(CheckpointError::UnknownDType {
            path: path_buf(),
            tensor: name,
            dtype: raw.dtype,
        });
    };
    let [begin, end] = raw.data_offsets;
    if begin > end {
        return Err(CheckpointError::OffsetsReversed {
            path: path_buf(),
            tensor: name,
            begin,
            end,
        });
    }
    if end > data_len {
        return Err(CheckpointError::OffsetsPastEnd {
            path: path_buf(),
            tensor: name,
            end,
            data_len,
        });
    }
    let Some(expected) = byte_len(dtype, &raw.shape) else {
        return Err(CheckpointError::ShapeOverflow {
            path: path_buf(),
            tensor: name,
            shape: raw.shape,
        });
    };
    let got = end - begin;
    if expected != got {
        return Err(CheckpointError::LengthMismatch {
            path: path_buf(),
            tensor: name,
            expected,
            got,
        });
    }
    let data_start = header_end.checked_add(begin).ok_or_else(|| {
        CheckpointError::OffsetsPastEnd { path: path_buf(), tensor: name.clone(), end, data_len }
    })?;
    Ok(TensorInfo { name, dtype, shape: raw.shape, data_start, len: got })
}

/// Bytes needed by a tensor of `dtype` and `shape`, or `None` on u64 overflow.
///
/// A zero dimension makes the tensor empty whatever the other dimensions are.
pub fn byte_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
}

/// Refuses a header that names the same tensor twice (serde would keep only one silently).
fn check_unique(path: &Path, tensors: &[TensorInfo]) -> Result<()> {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    match names.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(CheckpointError::DuplicateTensor {
            tensor: w[0].to_owned(),
            first: path.to_path_buf(),
            second: path.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// Refuses any two non-empty tensors sharing a byte. `tensors` must be sorted by start.
fn check_no_overlap(path: &Path, tensors: &[TensorInfo]) -> Result<()> {
    // Track the furthest end seen so far and its owner: a long tensor can contain several
    // later ones, so comparing neighbours alone is not enough.
    let mut reach: Option<(u64, &str)> = None;
    for t in tensors.iter().filter(|t| t.len > 0) {
        if let Some((end, owner)) = reach {
            if t.data_start < end {
                return Err(CheckpointError::Overlap {
                    path: PathBuf::from(path),
                    a: owner.to_owned(),
                    b: t.name.clone(),
                });
            }
        }
        let end = t.data_start + t.len;
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, &t.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_len_handles_scalars_zero_dims_and_overflow() {
        assert_eq!(byte_len(DType::F32, &[]), Some(4));
        assert_eq!(byte_len(DType::BF16, &[3, 5]), Some(30));
        assert_eq!(byte_len(DType::F32, &[u64::MAX, u64::MAX, 0]), Some(0));
        assert_eq!(byte_len(DType::F32, &[1 << 32, 1 << 32]), None);
        assert_eq!(byte_len(DType::U8, &[u64::MAX]), Some(u64::MAX));
        assert_eq!(byte_len(DType::BF16, &[u64::MAX]), None);
    }

    #[test]
    fn header_length_bounds() {
        let p = Path::new("x.safetensors");
        assert!(matches!(
            header_len(p, &0u64.to_le_bytes(), 100),
            Err(CheckpointError::HeaderEmpty { .. })
        ));
        assert!(matches!(
            header_len(p, &(MAX_HEADER_LEN + 1).to_le_bytes(), u64::MAX),
            Err(CheckpointError::HeaderTooLarge { .. })
        ));
        assert!(matches!(
            header_len(p, &93u64.to_le_bytes(), 100),
            Err(CheckpointError::HeaderPastEnd { .. })
        ));
        assert_eq!(header_len(p, &92u64.to_le_bytes(), 100).ok(), Some(92));
    }

    #[test]
    fn metadata_type_error_is_reported_as_metadata() {
        let json = br#"{"__metadata__": {"a": 1}}"#;
        let err = parse_json(Path::new("m.safetensors"), json, 1000);
        assert!(matches!(err, Err(CheckpointError::BadMetadata { .. })), "{err:?}");
    }

    #[test]
    fn trailing_garbage_after_object_is_rejected_but_spaces_are_padding() {
        let p = Path::new("t.safetensors");
        assert!(parse_json(p, b"{}   ", 13).is_ok());
        assert!(matches!(parse_json(p, b"{} x", 12), Err(CheckpointError::BadJson { .. })));
    }
}
