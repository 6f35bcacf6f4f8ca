//! Writing checkpoints: safetensors shards, the shard index, and JSON files.
//!
//! Used by `sluice synth`, the built-in demo model and test fixtures. Every file is written
//! to a temporary name in the destination directory, fsync'd, and renamed into place, so a
//! crash or error never leaves a half-written file under the final name. Headers are padded
//! with spaces to a multiple of 8 bytes, as the Python `safetensors` library does, so the data
//! section starts 8-byte aligned.
//!
//! [`ShardWriter`] streams: it takes the full tensor list first (so the header is known), then
//! accepts each tensor's bytes in order, in as many chunks as convenient. Multi-gigabyte
//! synthetic shards never need to be held in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use sluice_core::DType;

use crate::checkpoint::{is_plain_file_name, INDEX_FILE};
use crate::safetensors::{byte_len, MAX_HEADER_LEN, METADATA_KEY};
use crate::{CheckpointError, Result};

/// One tensor to write in a single call, borrowing its bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorData<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: &'a [u64],
    /// Raw little-endian bytes; length must equal element count × `dtype.size()`.
    pub data: &'a [u8],
}

/// One tensor declared to a [`ShardWriter`] before its bytes arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        Self { name: name.into(), dtype, shape: shape.into() }
    }

    /// Bytes the tensor occupies, or `None` if the size overflows u64.
    pub fn byte_len(&self) -> Option<u64> {
        byte_len(self.dtype, &self.shape)
    }
}

/// Writes a complete safetensors file at `path` atomically, tensors in the given order.
/// Returns the file's size in bytes.
pub fn write_safetensors(
    path: &Path,
    tensors: &[TensorData<'_>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<u64> {
    let mut specs = Vec::with_capacity(tensors.len());
    for t in tensors {
        let spec = TensorSpec::new(t.name, t.dtype, t.shape);
        let expected = spec.byte_len().ok_or_else(|| overflow(path, t.name))?;
        let got = u64::try_from(t.data.len()).unwrap_or(u64::MAX);
        if expected != got {
            return Err(CheckpointError::LengthMismatch {
                path: path.to_path_buf(),
                tensor: t.name.to_owned(),
                expected,
                got,
            });
        }
        specs.push(spec);
    }
    let mut writer = ShardWriter::create(path, specs, metadata)?;
    for t in tensors {
        writer.write_tensor(t.name, t.data)?;
    }
    writer.finish()
}

/// Writes `model.safetensors.index.json` in `dir` atomically, in the Hugging Face layout
/// (`{"metadata": {"total_size": N}, "weight_map": {...}}`). Returns the file's path.
pub fn write_index(
    dir: &Path,
    weight_map: &BTreeMap<String, String>,
    total_size: u64,
) -> Result<PathBuf> {
    let path = dir.join(INDEX_FILE);
    if let Some((tensor, shard)) = weight_map.iter().find(|(_, s)| !is_plain_file_name(s)) {
        return Err(reject(
            &path,
            tensor,
            format!("shard name {shard:?} is not a plain file name"),
        ));
    }
    let value = serde_json::json!({
        "metadata": { "total_size": total_size },
        "weight_map": weight_map,
    });
    write_json_atomic(&path, &value)?;
    Ok(path)
}

/// Writes `value` as pretty-printed JSON (with a final newline) at `path` atomically.
pub fn write_json_atomic(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(value)
        .map_err(|source| CheckpointError::BadJson { path: path.to_path_buf(), source })?;
    text.push(b'\n');
    let mut file = AtomicFile::create(path)?;
    file.write_all(&text)?;
    file.commit()
}

/// Streams one safetensors file: header first, then each declared tensor's bytes in order.
///
/// Dropping the writer before [`ShardWriter::finish`] removes the temporary file; nothing
/// appears under the final name.
#[derive(Debug)]
pub struct ShardWriter {
    file: AtomicFile,
    specs: Vec<TensorSpec>,
    lens: Vec<u64>,
    next: usize,
    written_of_next: u64,
    total: u64,
}

impl ShardWriter {
    /// Starts writing `path` with the tensors `specs`, stored in that order, and an optional
    /// `__metadata__` map. Writes the header immediately.
    pub fn create(
        path: &Path,
        specs: Vec<TensorSpec>,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<Self> {
        let (header, lens) = build_header(path, &specs, metadata)?;
        let data_len = lens.iter().try_fold(0u64, |acc, &l| acc.checked_add(l));
        let total = data_len
            .and_then(|d| d.checked_add(8 + u64::try_from(header.len()).ok()?))
            .ok_or_else(|| overflow(path, "<all tensors>"))?;
        let mut file = AtomicFile::create(path)?;
        let n = u64::try_from(header.len()).unwrap_or(u64::MAX);
        file.write_all(&n.to_le_bytes())?;
        file.write_all(&header)?;
        Ok(Self { file, specs, lens, next: 0, written_of_next: 0, total })
    }

    /// The tensor whose bytes are expected next, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.specs.get(self.next)
    }

    /// Writes the whole of tensor `name`, which must be the next declared tensor and not yet
    /// partly written; `bytes` must be exactly its length.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = &self.file.final_path;
        if self.written_of_next != 0 {
            return Err(reject(path, name, "tensor is already partly written".to_owned()));
        }
        if let Some(&expected) = self.lens.get(self.next) {
            let got = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
            if self.specs.get(self.next).is_some_and(|s| s.name == name) && got != expected {
                return Err(CheckpointError::LengthMismatch {
                    path: path.clone(),
                    tensor: name.to_owned(),
                    expected,
                    got,
                });
            }
        }
        self.write_tensor_chunk(name, bytes)
    }

    /// Writes the next `bytes` of tensor `name`, which must be the tensor being written. The
    /// writer moves to the following tensor once this one's length is reached.
    pub fn write_tensor_chunk(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = &self.file.final_path;
        let (Some(spec), Some(&len)) = (self.specs.get(self.next), self.lens.get(self.next)) else {
            return Err(reject(path, name, "every declared tensor is already written".to_owned()));
        };
        if spec.name != name {
            return Err(reject(path, name, format!("expected tensor {:?} next", spec.name)));
        }
        let after = u64::try_from(bytes.len())
            .ok()
            .and_then(|n| self.written_of_next.checked_add(n))
            .filter(|&after| after <= len);
        let Some(after) = after else {
            let reason = format!(
                "{} more bytes would exceed its {len} bytes ({} already written)",
                bytes.len(),
                self.written_of_next
            );
            return Err(reject(path, name, reason));
        };
        self.file.write_all(bytes)?;
        self.written_of_next = after;
        if after == len {
            self.next += 1;
            self.written_of_next = 0;
        }
        Ok(())
    }

    /// Checks every declared tensor was written, then fsyncs and renames the file into place.
    /// Returns the file's size in bytes.
    pub fn finish(self) -> Result<u64> {
        if self.next < self.specs.len() {
            return Err(CheckpointError::WriteIncomplete {
                path: self.file.final_path.clone(),
                written: self.next,
                total: self.specs.len(),
            });
        }
        self.file.commit()?;
        Ok(self.total)
    }
}

