//! Whether a file range is already in the page cache, so that a read of it can copy it from
//! there (memory speed) instead of reading it again from storage with an uncached read
//! ([`super::direct`]). Copying resident pages grows the page cache by nothing; a range that is
//! not wholly resident keeps its uncached read, so reading a model still does not fill memory
//! outside the budget.
//!
//! The copy goes through a descriptor of its own with read-ahead off ([`open`]), so that reading
//! a resident range does not start reading the pages after it into the cache.
//!
//! Both systems answer through `mincore` on a transient read-only mapping of the range: the
//! mapping is made, asked and unmapped without one byte of it being read, so asking faults
//! nothing in. The answer is a snapshot: a page may be evicted just after it was counted
//! resident, and its read then brings that page back in (the cost of a race, a page at a time,
//! never a whole model).
//!
//! - **Linux**: `mincore`'s vector holds one byte per page, bit 0 set when the page is resident;
//!   read-ahead is turned off with `posix_fadvise(POSIX_FADV_RANDOM)`.
//! - **macOS**: the same call; a page counts when `MINCORE_INCORE` is set (other bits say
//!   whether it is referenced or modified); read-ahead is turned off with `F_RDAHEAD` 0.

use std::fs::File;
use std::io;
use std::path::Path;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/residency.rs has no page-cache residency check for this OS \
     (Linux and macOS use mincore on a mapping): write one, or have `resident` answer false so \
     every read stays uncached"
);

/// Opens `path` for copying resident ranges: a buffered descriptor with read-ahead off, or
/// `None` where the file cannot be opened or read-ahead cannot be turned off (reads then stay
/// uncached).
#[cfg(target_os = "linux")]
pub fn open(path: &Path) -> Option<File> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).ok()?;
    // SAFETY: `posix_fadvise` only reads its integer arguments on a descriptor `f` keeps open;
    // RANDOM changes only how much this descriptor's reads read ahead (nothing).
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    (rc == 0).then_some(f)
}

/// Opens `path` for copying resident ranges: a buffered descriptor with read-ahead off, or
/// `None` where the file cannot be opened or read-ahead cannot be turned off (reads then stay
/// uncached).
#[cfg(target_os = "macos")]
pub fn open(path: &Path) -> Option<File> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).ok()?;
    // SAFETY: `fcntl` with an integer argument on a descriptor `f` keeps open; it changes only
    // whether the kernel reads ahead on this file.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_RDAHEAD, 0) };
    (rc != -1).then_some(f)
}

/// True when every page of `file` covering `offset .. offset + len` is in the page cache (an
/// empty range is). `Err` where the range cannot be mapped or asked about; callers then read
/// as if it were not resident.
pub fn resident(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(true);
    }
    let page = page_size();
    let start = offset / page * page;
    let end = offset.checked_add(len).ok_or(io::ErrorKind::InvalidInput)?;
    let span = usize::try_from(end - start).map_err(|_| io::ErrorKind::InvalidInput)?;
    let pages = span.div_ceil(usize::try_from(page).map_err(|_| io::ErrorKind::InvalidInput)?);
    let (off, _) = super::off_pair(start, 0)?;
    // SAFETY: a fresh read-only shared mapping at an address the kernel picks; nothing else
    // refers to it, no byte of it is read, and it is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; pages];
    let rc = incore(p, span, &mut vec);
    // SAFETY: `p .. p + span` is the mapping made above; no reference into it exists.
    unsafe { libc::munmap(p, span) };
    rc?;
    Ok(vec.iter().all(|&v| v & IN_CORE != 0))
}

/// The bit of a `mincore` vector entry that says the page is resident.
#[cfg(target_os = "linux")]
const IN_CORE: u8 = 1;

/// The bit of a `mincore` vector entry that says the page is resident.
#[cfg(target_os = "macos")]
const IN_CORE: u8 = 0x1; // MINCORE_INCORE

/// `mincore` of the mapping `p .. p + span` into `vec` (one entry per page).
#[cfg(target_os = "linux")]
fn incore(p: *mut libc::c_void, span: usize, vec: &mut [u8]) -> io::Result<()> {
    // SAFETY: `p .. p + span` is a live mapping and `vec` holds one byte for each of its pages;
    // `mincore` writes only `vec`.
    let rc = unsafe { libc::mincore(p, span, vec.as_mut_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mincore` of the mapping `p .. p + span` into `vec` (one entry per page).
#[cfg(target_os = "macos")]
fn incore(p: *mut libc::c_void, span: usize, vec: &mut [u8]) -> io::Result<()> {
    // SAFETY: `p .. p + span` is a live mapping and `vec` holds one byte for each of its pages
    // (`c_char` and `u8` have one layout); `mincore` writes only `vec`.
    let rc = unsafe { libc::mincore(p, span, vec.as_mut_ptr().cast::<libc::c_char>()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The page size (4096 where the system will not say).
fn page_size() -> u64 {
    // SAFETY: `sysconf` only reads its integer argument.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_read_file_is_resident_and_a_dropped_one_is_not() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&vec![3u8; 1 << 20]).expect("write");
        f.as_file().sync_all().expect("sync");
        assert!(open(f.path()).is_some());
        assert_eq!(std::fs::read(f.path()).expect("read").len(), 1 << 20);
        assert!(resident(f.as_file(), 5000, 300_000).expect("asks"));
        assert!(resident(f.as_file(), 0, 0).expect("an empty range"));
        super::super::advice::drop_file(f.path()).expect("drop");
        // tmpfs (which refuses O_DIRECT) keeps its pages whatever the advice.
        if super::super::direct::open(f.path()).is_some() {
            assert!(!resident(f.as_file(), 5000, 300_000).expect("asks"));
        }
    }
}
