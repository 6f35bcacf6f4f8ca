//! Giving a file range's blocks back to the file system while the file keeps its length: the
//! stream install's expert disk cache evicts an expert by punching its bytes out of the sparse
//! shard ([`crate::remote`]). Afterwards the range reads as zeros.
//!
//! - **Linux**: `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`, any offset and length
//!   (partial blocks at the ends are zeroed by the kernel).
//! - **macOS** (APFS): `fcntl(F_PUNCHHOLE)`, whose offset and length must be multiples of the
//!   file system block. The whole blocks inside the range are punched; the partial blocks at
//!   its ends hold a neighbouring tensor's bytes too, so only this range's part of them is
//!   overwritten with zeros, as Linux does.

use std::fs::File;
use std::io;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/holes.rs has no hole-punching version for this OS (Linux uses \
     fallocate(PUNCH_HOLE), macOS fcntl(F_PUNCHHOLE)): the expert disk cache cannot give \
     space back without one"
);

/// Returns the blocks of `offset .. offset + len` of `file` (open for writing) to the file
/// system; the file keeps its length and the range reads as zeros.
#[cfg(target_os = "linux")]
pub fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (off, n) = super::off_pair(offset, len)?;
    // SAFETY: `fallocate` only reads its integer arguments; the descriptor is open for the
    // lifetime of `file`. Punching a hole changes file contents, never memory we hold.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Returns the blocks of `offset .. offset + len` of `file` (open for writing) to the file
/// system; the file keeps its length and the range reads as zeros.
#[cfg(target_os = "macos")]
pub fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, MetadataExt};
    let end = offset.checked_add(len).ok_or(io::ErrorKind::InvalidInput)?;
    let block = file.metadata()?.blksize().max(1);
    let (inner_start, inner_end) = (offset.div_ceil(block) * block, end / block * block);
    let zeros = |from: u64, to: u64| -> io::Result<()> {
        if to > from {
            let n = usize::try_from(to - from).map_err(|_| io::ErrorKind::InvalidInput)?;
            file.write_all_at(&vec![0u8; n], from)?;
        }
        Ok(())
    };
    if inner_end <= inner_start {
        // No whole block inside the range.
        return zeros(offset, end);
    }
    let (off, n) = super::off_pair(inner_start, inner_end - inner_start)?;
    let args = libc::fpunchhole_t { fp_flags: 0, reserved: 0, fp_offset: off, fp_length: n };
    // SAFETY: `F_PUNCHHOLE` reads the argument struct, which lives across the call; the
    // descriptor is open for the lifetime of `file`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_PUNCHHOLE, &args) } == -1 {
        return Err(io::Error::last_os_error());
    }
    zeros(offset, inner_start)?;
    zeros(inner_end, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_punched_range_reads_as_zeros_and_its_neighbours_keep_their_bytes() {
        let f = tempfile::tempfile().expect("temp file");
        let data: Vec<u8> =
            (0..65_536u32).map(|i| u8::try_from(i % 251 + 1).expect("byte")).collect();
        f.write_all_at(&data, 0).expect("write");
        // Unaligned at both ends and spanning whole blocks.
        let (off, len) = (1000u64, 30_000u64);
        match punch(&f, off, len) {
            Ok(()) => {}
            // A file system without hole punching (some tmpfs and overlay versions) cannot be tested here.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return,
            Err(e) => panic!("punch: {e}"),
        }
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, 0).expect("read");
        let (a, b) = (1000usize, 31_000usize);
        assert_eq!(&back[..a], &data[..a], "bytes before the range are kept");
        assert!(back[a..b].iter().all(|&x| x == 0), "the range reads as zeros");
        assert_eq!(&back[b..], &data[b..], "bytes after the range are kept");
        assert_eq!(f.metadata().expect("metadata").len(), data.len() as u64, "length kept");
    }
}