/// Builds the padded header JSON (`__metadata__` first, then tensors in data order) and the
/// byte length of each tensor.
fn build_header(
    path: &Path,
    specs: &[TensorSpec],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Vec<u64>)> {
    let mut out = String::from("{");
    if let Some(meta) = metadata {
        out.push_str(&format!("{}:{}", to_json(path, METADATA_KEY)?, to_json(path, meta)?));
    }
    let mut seen = BTreeSet::new();
    let mut lens = Vec::with_capacity(specs.len());
    let mut offset = 0u64;
    for spec in specs {
        if spec.name.is_empty() || spec.name == METADATA_KEY {
            return Err(reject(path, &spec.name, "reserved or empty tensor name".to_owned()));
        }
        if !seen.insert(spec.name.as_str()) {
            return Err(reject(path, &spec.name, "tensor declared twice".to_owned()));
        }
        let len = spec.byte_len().ok_or_else(|| overflow(path, &spec.name))?;
        let end = offset.checked_add(len).ok_or_else(|| overflow(path, &spec.name))?;
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{offset},{end}]}}",
            to_json(path, &spec.name)?,
            spec.dtype.safetensors_name(),
            to_json(path, &spec.shape)?,
        ));
        lens.push(len);
        offset = end;
    }
    out.push('}');
    while out.len() % 8 != 0 {
        out.push(' ');
    }
    let n = u64::try_from(out.len()).unwrap_or(u64::MAX);
    if n > MAX_HEADER_LEN {
        return Err(CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: n });
    }
    Ok((out.into_bytes(), lens))
}

/// Serializes `value` to a JSON string; errors name the file being written.
fn to_json<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|source| CheckpointError::BadJson { path: path.to_path_buf(), source })
}

fn reject(path: &Path, tensor: &str, reason: String) -> CheckpointError {
    CheckpointError::WriteRejected { path: path.to_path_buf(), tensor: tensor.to_owned(), reason }
}

