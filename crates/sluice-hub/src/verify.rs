//! Verifying an install against its manifest (`sluice-install.json`): every file that the
//! manifest records as fully installed is re-hashed (SHA-256, the hash `sluice pull` checked
//! when it downloaded the file) and its length compared; every locally present range of a
//! stream-mode shard is re-hashed against the range's recorded SHA-256. This catches any
//! flipped byte, not just structural damage.

use crate::download::hex;
use crate::manifest::{FileState, InstallManifest};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes read per hashing step.
const CHUNK: usize = 4 << 20;

/// The verdict on one file of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashCheck {
    /// Path inside the model directory.
    pub file: String,
    /// Bytes hashed.
    pub bytes: u64,
    /// What is wrong with it, `None` when it matches the manifest.
    pub problem: Option<String>,
}

/// Bytes [`verify_install`] will hash for `m` (for a progress bar).
pub fn bytes_to_hash(m: &InstallManifest) -> u64 {
    m.files
        .iter()
        .map(|f| match (&f.state, &f.stream) {
            (FileState::Full, _) => f.size,
            (FileState::Stream, Some(s)) => s.ranges.iter().map(|r| r.end - r.start).sum(),
            _ => 0,
        })
        .sum()
}

/// Re-hashes every installed file of `m` under `dir`, calling `progress(bytes)` as it goes.
pub fn verify_install(
    dir: &Path,
    m: &InstallManifest,
    progress: &mut dyn FnMut(u64),
) -> Vec<HashCheck> {
    let mut out = Vec::with_capacity(m.files.len());
    for f in &m.files {
        let mut check = HashCheck { file: f.path.clone(), bytes: 0, problem: None };
        match (&f.state, &f.stream) {
            (FileState::Pending, _) => {
                check.problem = Some("not installed (the manifest says pending)".into());
            }
            (FileState::Full, _) => {
                let path = dir.join(&f.path);
                match hash_range(&path, 0, None, progress) {
                    Err(e) => check.problem = Some(format!("cannot read: {e}")),
                    Ok((n, _)) if n != f.size => {
                        check.bytes = n;
                        check.problem = Some(format!(
                            "truncated or extended: {n} bytes, the manifest records {}",
                            f.size
                        ));
                    }
                    Ok((n, got)) => {
                        check.bytes = n;
                        match &f.sha256 {
                            Some(want) if *want != got => {
                                check.problem = Some(format!(
                                    "altered: SHA-256 {got}, the manifest records {want}"
                                ));
                            }
                            Some(_) => {}
                            None => check.problem = Some("the manifest records no SHA-256".into()),
                        }
                    }
                }
            }
            (FileState::Stream, None) => {
                check.problem = Some("stream shard without its range record".into());
            }
            (FileState::Stream, Some(s)) => {
                let path = dir.join(&s.sparse);
                for r in &s.ranges {
                    match hash_range(&path, r.start, Some(r.end - r.start), progress) {
                        Err(e) => check.problem = Some(format!("cannot read: {e}")),
                        Ok((n, _)) if n != r.end - r.start => {
                            check.problem = Some(format!(
                                "truncated: bytes {}..{} are not all present",
                                r.start, r.end
                            ));
                        }
                        Ok((n, got)) => {
                            check.bytes += n;
                            if got != r.sha256 {
                                check.problem = Some(format!(
                                    "altered: bytes {}..{} hash to {got}, the manifest records {}",
                                    r.start, r.end, r.sha256
                                ));
                            }
                        }
                    }
                    if check.problem.is_some() {
                        break;
                    }
                }
            }
        }
        out.push(check);
    }
    out
}

/// SHA-256 of `len` bytes of `path` from `start` (to the end when `None`): (bytes, hex).
fn hash_range(
    path: &Path,
    start: u64,
    len: Option<u64>,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<(u64, String)> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(start))?;
    let mut r = f.take(len.unwrap_or(u64::MAX));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
    Ok((total, hex(&h.finalize())))
}
