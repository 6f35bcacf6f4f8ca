//! SHA-256 helpers for the conversion manifest and journal, on the `sha2` crate: whole files,
//! byte ranges of an open file, and the lowercase hex form the manifests store.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes read per call when hashing a file.
const CHUNK: usize = 1 << 20;

/// Lowercase hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    digest.iter().fold(String::with_capacity(2 * digest.len()), |mut s, b| {
        // Writing into a String cannot fail.
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Size and SHA-256 (hex) of the file at `path`, read in 1 MiB pieces.
pub fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += u64::try_from(n).unwrap_or(u64::MAX);
    }
    Ok((size, hex(&h.finalize())))
}

/// Feeds bytes `range` of `file` into `h`; a file shorter than the range is an error
/// (`UnexpectedEof`).
pub(super) fn hash_range(
    file: &mut File,
    range: std::ops::Range<u64>,
    h: &mut Sha256,
) -> std::io::Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    file.seek(SeekFrom::Start(range.start))?;
    let mut left = range.end - range.start;
    let mut buf = vec![0u8; usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK)];
    while left > 0 {
        let n = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        file.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= u64::try_from(n).unwrap_or(left);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn file_and_range_hashes_match_known_digests() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::File::create(&path).and_then(|mut f| f.write_all(b"xxabcyy")).expect("write");
        // FIPS 180-2 test vector for "abc".
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let mut h = Sha256::new();
        hash_range(&mut File::open(&path).expect("open"), 2..5, &mut h).expect("range");
        assert_eq!(hex(&h.finalize()), abc);
        let (size, whole) = hash_file(&path).expect("hash");
        assert_eq!(size, 7);
        assert_eq!(whole, hex(&Sha256::digest(b"xxabcyy")));
        let mut h = Sha256::new();
        let err = hash_range(&mut File::open(&path).expect("open"), 5..9, &mut h);
        assert_eq!(err.map_err(|e| e.kind()), Err(std::io::ErrorKind::UnexpectedEof));
    }
}
