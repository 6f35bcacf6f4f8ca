//! Dropping a file's pages from the page cache: after a buffered read (so reading a model does
//! not grow memory outside the budget), after the disk cache writes an expert, and before a
//! cold `sluice bench` or `sluice probe` run (so storage, not memory, is measured). Pages another
//! process has mapped stay cached on both systems. And the opposite for mapped experts
//! ([`populate`]): entering a mapping's pages in this process's page tables at load, so that
//! the first pass does not take a page fault per few pages it reads.
//!
//! - **Linux**: `posix_fadvise(POSIX_FADV_DONTNEED)`; a privileged process can also drop every
//!   clean page through `/proc/sys/vm/drop_caches`.
//! - **macOS**: there is no `posix_fadvise`. The range is mapped and `msync(MS_INVALIDATE)`
//!   discards its cached pages (what `vmtouch -e` does there); the whole cache can be dropped
//!   only by the `purge` tool as root, which sluice does not run.

use std::fs::File;
use std::io;
use std::path::Path;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/advice.rs has no page-cache advice for this OS (Linux uses \
     posix_fadvise(DONTNEED), macOS msync(MS_INVALIDATE)): buffered reads would stay cached \
     outside the memory budget"
);

/// How [`drop_range`] and [`drop_file`] drop pages, for reports.
#[cfg(target_os = "linux")]
pub const FILE_METHOD: &str = "posix_fadvise(DONTNEED)";

/// How [`drop_all`] drops pages, for reports.
#[cfg(target_os = "linux")]
pub const ALL_METHOD: &str = "/proc/sys/vm/drop_caches";

/// Drops the cached pages of `file` covering `offset .. offset + len` (the kernel keeps
/// partial pages). Failures cost memory, not correctness, so callers may ignore them.
#[cfg(target_os = "linux")]
pub fn drop_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (off, n) = super::off_pair(offset, len)?;
    // SAFETY: `posix_fadvise` only reads its integer arguments; the descriptor is open for the
    // lifetime of `file`, and advice on any range is harmless to memory safety.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Drops every clean page of the page cache, where this process may (root); `Err` otherwise.
#[cfg(target_os = "linux")]
pub fn drop_all() -> io::Result<()> {
    // "1" drops clean page-cache pages only.
    std::fs::write("/proc/sys/vm/drop_caches", "1\n")
}

/// How [`drop_range`] and [`drop_file`] drop pages, for reports.
#[cfg(target_os = "macos")]
pub const FILE_METHOD: &str = "msync(MS_INVALIDATE)";

/// How [`drop_all`] drops pages, for reports (it never does on macOS).
#[cfg(target_os = "macos")]
pub const ALL_METHOD: &str = "purge (root only; not run)";

/// Drops the cached pages of `file` covering `offset .. offset + len` (rounded out to whole
/// pages). Failures cost memory, not correctness, so callers may ignore them.
#[cfg(target_os = "macos")]
pub fn drop_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    super::residency::Mapping::new(file, offset, len)?.invalidate()
}

/// Drops every clean page of the page cache: not possible for a process on macOS.
#[cfg(target_os = "macos")]
pub fn drop_all() -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "macOS drops the whole cache only with purge"))
}

/// Drops the cached pages of the whole file at `path`, so its next read comes from storage.
pub fn drop_file(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    drop_range(&f, 0, len)
}

/// Makes every page of `bytes` (a slice of a read-only file mapping) present in this process's
/// page tables, reading from storage what is not cached: what a first pass over a mapped model
/// would otherwise do one page fault at a time, inside the pass (a 256-token prefill touches
/// nearly every expert). Linux: `madvise(MADV_POPULATE_READ)` (5.14 and later), which maps the
/// range in one call; where the kernel refuses it, and on macOS, one byte of every page is read.
/// Changes no byte and no result; a failure costs time, not correctness, so callers may ignore it.
pub fn populate(bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    #[cfg(target_os = "linux")]
    {
        let page = usize::try_from(super::machine::page_size()).unwrap_or(4096);
        let start = bytes.as_ptr().addr() / page * page;
        let len = bytes.as_ptr().addr() + bytes.len() - start;
        // SAFETY: the range covers `bytes`, a live mapping, rounded down to its first page (of the
        // same mapping: mappings start on a page); MADV_POPULATE_READ only faults pages in for
        // reading, as a read of them would, and changes no byte.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if rc == 0 {
            return Ok(());
        }
    }
    touch_pages(bytes);
    Ok(())
}

/// Reads one byte of every 4 KiB of `bytes` (a page on either system, or a part of one).
fn touch_pages(bytes: &[u8]) {
    let mut sum = 0u8;
    for b in bytes.iter().step_by(4096) {
        // SAFETY: `b` is a reference into `bytes`; a volatile read keeps the compiler from
        // dropping a read whose value is unused.
        sum ^= unsafe { std::ptr::read_volatile(b) };
    }
    std::hint::black_box(sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn dropping_pages_keeps_the_bytes() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let data: Vec<u8> = (0..50_000u32).map(|i| u8::try_from(i % 241).expect("byte")).collect();
        f.write_all(&data).expect("write");
        f.as_file().sync_all().expect("sync");
        drop_range(f.as_file(), 1234, 20_000).expect("drop a range");
        drop_file(f.path()).expect("drop the file");
        assert_eq!(std::fs::read(f.path()).expect("read"), data);
        assert!(drop_file(Path::new("/nonexistent/sluice")).is_err());
    }

    #[test]
    fn populating_a_mapping_keeps_its_bytes_whatever_the_start() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let data: Vec<u8> = (0..70_000u32).map(|i| u8::try_from(i % 251).expect("byte")).collect();
        f.write_all(&data).expect("write");
        f.as_file().sync_all().expect("sync");
        drop_file(f.path()).expect("drop the file");
        // SAFETY: a read-only map of a temporary file nothing else writes.
        let map = unsafe { memmap2::Mmap::map(f.as_file()) }.expect("map");
        // A start inside a page, a span over several, an empty one, and the whole map.
        for r in [5000..61_234, 0..0, 0..70_000] {
            populate(&map[r]).expect("populate");
        }
        touch_pages(&map[1..]);
        assert_eq!(&map[..], &data[..]);
    }
}
