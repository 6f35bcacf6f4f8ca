//! `sluice convert`: a Kimi K3 (or Qwen3 dense) checkpoint with its spine's large matrices stored as row-int8.
//!
//! The spine (attention, dense and shared-expert MLPs, the latent MoE projections, `lm_head`;
//! the embeddings only when asked) is read for every token and dominates what must stay
//! resident or be streamed per pass; int8 halves it. Each quantized `[rows, cols]` BF16 matrix
//! `NAME` becomes `NAME` (I8 `[rows, cols]`) and `NAME_scale` (F16 `[rows]`), and element
//! `(r, c)` means `f32(q) · f32(scale[r])` (`sluice_kernels`' `Matrix::int8_row`, whose matmul
//! folds the integers and multiplies each row's sum by its scale). Everything else (norms, convolution weights, KDA and
//! router parameters, AttnRes, the MXFP4 routed experts) is copied byte for byte: see
//! [`keeps_full_precision`] and `docs/INT8.md`, which also defines the rounding exactly. The
//! result is lossy and labelled so: `sluice-int8-manifest.json` names it.
//!
//! The output has the source's shard files, names and order, its index and its other files.
//! The conversion is deterministic (same source and options, same bytes), verified (each
//! written shard is re-read: header parsed, tensor data and file hashed), atomic per file
//! (written as `NAME.converting`, renamed once verified) and resumable: a progress journal
//! records each finished file, and a rerun skips files whose output still hashes to the
//! journal's record while their source keeps its size and modification time. The manifest is
//! written last; a directory without it is incomplete.

mod digest;
mod manifest;
mod quantize;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::DType;

pub use digest::hash_file;
use digest::hash_range;
pub(crate) use digest::hex;
pub use manifest::{
    default_output, is_converted, FileRecord, Int8Manifest, FORMAT_VERSION, INSTALL_MANIFEST,
    MANIFEST_FILE, MANIFEST_KIND,
};
pub use quantize::{
    keeps_full_precision, quantize_row, RowError, QUANTIZED_LAYER_SUFFIXES, SCALE_SUFFIX,
};
use sha2::{Digest, Sha256};

use crate::{read_header, write_index, Checkpoint, CheckpointError, ShardWriter, TensorEntry};
use crate::{TensorSpec, INDEX_FILE};
use manifest::{mtime_ns, Expected, Journal, JournalEntry, JOURNAL_FILE};

/// Architectures whose tensor names [`keeps_full_precision`] knows: Kimi K3 (and Kimi
/// Linear, its layout) and Qwen3 dense, whose projections use the same per-layer names.
pub const SUPPORTED_ARCHITECTURES: [&str; 3] =
    ["KimiK3ForConditionalGeneration", "KimiLinearForCausalLM", "Qwen3ForCausalLM"];

/// Choices of a conversion (recorded in the manifest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvertOptions {
    /// Also quantize the token embedding table (`model.embed_tokens.weight`).
    pub embeddings: bool,
}

/// What a conversion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertReport {
    /// Files (shards and copied files) written by this run.
    pub files_written: usize,
    /// Files kept from an earlier run (resume).
    pub files_reused: usize,
    /// Tensors stored as row-int8.
    pub tensors_quantized: usize,
    /// Tensors copied unchanged.
    pub tensors_kept: usize,
    /// Bytes of every source file read.
    pub source_bytes: u64,
    /// Bytes of every output file, the manifest excluded.
    pub output_bytes: u64,
    /// The manifest written last.
    pub manifest: PathBuf,
}

