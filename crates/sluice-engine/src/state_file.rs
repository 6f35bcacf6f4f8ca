//! One file of the on-disk prompt-state cache ([`crate::state_cache`]): its layout, its key, the
//! model fingerprint it carries, and the checks that refuse a file that is not exactly what a
//! prompt needs.
//!
//! ```text
//! header (88 bytes):  "SLUICEST" · u32 file version · [32] model fingerprint
//!                     · u64 token count n · [32] prefix key · u32 flags (bit 0: logits)
//! body:               u32[n] the prefix's token ids
//!                     · (with logits) u64 v · f32[v] logits predicting position n
//!                     · the state snapshot (`StateSnapshot::encode`)
//! trailer:            [32] SHA-256 of every byte before it
//! ```
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

use sha2::{Digest, Sha256};
use sluice_models::{SnapshotCodecError, StateShape, StateSnapshot, SNAPSHOT_FORMAT_VERSION};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The first bytes of every state file.
const MAGIC: [u8; 8] = *b"SLUICEST";
/// Version of the file layout above; a file of another version is refused.
pub const STATE_FILE_VERSION: u32 = 1;
/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32 + 4;
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
    /// The checksum does not match.
    #[error("checksum mismatch (the file is corrupt)")]
    Checksum,
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

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what passes through it.
struct HashingRead<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for HashingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes a complete state file to `path` (a temporary name: the caller renames it) and
/// fsyncs it; returns the bytes written.
pub(crate) fn write_file(
    path: &Path,
    fingerprint: &[u8; 32],
    tokens: &[u32],
    logits: Option<&[f32]>,
    snap: &StateSnapshot,
) -> std::io::Result<u64> {
    let file = std::fs::File::create(path)?;
    let mut w =
        Hashing { inner: BufWriter::with_capacity(1 << 20, file), hash: Sha256::new(), bytes: 0 };
    w.write_all(&MAGIC)?;
    w.write_all(&STATE_FILE_VERSION.to_le_bytes())?;
    w.write_all(fingerprint)?;
    w.write_all(&(tokens.len() as u64).to_le_bytes())?;
    w.write_all(&prefix_key(fingerprint, tokens).0)?;
    w.write_all(&(if logits.is_some() { HAS_LOGITS } else { 0 }).to_le_bytes())?;
    for t in tokens {
        w.write_all(&t.to_le_bytes())?;
    }
    if let Some(l) = logits {
        w.write_all(&(l.len() as u64).to_le_bytes())?;
        for x in l {
            w.write_all(&x.to_bits().to_le_bytes())?;
        }
    }
    snap.encode(&mut w)?;
    let sum: [u8; 32] = w.hash.clone().finalize().into();
    let bytes = w.bytes + 32;
    let mut inner = w.inner;
    inner.write_all(&sum)?;
    let file = inner.into_inner().map_err(std::io::IntoInnerError::into_error)?;
    file.sync_all()?;
    Ok(bytes)
}

/// Parses a header.
fn parse_header(b: &[u8; HEADER_LEN]) -> Result<Header, Refusal> {
    if b[..8] != MAGIC {
        return Err(Refusal::Magic);
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let version = u32_at(8);
    if version != STATE_FILE_VERSION {
        return Err(Refusal::Version(version));
    }
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(&b[12..44]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&b[44..52]);
    let mut key = [0u8; 32];
    key.copy_from_slice(&b[52..84]);
    Ok(Header {
        fingerprint,
        tokens: u64::from_le_bytes(n),
        key: Key(key),
        logits: u32_at(84) & HAS_LOGITS != 0,
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

/// Reads the file at `path`, refusing it unless every check passes: header, fingerprint,
/// prefix (key and ids), state shape, length, and the checksum over the whole file.
pub(crate) fn read_file(path: &Path, want: &Expect<'_>) -> Result<Contents, Refusal> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut r = HashingRead { inner: BufReader::with_capacity(1 << 20, file), hash: Sha256::new() };
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb)?;
    let h = parse_header(&hb)?;
    if h.fingerprint != *want.fingerprint {
        return Err(Refusal::OtherModel);
    }
    if h.key != want.key || h.tokens != want.tokens.len() as u64 {
        return Err(Refusal::OtherPrefix);
    }
    // Nothing below allocates more than the file holds.
    let mut left = size.checked_sub(HEADER_LEN as u64 + 32).ok_or(Refusal::Truncated)?;
    let mut take = |n: u64| -> Result<(), Refusal> {
        left = left.checked_sub(n).ok_or(Refusal::Truncated)?;
        Ok(())
    };
    take(4 * h.tokens)?;
    let mut b4 = [0u8; 4];
    for &t in want.tokens {
        r.read_exact(&mut b4)?;
        if u32::from_le_bytes(b4) != t {
            return Err(Refusal::OtherPrefix);
        }
    }
    let logits = if h.logits {
        let mut b8 = [0u8; 8];
        take(8)?;
        r.read_exact(&mut b8)?;
        let n = u64::from_le_bytes(b8);
        if n != want.vocab as u64 {
            return Err(Refusal::Logits { got: n, want: want.vocab });
        }
        take(4 * n)?;
        let mut l = Vec::with_capacity(want.vocab);
        for _ in 0..n {
            r.read_exact(&mut b4)?;
            l.push(f32::from_bits(u32::from_le_bytes(b4)));
        }
        Some(l)
    } else {
        None
    };
    let snap = StateSnapshot::decode(&mut r, want.shape, left)?;
    if snap.len() != want.tokens.len() {
        return Err(Refusal::OtherPrefix);
    }
    let sum: [u8; 32] = r.hash.clone().finalize().into();
    let mut stored = [0u8; 32];
    r.inner.read_exact(&mut stored)?;
    if stored != sum {
        return Err(Refusal::Checksum);
    }
    let trailing = std::io::copy(&mut r.inner.take(1 << 20), &mut std::io::sink())?;
    if trailing > 0 {
        return Err(Refusal::Trailing(trailing));
    }
    Ok(Contents { snap, logits, bytes: size })
}