fn overflow(path: &Path, tensor: &str) -> CheckpointError {
    reject(path, tensor, "size overflows u64".to_owned())
}

/// A file written under a temporary name and renamed into place by [`AtomicFile::commit`];
/// removed on drop if never committed.
#[derive(Debug)]
struct AtomicFile {
    final_path: PathBuf,
    tmp_path: PathBuf,
    out: Option<BufWriter<File>>,
}

/// Distinguishes temporary files of concurrent writers in one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl AtomicFile {
    fn create(path: &Path) -> Result<Self> {
        let name = path.file_name().ok_or_else(|| {
            CheckpointError::io(path, std::io::Error::from(std::io::ErrorKind::InvalidInput))
        })?;
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp_name = format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id());
        let tmp_path = path.with_file_name(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_path)
            .map_err(|e| CheckpointError::io(&tmp_path, e))?;
        let out = Some(BufWriter::with_capacity(1 << 20, file));
        Ok(Self { final_path: path.to_path_buf(), tmp_path, out })
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        match self.out.as_mut() {
            Some(out) => out.write_all(bytes).map_err(|e| CheckpointError::io(&self.tmp_path, e)),
            None => Err(CheckpointError::io(&self.tmp_path, std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn commit(mut self) -> Result<()> {
        let tmp = self.tmp_path.clone();
        let out = self.out.take().ok_or_else(|| {
            CheckpointError::io(&tmp, std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        })?;
        let file = out.into_inner().map_err(|e| CheckpointError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| CheckpointError::io(&tmp, e))?;
        drop(file);
        std::fs::rename(&tmp, &self.final_path)
            .map_err(|e| CheckpointError::io(&self.final_path, e))?;
        // The rename is now the file's only name; nothing is left for Drop to remove.
        self.tmp_path = PathBuf::new();
        sync_parent_dir(&self.final_path);
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.tmp_path.as_os_str().is_empty() {
            self.out = None;
            // Best effort: the error being returned to the caller matters more than this one.
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}

/// Removes the temporary files that [`AtomicFile`]s of processes no longer running left in
/// `dir` (`.NAME.PID.N.tmp`): a `synth`, `convert` or demo creation killed mid-shard leaves one
/// of up to a whole shard, which nothing else would ever remove. A temporary file of a process
/// still running (another writer into the same directory) is left alone where that can be told
/// (`/proc`); this process's own are left alone everywhere. Also removes files whose name ends
/// with one of `extra_suffixes` (a caller's own intermediate names). Returns the bytes freed.
pub fn remove_stale_temps(dir: &Path, extra_suffixes: &[&str]) -> Result<u64> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(CheckpointError::io(dir, e)),
    };
    let mut freed = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = match temp_owner(&name) {
            Some(pid) => writer_is_gone(pid),
            None => extra_suffixes.iter().any(|s| name.ends_with(s)),
        };
        let Ok(meta) = entry.metadata() else { continue };
        if stale && meta.is_file() {
            std::fs::remove_file(entry.path()).map_err(|e| CheckpointError::io(entry.path(), e))?;
            freed += meta.len();
        }
    }
    Ok(freed)
}

/// The process id in an [`AtomicFile`] temporary name `.NAME.PID.N.tmp`, if `name` is one.
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let mut parts = rest.rsplitn(3, '.');
    let (n, pid, base) = (parts.next()?, parts.next()?, parts.next()?);
    if base.is_empty() || n.parse::<u64>().is_err() {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid`, which wrote a temporary file or directory, has gone, so that what it
/// left can be removed: never for this process; without `/proc`, where a running process cannot
/// be told cheaply, a writer that left temporary files behind is taken to be gone.
pub fn writer_is_gone(pid: u32) -> bool {
    pid != std::process::id()
        && !(Path::new("/proc/self").exists() && Path::new("/proc").join(pid.to_string()).exists())
}

/// Makes a completed rename durable by fsyncing its directory (Unix only; best effort, since
/// the file's own data is already synced and some file systems refuse directory fsync).
fn sync_parent_dir(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_parse_to_their_writer() {
        assert_eq!(temp_owner(".model-00001-of-000002.safetensors.4242.7.tmp"), Some(4242));
        assert_eq!(temp_owner(".config.json.1.0.tmp"), Some(1));
        for not in ["model.safetensors", ".x.tmp", ".a.b.tmp", "..1.2.tmp", "a.1.2.tmp"] {
            assert_eq!(temp_owner(not), None, "{not}");
        }
    }
}