/// Why a conversion stopped. Every variant names the file (and tensor) involved.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Opening or validating the source checkpoint failed, or writing a file did.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// An operating-system I/O error on `path`.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The destination is the source directory.
    #[error("{dir}: the destination is the source directory")]
    SameDirectory {
        /// The directory.
        dir: PathBuf,
    },
    /// The source is itself a converted directory.
    #[error(
        "{dir}: already converted (it holds {MANIFEST_FILE}); convert the original checkpoint"
    )]
    AlreadyConverted {
        /// The source directory.
        dir: PathBuf,
    },
    /// The source is not an architecture the int8 roster knows.
    #[error("{dir}: architecture {arch:?} has no int8 spine roster (supported: {})", SUPPORTED_ARCHITECTURES.join(", "))]
    Unsupported {
        /// The source directory.
        dir: PathBuf,
        /// Its `architectures[0]`.
        arch: String,
    },
    /// A source file differs from its install manifest (`sluice-install.json`).
    #[error("{path}: {what} is {got}, but the install manifest says {expected}: corrupt or changed download")]
    SourceMismatch {
        /// The source file.
        path: PathBuf,
        /// `size` or `sha256`.
        what: &'static str,
        /// The manifest's value.
        expected: String,
        /// The file's value.
        got: String,
    },
    /// A manifest or journal cannot be read or written, or describes an unusable source.
    #[error("{path}: {reason}")]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor chosen for quantization is not a 2-D BF16 matrix, or its scale name is taken.
    #[error("{file}: tensor {tensor:?}: {reason}")]
    BadTensor {
        /// The shard file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A row cannot be quantized (non-finite values, or too large for an f16 scale).
    #[error("{file}: tensor {tensor:?} row {row}: {reason}")]
    Row {
        /// The shard file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The row.
        row: u64,
        /// What is wrong.
        reason: String,
    },
    /// A written file did not read back as written.
    #[error("{path}: verification after writing failed: {reason}")]
    Verify {
        /// The file as written (under its temporary name).
        path: PathBuf,
        /// What differed.
        reason: String,
    },
}

impl ConvertError {
    fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}

