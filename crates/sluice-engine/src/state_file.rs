//! One file of the on-disk prompt-state cache ([`crate::state_cache`]): its layout, its key, the
//! model fingerprint it carries, and the checks that refuse a file that is not exactly what a
//! prompt needs.
//!
//! ```text
//! header (100 bytes): "SLUICEST" · u32 file version · [32] model fingerprint
//!                     · u64 token count n · [32] prefix key · u32 flags (bit 0: logits)
//!                     · u32 chunk bytes C · u64 body bytes B
//! body (B bytes):     u32[n] the prefix's token ids
//!                     · (with logits) u64 v · f32[v] logits predicting position n
//!                     · u64 m · the snapshot's layout [m bytes] · the snapshot's arrays
//!                       (`StateSnapshot::layout_bytes`, `StateSnapshot::array_pieces`)
//! chunk table:        [32] SHA-256 of each C-byte chunk of the body, ⌈B / C⌉ of them
//! trailer:            [32] SHA-256 of the header and the chunk table
//! ```
//!
//! The chunks are what lets a state move at disk speed ([`crate::state_chunks`]): they are
//! hashed on every thread of the kernel pool while the body is written, and checked on every
//! thread while it is read straight into the restored state's arrays. A file is used only when
//! its header and table match the trailer and every chunk matches its entry; a chunk that does
//! not is named in the refusal. Version 1 (one SHA-256 over the whole file, the snapshot's
//! layout interleaved with its arrays) is refused by its version, and a version-1 file's
//! fingerprint differs too, so it is never even looked up.
//!
//! The **prefix key** is SHA-256 over a domain tag, the fingerprint and the prefix's ids
//! (little-endian u32): a running hash, so the keys of every prefix length of a prompt come from
//! one pass over it ([`prefix_keys`]). The file still stores the ids and a read compares them with
//! the prompt, so even a hash collision cannot restore the wrong state.
//!
//! The **fingerprint** ([`model_fingerprint`]) names the numerics a state depends on: the
//! sluice state format versions, the spine precision the model runs at, the checkpoint's
//! `config.json`, and its weights — by the pinned hub commit when `sluice-install.json` records a
//! complete install (the hub verified every file against it), otherwise by each `*.safetensors`
//! file's name, size and modification time. Hashing the weights themselves would read the whole
//! model (1.45 TB for Kimi K3) at every start; names, sizes and times change whenever a file is
//! replaced or rewritten, and a false change only costs a recomputation.

use crate::state_chunks::{self, chunk_count, ChunkError, ChunkHash, Piece, CHUNK_BYTES};
use sha2::{Digest, Sha256};
use sluice_models::snapshot::{from_le_in_place, le_bytes};
use sluice_models::{SnapshotCodecError, StateShape, StateSnapshot, SNAPSHOT_FORMAT_VERSION};
use std::borrow::Cow;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The first bytes of every state file.
const MAGIC: [u8; 8] = *b"SLUICEST";
/// Version of the file layout above; a file of another version is refused.
pub const STATE_FILE_VERSION: u32 = 2;
/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32 + 4 + 4 + 8;
/// Smallest and largest chunk a file may declare (this sluice writes [`CHUNK_BYTES`]).
const CHUNK_RANGE: std::ops::RangeInclusive<usize> = 4096..=(1 << 30);
/// Most bytes of snapshot layout a file may declare (Kimi K3's 93 layers take 2 KB).
const MAX_LAYOUT: u64 = 1 << 20;
/// Header flag: the file holds the logits predicting the next position.
const HAS_LOGITS: u32 = 1;

/// A prefix key (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// The key in hex (the file's name is `HEX.state`).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The header of a state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) fingerprint: [u8; 32],
    pub(crate) tokens: u64,
    pub(crate) key: Key,
    pub(crate) logits: bool,
    /// Bytes of each chunk of the body.
    pub(crate) chunk: usize,
    /// Bytes of the body.
    pub(crate) body: u64,
}

