//! Reads that bypass the page cache, so that what the expert store reads is charged to the
//! memory budget and nowhere else. The store keeps two descriptors per shard: a buffered one
//! and the one [`open`] returns, which takes every read whose offset, length and buffer are
//! aligned to 4096 bytes (see [`crate::io`]).
//!
//! - **Linux**: `O_DIRECT`. Some file systems (tmpfs) refuse it at open, others refuse a read
//!   with `EINVAL` ([`refused`]); the store then reads through the buffered descriptor.
//! - **macOS**: `F_NOCACHE` (the read does not stay in the unified buffer cache; no alignment
//!   rule, though aligned reads remain the fast path) and `F_RDAHEAD` 0 (experts are read
//!   whole at scattered offsets, so read-ahead would only fill memory outside the budget). A
//!   read is never refused for alignment.

use std::fs::File;
use std::io;
use std::path::Path;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/direct.rs has no uncached-read version for this OS (Linux uses \
     O_DIRECT, macOS F_NOCACHE): without one, expert reads would fill the page cache outside \
     the memory budget"
);

/// The mechanism's name, for messages and reports: `O_DIRECT` or `F_NOCACHE`.
#[cfg(target_os = "linux")]
pub const NAME: &str = "O_DIRECT";

/// Opens `path` for uncached reads, or `None` where the file system refuses.
#[cfg(target_os = "linux")]
pub fn open(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok()
}

/// True when `e` is the refusal of one uncached read (`EINVAL`: the file system does not
/// support `O_DIRECT` for this file, or the read is not aligned as it needs); the read then
/// goes through the buffered descriptor.
#[cfg(target_os = "linux")]
pub fn refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// The mechanism's name, for messages and reports: `O_DIRECT` or `F_NOCACHE`.
#[cfg(target_os = "macos")]
pub const NAME: &str = "F_NOCACHE";

/// Opens `path` for uncached reads, or `None` where the file system refuses.
#[cfg(target_os = "macos")]
pub fn open(path: &Path) -> Option<File> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).ok()?;
    // SAFETY: `fcntl` with an integer argument on a descriptor `f` keeps open; it changes
    // only how the kernel caches this file's reads.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        return None;
    }
    // SAFETY: as above. Best effort: read-ahead left on costs memory outside the budget, not
    // correctness.
    let _ = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_RDAHEAD, 0) };
    Some(f)
}

/// True when `e` is the refusal of one uncached read. `F_NOCACHE` never refuses a read.
#[cfg(target_os = "macos")]
pub fn refused(e: &io::Error) -> bool {
    let _ = e;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncached_descriptors_read_the_file() {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&[7u8; 8192]).expect("write");
        // tmpfs refuses O_DIRECT at open: then there is nothing to read through.
        if let Some(d) = open(f.path()) {
            let arena = crate::arena::Arena::new(1, 4096).expect("aligned buffer");
            // SAFETY: this test is the arena's only user.
            let buf = unsafe { arena.slot_mut(0) };
            match d.read_at(buf, 4096) {
                Ok(n) => assert_eq!(&buf[..n], &[7u8; 4096][..n]),
                Err(e) => assert!(refused(&e), "{e}"),
            }
        }
        assert!(!refused(&io::Error::from_raw_os_error(libc::EIO)));
    }
}