/// Converts the Kimi K3 or Qwen3 checkpoint in `src` into `dst` (created if missing; an interrupted
/// conversion there is resumed), calling `progress(done_bytes, total_bytes)` as source bytes
/// are processed. See the module docs for the format and guarantees.
pub fn convert_spine_int8(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<ConvertReport, ConvertError> {
    if src.join(MANIFEST_FILE).exists() {
        return Err(ConvertError::AlreadyConverted { dir: src.to_path_buf() });
    }
    let ckpt = Checkpoint::open(src)?;
    let arch = ckpt.config().architecture().to_owned();
    if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(ConvertError::Unsupported { dir: src.to_path_buf(), arch });
    }
    let expected = Expected::load(src)?;
    std::fs::create_dir_all(dst).map_err(|e| ConvertError::io(dst, e))?;
    let canon = |p: &Path| p.canonicalize().map_err(|e| ConvertError::io(p, e));
    if canon(src)? == canon(dst)? {
        return Err(ConvertError::SameDirectory { dir: dst.to_path_buf() });
    }
    // The directory is incomplete from here until the new manifest is written.
    remove_if_present(&dst.join(MANIFEST_FILE))?;
    // What an interrupted run left half-written is never resumed from (finished shards are,
    // through the journal); removing it first keeps the output from growing with each
    // interruption.
    crate::remove_stale_temps(dst, &[".converting"])?;
    let mut journal = Journal::load(dst, opts);

    let shards: Vec<String> = ckpt.shard_paths().iter().map(|p| file_name(p)).collect();
    let others = other_files(src, &shards)?;
    let size = |name: &String| std::fs::metadata(src.join(name)).map(|m| m.len());
    let mut total = 0u64;
    for name in shards.iter().chain(&others) {
        total += size(name).map_err(|e| ConvertError::io(src.join(name), e))?;
    }
    let mut done = 0u64;
    let mut tick = |n: u64| {
        done += n;
        progress(done, total);
    };
    let mut report = ConvertReport {
        files_written: 0,
        files_reused: 0,
        tensors_quantized: 0,
        tensors_kept: 0,
        source_bytes: 0,
        output_bytes: 0,
        manifest: dst.join(MANIFEST_FILE),
    };
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0u64;
    for (i, name) in shards.iter().enumerate() {
        let plan = plan_shard(&ckpt, i, opts)?;
        for spec in &plan.specs {
            weight_map.insert(spec.name.clone(), name.clone());
            total_size += spec.byte_len().unwrap_or(0);
        }
        let quantized = plan.tensors.iter().filter(|t| t.quantize).count();
        report.tensors_quantized += quantized;
        report.tensors_kept += plan.tensors.len() - quantized;
        let entry = reuse_or_write(&journal, src, dst, name, &mut report, &mut tick, |tick| {
            convert_shard(&ckpt, i, &plan, dst, &expected, tick)
        })?;
        expected.check_sha(src, &entry.source)?;
        journal.done.insert(name.clone(), entry);
        journal.save(dst)?;
    }
    for name in &others {
        let entry = reuse_or_write(&journal, src, dst, name, &mut report, &mut tick, |tick| {
            let entry = copy_file(src, dst, name, &expected)?;
            tick(entry.source.size);
            Ok(entry)
        })?;
        journal.done.insert(name.clone(), entry);
        journal.save(dst)?;
    }

    let names: Vec<&String> = shards.iter().chain(&others).collect();
    let entries: Vec<&JournalEntry> = names.iter().filter_map(|n| journal.done.get(*n)).collect();
    let mut source: Vec<FileRecord> = entries.iter().map(|e| e.source.clone()).collect();
    let mut output: Vec<FileRecord> = entries.iter().map(|e| e.output.clone()).collect();
    let mut quantized: Vec<String> = entries.iter().flat_map(|e| e.quantized.clone()).collect();
    if src.join(INDEX_FILE).is_file() {
        let index = write_index(dst, &weight_map, total_size)?;
        for (list, path) in [(&mut source, src.join(INDEX_FILE)), (&mut output, index)] {
            let (size, sha256) = hash_file(&path).map_err(|e| ConvertError::io(&path, e))?;
            list.push(FileRecord { name: INDEX_FILE.to_owned(), size, sha256 });
        }
    }
    source.sort_by(|a, b| a.name.cmp(&b.name));
    output.sort_by(|a, b| a.name.cmp(&b.name));
    quantized.sort();
    report.source_bytes = source.iter().map(|f| f.size).sum();
    report.output_bytes = output.iter().map(|f| f.size).sum();
    let manifest = Int8Manifest {
        format: FORMAT_VERSION,
        kind: MANIFEST_KIND.to_owned(),
        options: opts.clone(),
        source,
        output,
        quantized,
    };
    let value = serde_json::to_value(&manifest).map_err(|e| ConvertError::BadManifest {
        path: report.manifest.clone(),
        reason: e.to_string(),
    })?;
    for name in shards.iter().chain(&others) {
        // Left by an interrupted run whose file was finished later or by another route.
        remove_if_present(&dst.join(format!("{name}.converting")))?;
    }
    crate::write_json_atomic(&report.manifest, &value)?;
    Ok(report)
}

/// One source tensor and whether it is quantized.
struct Planned<'a> {
    entry: &'a TensorEntry,
    quantize: bool,
}

/// The tensors of one shard in file order, and the output tensors they become.
struct ShardPlan<'a> {
    tensors: Vec<Planned<'a>>,
    specs: Vec<TensorSpec>,
}