/// Why a state file was not used.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Not a state file.
    #[error("not a sluice state file (bad magic)")]
    Magic,
    /// Written by a sluice with another file layout.
    #[error("state file version {0}, this sluice reads version {STATE_FILE_VERSION}")]
    Version(u32),
    /// Written for another model, another spine precision or another state format.
    #[error("the file is for another model or state format (fingerprint differs)")]
    OtherModel,
    /// The header does not name the prefix asked for.
    #[error("the file's prefix differs from the one asked for")]
    OtherPrefix,
    /// Shorter than its contents say.
    #[error("the file is truncated")]
    Truncated,
    /// Longer than its contents say.
    #[error("the file has {0} bytes past its checksum")]
    Trailing(u64),
    /// The header or the chunk table does not match the trailer.
    #[error("the header or chunk table fails its checksum (the file is corrupt)")]
    TableChecksum,
    /// A chunk of the body does not match its checksum.
    #[error(
        "chunk {chunk} of {chunks} (body bytes {start}..{end}) fails its checksum (the file is \
         corrupt)"
    )]
    Checksum {
        /// The first chunk that differs (from 0).
        chunk: u64,
        /// Chunks in the file.
        chunks: u64,
        /// Where it starts in the body.
        start: u64,
        /// Where it ends in the body.
        end: u64,
    },
    /// The header declares a chunk size this sluice does not read.
    #[error("the file declares chunks of {0} bytes")]
    ChunkSize(u64),
    /// The logits are not the model's vocabulary's width.
    #[error("the file's logits have {got} values, the model's vocabulary {want}")]
    Logits {
        /// Values in the file.
        got: u64,
        /// The vocabulary.
        want: usize,
    },
    /// The state does not fit this model.
    #[error("{0}")]
    Codec(SnapshotCodecError),
    /// Reading failed.
    #[error("reading the file: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Self::Truncated
        } else {
            Self::Io(e)
        }
    }
}

impl From<SnapshotCodecError> for Refusal {
    fn from(e: SnapshotCodecError) -> Self {
        match e {
            SnapshotCodecError::Io(io) => io.into(),
            other => Self::Codec(other),
        }
    }
}

/// The running hash behind prefix keys, seeded with the fingerprint.
fn key_hasher(fingerprint: &[u8; 32]) -> Sha256 {
    let mut h = Sha256::new();
    h.update(b"sluice prompt-state prefix\0");
    h.update(fingerprint);
    h
}

/// The keys of `prompt`'s prefixes of the given lengths (ascending; lengths past the prompt
/// are skipped), from one pass over the prompt.
pub(crate) fn prefix_keys(
    fingerprint: &[u8; 32],
    prompt: &[u32],
    lengths: impl IntoIterator<Item = usize>,
) -> Vec<(usize, Key)> {
    let mut h = key_hasher(fingerprint);
    let mut done = 0;
    let mut out = Vec::new();
    for n in lengths {
        if n > prompt.len() || n < done {
            continue;
        }
        for t in &prompt[done..n] {
            h.update(t.to_le_bytes());
        }
        done = n;
        out.push((n, Key(h.clone().finalize().into())));
    }
    out
}

/// The key of exactly `tokens` for a model with `fingerprint`.
pub fn prefix_key(fingerprint: &[u8; 32], tokens: &[u32]) -> Key {
    prefix_keys(fingerprint, tokens, [tokens.len()])[0].1
}

/// The fingerprint of the model in `dir` run with `numerics` (e.g. the spine precision); see
/// the module docs.
pub fn model_fingerprint(dir: &Path, numerics: &str) -> std::io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    h.update(b"sluice model fingerprint\0");
    h.update(SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    h.update(STATE_FILE_VERSION.to_le_bytes());
    h.update((numerics.len() as u64).to_le_bytes());
    h.update(numerics.as_bytes());
    let config = std::fs::read(dir.join("config.json"))?;
    h.update((config.len() as u64).to_le_bytes());
    h.update(&config);
    let pinned = std::fs::read(dir.join("sluice-install.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter(|m| m["complete"] == serde_json::Value::Bool(true))
        .and_then(|m| Some(format!("{}@{}", m["repo"].as_str()?, m["commit"].as_str()?)));
    if let Some(p) = pinned {
        h.update(b"pinned\0");
        h.update(p.as_bytes());
        return Ok(h.finalize().into());
    }
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            let md = e.metadata()?;
            let mtime = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            files.push((name, md.len(), mtime));
        }
    }
    files.sort();
    for (name, len, mtime) in files {
        h.update(b"file\0");
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(len.to_le_bytes());
        h.update(mtime.to_le_bytes());
    }
    Ok(h.finalize().into())
}