/// Plans shard `i`: which tensors are quantized (checked to be 2-D BF16 with a free scale
/// name) and the output tensor list.
fn plan_shard<'a>(
    ckpt: &'a Checkpoint,
    i: usize,
    opts: &ConvertOptions,
) -> Result<ShardPlan<'a>, ConvertError> {
    let mut entries: Vec<&TensorEntry> = ckpt.tensors().filter(|e| e.shard == i).collect();
    entries.sort_by_key(|e| e.offset);
    let mut plan = ShardPlan { tensors: Vec::new(), specs: Vec::new() };
    for entry in entries {
        let quantize = !keeps_full_precision(&entry.name)
            || (opts.embeddings && quantize::is_embedding(&entry.name));
        let bad = |reason: String| ConvertError::BadTensor {
            file: ckpt.shard_file(entry).to_path_buf(),
            tensor: entry.name.clone(),
            reason,
        };
        if quantize {
            if entry.dtype != DType::BF16 || entry.shape.len() != 2 {
                let got = format!("{} {:?}", entry.dtype, entry.shape);
                return Err(bad(format!("expected a 2-D BF16 matrix to quantize, found {got}")));
            }
            let scale = format!("{}{SCALE_SUFFIX}", entry.name);
            if ckpt.get(&scale).is_some() {
                return Err(bad(format!("its scale tensor name {scale:?} is already taken")));
            }
            plan.specs.push(TensorSpec::new(entry.name.clone(), DType::I8, entry.shape.clone()));
            plan.specs.push(TensorSpec::new(scale, DType::F16, [entry.shape[0]]));
        } else {
            plan.specs.push(TensorSpec::new(entry.name.clone(), entry.dtype, entry.shape.clone()));
        }
        plan.tensors.push(Planned { entry, quantize });
    }
    Ok(plan)
}

/// Rows quantized per write (bounds the buffer at a few MiB for K3's widest matrices).
const ROW_BATCH: usize = 256;
/// Bytes per write when copying a tensor.
const COPY_CHUNK: usize = 64 << 20;

/// Writes shard `i` of `ckpt` into `dst` under `NAME.converting`, verifies it, checks its
/// source against the install manifest, and renames it into place.
fn convert_shard(
    ckpt: &Checkpoint,
    i: usize,
    plan: &ShardPlan<'_>,
    dst: &Path,
    expected: &Expected,
    tick: &mut impl FnMut(u64),
) -> Result<JournalEntry, ConvertError> {
    let src_path = &ckpt.shard_paths()[i];
    let name = file_name(src_path);
    let mtime = mtime_ns(src_path)?;
    let tmp = dst.join(format!("{name}.converting"));
    let mut meta = ckpt.shard_metadata(i).cloned().unwrap_or_default();
    meta.insert("sluice_int8_spine".to_owned(), FORMAT_VERSION.to_string());
    let mut writer = ShardWriter::create(&tmp, plan.specs.clone(), Some(&meta))?;
    let mut file = File::open(src_path).map_err(|e| ConvertError::io(src_path, e))?;
    let file_len = file.metadata().map_err(|e| ConvertError::io(src_path, e))?.len();
    let (mut src_hash, mut data_hash) = (Sha256::new(), Sha256::new());
    let mut pos = 0u64;
    let mut quantized = Vec::new();
    for t in &plan.tensors {
        let e = t.entry;
        hash_range(&mut file, pos..e.offset, &mut src_hash)
            .map_err(|err| ConvertError::io(src_path, err))?;
        let bytes = ckpt.bytes(e);
        src_hash.update(bytes);
        if t.quantize && bytes.is_empty() {
            // A matrix with no elements: no values, and a zero scale per row (if any).
            let rows = usize::try_from(e.shape[0]).unwrap_or(0);
            writer.write_tensor(&e.name, &[])?;
            let zeros = vec![0u8; 2 * rows];
            writer.write_tensor(&format!("{}{SCALE_SUFFIX}", e.name), &zeros)?;
            data_hash.update(&zeros);
            quantized.push(e.name.clone());
        } else if t.quantize {
            let cols = usize::try_from(e.shape[1]).unwrap_or(usize::MAX);
            let mut q = vec![0u8; ROW_BATCH * cols];
            let mut scales = Vec::new();
            for (b, rows) in bytes.chunks(2 * cols * ROW_BATCH).enumerate() {
                let n = rows.len() / (2 * cols);
                for (r, (src_row, q_row)) in
                    rows.chunks_exact(2 * cols).zip(q.chunks_exact_mut(cols)).enumerate()
                {
                    let scale = quantize_row(src_row, q_row).map_err(|err| ConvertError::Row {
                        file: src_path.clone(),
                        tensor: e.name.clone(),
                        row: u64::try_from(b * ROW_BATCH + r).unwrap_or(u64::MAX),
                        reason: match err {
                            RowError::NonFinite => "holds a NaN or an infinity".to_owned(),
                            RowError::ScaleOverflow { absmax } => {
                                format!("largest magnitude {absmax:e} needs a scale beyond f16")
                            }
                        },
                    })?;
                    scales.extend_from_slice(&scale.to_le_bytes());
                }
                writer.write_tensor_chunk(&e.name, &q[..n * cols])?;
                data_hash.update(&q[..n * cols]);
            }
            writer.write_tensor(&format!("{}{SCALE_SUFFIX}", e.name), &scales)?;
            data_hash.update(&scales);
            quantized.push(e.name.clone());
        } else {
            for chunk in bytes.chunks(COPY_CHUNK) {
                writer.write_tensor_chunk(&e.name, chunk)?;
                data_hash.update(chunk);
            }
            if bytes.is_empty() {
                writer.write_tensor(&e.name, bytes)?;
            }
        }
        tick(e.len);
        pos = e.end();
    }
    hash_range(&mut file, pos..file_len, &mut src_hash)
        .map_err(|err| ConvertError::io(src_path, err))?;
    tick(file_len.saturating_sub(plan.tensors.iter().map(|t| t.entry.len).sum()));
    writer.finish()?;
    let output = verify(&tmp, &name, &plan.specs, data_hash.finalize().into())?;
    let source =
        FileRecord { name: name.clone(), size: file_len, sha256: hex(&src_hash.finalize()) };
    if let Err(e) = expected.check_sha(src_path.parent().unwrap_or(Path::new(".")), &source) {
        remove_if_present(&tmp)?;
        return Err(e);
    }
    rename_into_place(&tmp, &dst.join(&name))?;
    Ok(JournalEntry { source, source_mtime_ns: mtime, output, quantized })
}

/// Re-reads a written shard: its header must list `specs` in order, and its data section
/// must hash to `data_sha`. Returns the file's record under `name`.
fn verify(
    path: &Path,
    name: &str,
    specs: &[TensorSpec],
    data_sha: [u8; 32],
) -> Result<FileRecord, ConvertError> {
    let fail = |reason: String| ConvertError::Verify { path: path.to_path_buf(), reason };
    let header = read_header(path)?;
    let listed: Vec<TensorSpec> = header
        .tensors
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()))
        .collect();
    if listed != specs {
        return Err(fail("the header does not list the tensors written".to_owned()));
    }
    let mut file = File::open(path).map_err(|e| ConvertError::io(path, e))?;
    let (mut all, mut data) = (Sha256::new(), Sha256::new());
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| ConvertError::io(path, e))?;
        if n == 0 {
            break;
        }
        all.update(&buf[..n]);
        let skip =
            usize::try_from(header.data_offset.saturating_sub(at)).unwrap_or(usize::MAX).min(n);
        data.update(&buf[skip..n]);
        at += u64::try_from(n).unwrap_or(u64::MAX);
    }
    if at != header.file_len || <[u8; 32]>::from(data.finalize()) != data_sha {
        return Err(fail("the tensor data read back differs from the data written".to_owned()));
    }
    Ok(FileRecord { name: name.to_owned(), size: at, sha256: hex(&all.finalize()) })
}