/// `v`'s little-endian bytes.
fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Bytes of the file [`write_file`] writes for `tokens`, `logits` and `snap`.
pub(crate) fn file_len(tokens: usize, logits: Option<usize>, snap: &StateSnapshot) -> u64 {
    let body =
        4 * tokens as u64 + logits.map_or(0, |v| 8 + 4 * v as u64) + 8 + snap.encoded_len() as u64;
    HEADER_LEN as u64 + body + 32 * chunk_count(body, CHUNK_BYTES) + 32
}

/// Writes a complete state file to `path` (a temporary name: the caller renames it) and
/// fsyncs it; returns the bytes written. The body goes out in large sequential writes straight
/// from the snapshot's arrays while its chunks hash on the current kernel pool.
pub(crate) fn write_file(
    path: &Path,
    fingerprint: &[u8; 32],
    tokens: &[u32],
    logits: Option<&[f32]>,
    snap: &StateSnapshot,
) -> std::io::Result<u64> {
    write_chunked(path, fingerprint, tokens, logits, snap, CHUNK_BYTES)
}

/// [`write_file`] with chunks of `chunk` bytes.
pub(crate) fn write_chunked(
    path: &Path,
    fingerprint: &[u8; 32],
    tokens: &[u32],
    logits: Option<&[f32]>,
    snap: &StateSnapshot,
    chunk: usize,
) -> std::io::Result<u64> {
    let ids = u32_bytes(tokens);
    let layout = snap.layout_bytes()?;
    let (v8, m8) = (logits.map_or(0, <[f32]>::len) as u64, layout.len() as u64);
    let (v8, m8) = (v8.to_le_bytes(), m8.to_le_bytes());
    let mut pieces: Vec<Cow<'_, [u8]>> = vec![Cow::Borrowed(&ids)];
    if let Some(l) = logits {
        pieces.extend([Cow::Borrowed(&v8[..]), le_bytes(l)]);
    }
    pieces.extend([Cow::Borrowed(&m8[..]), Cow::Borrowed(&layout[..])]);
    pieces.extend(snap.array_pieces().into_iter().map(le_bytes));
    let pieces: Vec<&[u8]> = pieces.iter().map(|p| &**p).collect();
    let body: u64 = pieces.iter().map(|p| p.len() as u64).sum();
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&STATE_FILE_VERSION.to_le_bytes());
    header.extend_from_slice(fingerprint);
    header.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    header.extend_from_slice(&prefix_key(fingerprint, tokens).0);
    header.extend_from_slice(&(if logits.is_some() { HAS_LOGITS } else { 0 }).to_le_bytes());
    let chunk32 = u32::try_from(chunk).map_err(|_| std::io::Error::other("chunk over u32"))?;
    header.extend_from_slice(&chunk32.to_le_bytes());
    header.extend_from_slice(&body.to_le_bytes());
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    w.write_all(&header)?;
    let table = state_chunks::write_hashed(&mut w, &pieces, chunk)?;
    let mut sum = Sha256::new();
    sum.update(&header);
    for h in &table {
        w.write_all(h)?;
        sum.update(h);
    }
    w.write_all(&sum.finalize())?;
    let file = w.into_inner().map_err(std::io::IntoInnerError::into_error)?;
    file.sync_all()?;
    Ok(HEADER_LEN as u64 + body + 32 * table.len() as u64 + 32)
}

/// Parses a header.
fn parse_header(b: &[u8; HEADER_LEN]) -> Result<Header, Refusal> {
    if b[..8] != MAGIC {
        return Err(Refusal::Magic);
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(v)
    };
    let version = u32_at(8);
    if version != STATE_FILE_VERSION {
        return Err(Refusal::Version(version));
    }
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(&b[12..44]);
    let mut key = [0u8; 32];
    key.copy_from_slice(&b[52..84]);
    let chunk = u32_at(88) as usize;
    if !CHUNK_RANGE.contains(&chunk) {
        return Err(Refusal::ChunkSize(u64::from(u32_at(88))));
    }
    Ok(Header {
        fingerprint,
        tokens: u64_at(44),
        key: Key(key),
        logits: u32_at(84) & HAS_LOGITS != 0,
        chunk,
        body: u64_at(92),
    })
}

/// Reads just the header of the file at `path`.
pub(crate) fn read_header(path: &Path) -> Result<Header, Refusal> {
    let mut b = [0u8; HEADER_LEN];
    std::fs::File::open(path)?.read_exact(&mut b)?;
    parse_header(&b)
}

/// What a read must find.
pub(crate) struct Expect<'a> {
    pub(crate) fingerprint: &'a [u8; 32],
    pub(crate) key: Key,
    pub(crate) tokens: &'a [u32],
    pub(crate) shape: &'a StateShape,
    pub(crate) vocab: usize,
}

/// A state file's contents.
pub(crate) struct Contents {
    pub(crate) snap: StateSnapshot,
    pub(crate) logits: Option<Vec<f32>>,
    pub(crate) bytes: u64,
}

/// Counts down the body bytes a read may still take: nothing is allocated past them.
struct Budget(u64);

impl Budget {
    fn take(&mut self, n: u64) -> Result<u64, Refusal> {
        self.0 = self.0.checked_sub(n).ok_or(Refusal::Truncated)?;
        Ok(n)
    }
}

fn read_u64(r: &mut impl Read) -> Result<u64, Refusal> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// The body's parts before the state's arrays, read and checked against what the read must find.
struct Preamble {
    ids: Vec<u8>,
    v8: [u8; 8],
    logits: Option<Vec<f32>>,
    m: u64,
    layout: Vec<u8>,
    plan: sluice_models::SnapshotLayout,
}

/// Reads the preamble from `file` (positioned at the body's start).
fn read_preamble(
    file: &mut std::fs::File,
    h: &Header,
    want: &Expect<'_>,
) -> Result<Preamble, Refusal> {
    let mut left = Budget(h.body);
    let n = left.take(4 * h.tokens)?;
    let mut ids = vec![0u8; usize::try_from(n).map_err(|_| Refusal::Truncated)?];
    file.read_exact(&mut ids)?;
    if ids != u32_bytes(want.tokens) {
        return Err(Refusal::OtherPrefix);
    }
    let mut v8 = [0u8; 8];
    let mut logits = None;
    if h.logits {
        left.take(8)?;
        file.read_exact(&mut v8)?;
        let v = u64::from_le_bytes(v8);
        if v != want.vocab as u64 {
            return Err(Refusal::Logits { got: v, want: want.vocab });
        }
        left.take(4 * v)?;
        let mut l = vec![0f32; want.vocab];
        file.read_exact(bytemuck::cast_slice_mut(&mut l))?;
        logits = Some(l);
    }
    left.take(8)?;
    let m = read_u64(file)?;
    if m > MAX_LAYOUT {
        return Err(Refusal::Codec(SnapshotCodecError::Mismatch(format!(
            "a snapshot layout of {m} bytes"
        ))));
    }
    let mut layout = vec![0u8; usize::try_from(left.take(m)?).map_err(|_| Refusal::Truncated)?];
    file.read_exact(&mut layout)?;
    let mut rest = &layout[..];
    let plan = StateSnapshot::read_layout(&mut rest, want.shape, m + left.0)?;
    if !rest.is_empty() {
        return Err(Refusal::Codec(SnapshotCodecError::Mismatch(format!(
            "{} bytes after the snapshot layout",
            rest.len()
        ))));
    }
    if plan.positions() != want.tokens.len() {
        return Err(Refusal::OtherPrefix);
    }
    // A layout that does not describe the rest of the body exactly is refused.
    match plan.array_bytes().cmp(&left.0) {
        std::cmp::Ordering::Less => return Err(Refusal::Trailing(left.0 - plan.array_bytes())),
        std::cmp::Ordering::Greater => return Err(Refusal::Truncated),
        std::cmp::Ordering::Equal => {}
    }
    Ok(Preamble { ids, v8, logits, m, layout, plan })
}