/// Copies `src/name` to `dst/name` (through `name.converting`), hashing as it goes, re-reading
/// the copy, and checking the source against the install manifest.
fn copy_file(
    src: &Path,
    dst: &Path,
    name: &str,
    expected: &Expected,
) -> Result<JournalEntry, ConvertError> {
    let from = src.join(name);
    let tmp = dst.join(format!("{name}.converting"));
    let mtime = mtime_ns(&from)?;
    let mut input = File::open(&from).map_err(|e| ConvertError::io(&from, e))?;
    let mut out = File::create(&tmp).map_err(|e| ConvertError::io(&tmp, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = input.read(&mut buf).map_err(|e| ConvertError::io(&from, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| ConvertError::io(&tmp, e))?;
        size += u64::try_from(n).unwrap_or(u64::MAX);
    }
    out.sync_all().map_err(|e| ConvertError::io(&tmp, e))?;
    drop(out);
    let source = FileRecord { name: name.to_owned(), size, sha256: hex(&h.finalize()) };
    let (out_size, out_sha) = hash_file(&tmp).map_err(|e| ConvertError::io(&tmp, e))?;
    if out_size != size || out_sha != source.sha256 {
        return Err(ConvertError::Verify {
            path: tmp,
            reason: "the copy differs from its source".to_owned(),
        });
    }
    expected.check_sha(src, &source)?;
    rename_into_place(&tmp, &dst.join(name))?;
    Ok(JournalEntry {
        output: source.clone(),
        source,
        source_mtime_ns: mtime,
        quantized: Vec::new(),
    })
}

/// The journal's entry for `name` when it can stand: the source has the recorded size and
/// modification time, and the output exists with the recorded size and SHA-256.
/// The journal entry of file `name` (of `src`, written to `dst`): reused when the journal's
/// record still matches the source (size, mtime) and the output (size, SHA-256), else made by
/// `write`; counted as reused or written in `report`, its source bytes reported to `tick`
/// either way (`write` reports its own).
fn reuse_or_write<T: FnMut(u64)>(
    journal: &Journal,
    src: &Path,
    dst: &Path,
    name: &str,
    report: &mut ConvertReport,
    tick: &mut T,
    write: impl FnOnce(&mut T) -> Result<JournalEntry, ConvertError>,
) -> Result<JournalEntry, ConvertError> {
    if let Some(entry) = journal.done.get(name) {
        let from = src.join(name);
        let len = std::fs::metadata(&from).map_err(|e| ConvertError::io(&from, e))?.len();
        if len == entry.source.size && mtime_ns(&from)? == entry.source_mtime_ns {
            if let Ok((size, sha)) = hash_file(&dst.join(name)) {
                if size == entry.output.size && sha == entry.output.sha256 {
                    report.files_reused += 1;
                    tick(entry.source.size);
                    return Ok(entry.clone());
                }
            }
        }
    }
    report.files_written += 1;
    write(tick)
}

/// Files of `src` besides the shards that the output carries over: top-level regular files
/// (links followed), except the index (rewritten), install and conversion records, and
/// hidden files.
fn other_files(src: &Path, shards: &[String]) -> Result<Vec<String>, ConvertError> {
    let mut out = Vec::new();
    for item in std::fs::read_dir(src).map_err(|e| ConvertError::io(src, e))? {
        let item = item.map_err(|e| ConvertError::io(src, e))?;
        let name = item.file_name().to_string_lossy().into_owned();
        let skip = name.starts_with('.')
            || shards.contains(&name)
            || [INDEX_FILE, INSTALL_MANIFEST, MANIFEST_FILE, JOURNAL_FILE].contains(&name.as_str());
        if !skip && std::fs::metadata(item.path()).is_ok_and(|m| m.is_file()) {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Renames `from` to `to` and makes the rename durable (best effort on the directory).
fn rename_into_place(from: &Path, to: &Path) -> Result<(), ConvertError> {
    std::fs::rename(from, to).map_err(|e| ConvertError::io(to, e))?;
    if let Some(dir) = to.parent() {
        if let Ok(d) = File::open(dir) {
            // Some file systems refuse directory fsync; the data itself is already synced.
            let _ = d.sync_all();
        }
    }
    Ok(())
}

fn remove_if_present(path: &Path) -> Result<(), ConvertError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ConvertError::io(path, e)),
        _ => Ok(()),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