/// After the preamble was refused: the first of the chunks it was read from that fails its
/// checksum, as the refusal to give instead (a damaged file is named as such, by chunk, rather
/// than as a file of another prefix or shape).
fn bad_chunk_before(file: &mut std::fs::File, h: &Header, table: &[ChunkHash]) -> Option<Refusal> {
    let read = file.stream_position().ok()?.checked_sub(HEADER_LEN as u64)?;
    let c = h.chunk as u64;
    let mut buf = Vec::new();
    for (k, want) in (0..).zip(table.iter().take(usize::try_from(read / c + 1).ok()?)) {
        let len = usize::try_from(c.min(h.body - k * c)).ok()?;
        buf.resize(len, 0);
        file.seek(SeekFrom::Start(HEADER_LEN as u64 + k * c)).ok()?;
        file.read_exact(&mut buf).ok()?;
        if Sha256::digest(&buf)[..] != want[..] {
            let chunks = table.len() as u64;
            return Some(Refusal::Checksum {
                chunk: k,
                chunks,
                start: k * c,
                end: (k * c + c).min(h.body),
            });
        }
    }
    None
}

/// Reads the file at `path`, refusing it unless every check passes: header, fingerprint,
/// prefix (key and ids), size, the trailer over header and chunk table, state shape, and every
/// chunk's checksum (checked on the current kernel pool while the body is read).
pub(crate) fn read_file(path: &Path, want: &Expect<'_>) -> Result<Contents, Refusal> {
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut hb = [0u8; HEADER_LEN];
    file.read_exact(&mut hb)?;
    let h = parse_header(&hb)?;
    if h.fingerprint != *want.fingerprint {
        return Err(Refusal::OtherModel);
    }
    if h.key != want.key || h.tokens != want.tokens.len() as u64 {
        return Err(Refusal::OtherPrefix);
    }
    // The size the header implies, checked before anything is allocated from it.
    let chunks = chunk_count(h.body, h.chunk);
    let want_size = chunks
        .checked_add(1)
        .and_then(|c| c.checked_mul(32))
        .and_then(|t| t.checked_add(h.body))
        .and_then(|t| t.checked_add(HEADER_LEN as u64))
        .ok_or(Refusal::Truncated)?;
    if size < want_size {
        return Err(Refusal::Truncated);
    }
    if size > want_size {
        return Err(Refusal::Trailing(size - want_size));
    }
    let table_bytes = usize::try_from(32 * (chunks + 1)).map_err(|_| Refusal::Truncated)?;
    let mut table = vec![0u8; table_bytes];
    file.seek(SeekFrom::Start(HEADER_LEN as u64 + h.body))?;
    file.read_exact(&mut table)?;
    let (table, trailer) = table.split_at(table_bytes - 32);
    let mut sum = Sha256::new();
    sum.update(hb);
    sum.update(table);
    if sum.finalize()[..] != *trailer {
        return Err(Refusal::TableChecksum);
    }
    let table: Vec<ChunkHash> = table
        .chunks_exact(32)
        .map(|c| c.try_into().expect("invariant: chunks_exact(32)"))
        .collect();
    file.seek(SeekFrom::Start(HEADER_LEN as u64))?;
    let Preamble { ids, v8, mut logits, m, layout, plan } = match read_preamble(&mut file, &h, want)
    {
        Ok(p) => p,
        Err(why) => return Err(bad_chunk_before(&mut file, &h, &table).unwrap_or(why)),
    };
    let mut arrays = plan.alloc();
    {
        let m8 = m.to_le_bytes();
        let mut pieces = vec![Piece::Done(&ids)];
        if let Some(l) = &logits {
            pieces.extend([Piece::Done(&v8), Piece::Done(bytemuck::cast_slice(l))]);
        }
        pieces.extend([Piece::Done(&m8), Piece::Done(&layout)]);
        for a in &mut arrays {
            let v = std::sync::Arc::get_mut(a).expect("invariant: just allocated, not shared");
            pieces.push(Piece::Fill(bytemuck::cast_slice_mut(v)));
        }
        state_chunks::read_checked(&mut file, pieces, h.chunk, &table).map_err(|e| match e {
            ChunkError::Io(e) => e.into(),
            ChunkError::Mismatch(k) => {
                let k = k as u64;
                let c = h.chunk as u64;
                Refusal::Checksum { chunk: k, chunks, start: k * c, end: ((k + 1) * c).min(h.body) }
            }
        })?;
    }
    if let Some(l) = &mut logits {
        from_le_in_place(l);
    }
    let snap = plan.assemble(arrays)?;
    Ok(Contents { snap, logits, bytes: size })
}

#[cfg(test)]
#[path = "state_file_tests.rs"]
mod tests;
