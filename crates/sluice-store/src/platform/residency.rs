//! Whether a file range is already in the page cache, and copying it from there: a read of a
//! resident range then costs a memory copy instead of another read from storage with an
//! uncached read ([`super::direct`]). The copy grows the page cache by nothing; a range that is
//! not wholly resident keeps its uncached read, so reading a model still does not fill memory
//! outside the budget.
//!
//! Both systems answer through `mincore` on a transient read-only mapping of the range, and
//! [`copy_if_resident`] copies out of that same mapping, advised `MADV_RANDOM` first: a fault
//! on a mapped file page then reads nothing ahead. (A buffered `pread` would not do: on Linux a
//! page that an earlier sequential read marked for read-ahead starts the next read-ahead window,
//! `posix_fadvise(POSIX_FADV_RANDOM)` or not, which grew the cache by 8 MiB a marked page on the
//! development VM.) The answer is a snapshot: a page evicted between the check and the copy
//! is read back alone, never a whole model.
//!
//! - **Linux**: `mincore`'s vector holds one byte per page, bit 0 set when the page is resident;
//!   `MADV_POPULATE_READ` maps the resident range in one call before the copy.
//! - **macOS**: the same calls but the populate; a page counts when `MINCORE_INCORE` is set
//!   (other bits say whether it is referenced or modified).
//!
//! As with any mapped file, a file truncated under the copy would end it with `SIGBUS`: model
//! files are not written while a model is open (the mapped experts make the same assumption).

use super::machine::page_size;
use std::fs::File;
use std::io;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/residency.rs has no page-cache residency check for this OS \
     (Linux and macOS use mincore on a mapping): write one, or have `resident` answer false so \
     every read stays uncached"
);

/// True when every page of `file` covering `offset .. offset + len` is in the page cache (an
/// empty range is). `Err` where the range cannot be mapped or asked about; callers then read
/// as if it were not resident.
pub fn resident(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    Mapping::new(file, offset, len)?.resident()
}

/// Copies `file`'s bytes `offset .. offset + buf.len()` into `buf` if every page of them is in
/// the page cache, and returns true; returns false, `buf` untouched, if any is not. `file_len`
/// is the file's length, which the caller asks once (a reader asks when it opens the file, not
/// once per chunk it copies); the range must lie inside it (a mapping past the file's end
/// cannot be read).
pub fn copy_if_resident(
    file: &File,
    file_len: u64,
    offset: u64,
    buf: &mut [u8],
) -> io::Result<bool> {
    if buf.is_empty() {
        return Ok(true);
    }
    let len = u64::try_from(buf.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let m = Mapping::new(file, offset, len)?;
    if !m.resident()? {
        return Ok(false);
    }
    m.no_read_ahead()?;
    m.populate();
    // SAFETY: the mapping covers `offset .. offset + len` of the file, inside the file (checked
    // above against its length; model files are not truncated while open), so every byte of it
    // can be read; `buf` is a distinct, exclusive slice of `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(m.bytes_ptr(), buf.as_mut_ptr(), buf.len()) };
    Ok(true)
}

/// A read-only shared mapping of the pages covering a file range, unmapped on drop: the one
/// transient mapping of the platform module, which asks about residency through it
/// (`resident`, `resident_pages`), copies from it, and on macOS drops pages through it
/// (`invalidate`). It is never read but by [`copy_if_resident`].
pub(super) struct Mapping {
    /// The first page.
    start: *mut libc::c_void,
    /// Bytes mapped (from the first page to the range's end).
    span: usize,
    /// Bytes from `start` to the range's first byte.
    lead: usize,
}

impl Mapping {
    /// Maps the pages of `file` covering `offset .. offset + len` (`len` > 0) read-only.
    pub(super) fn new(file: &File, offset: u64, len: u64) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        let page = page_size();
        let first = offset / page * page;
        let end = offset.checked_add(len).ok_or(io::ErrorKind::InvalidInput)?;
        let span = usize::try_from(end - first).map_err(|_| io::ErrorKind::InvalidInput)?;
        let lead = usize::try_from(offset - first).map_err(|_| io::ErrorKind::InvalidInput)?;
        let (off, _) = super::off_pair(first, 0)?;
        // SAFETY: a fresh read-only shared mapping at an address the kernel picks; nothing else
        // refers to it, and it is unmapped on drop.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { start, span, lead })
    }

    /// True when every mapped page is in the page cache (asking reads no byte).
    fn resident(&self) -> io::Result<bool> {
        let page = usize::try_from(page_size()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let pages = self.span.div_ceil(page);
        let mut vec = vec![0u8; pages];
        Ok(self.resident_pages(0, self.span, &mut vec)? == pages as u64)
    }

    /// How many pages of the mapped bytes `off .. off + len` are in the page cache (asking
    /// reads no byte): one `mincore` call into `vec`, which needs an entry per page. `off` must
    /// be a multiple of the page size and the bytes inside the mapping (`InvalidInput`
    /// otherwise).
    pub(super) fn resident_pages(&self, off: usize, len: usize, vec: &mut [u8]) -> io::Result<u64> {
        let page = usize::try_from(page_size()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let pages = len.div_ceil(page);
        let inside = off.checked_add(len).is_some_and(|end| end <= self.span);
        let Some(vec) = vec.get_mut(..pages).filter(|_| inside && off.is_multiple_of(page)) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        // `off` is inside the mapping (checked above), so the pointer stays in it.
        incore(self.start.cast::<u8>().wrapping_add(off).cast(), len, vec)?;
        Ok(vec.iter().filter(|&&v| v & IN_CORE != 0).count() as u64)
    }

    /// Advises `MADV_RANDOM`: a fault reads no page ahead.
    fn no_read_ahead(&self) -> io::Result<()> {
        // SAFETY: the range is this mapping; the advice changes only read-ahead.
        let rc = unsafe { libc::madvise(self.start, self.span, libc::MADV_RANDOM) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Discards the mapped pages from the page cache (`msync(MS_INVALIDATE)`, what macOS has
    /// for `posix_fadvise(DONTNEED)`); reads no byte.
    #[cfg(target_os = "macos")]
    pub(super) fn invalidate(&self) -> io::Result<()> {
        // SAFETY: the range is this mapping; MS_INVALIDATE drops its cached pages, changes no
        // byte of the file, and no reference into the mapping exists.
        let rc = unsafe { libc::msync(self.start, self.span, libc::MS_INVALIDATE) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Maps every page at once where the system can (best effort: faults do it otherwise).
    fn populate(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the range is this mapping; MADV_POPULATE_READ faults its pages in for
        // reading, as the copy would, and changes no byte.
        unsafe {
            libc::madvise(self.start, self.span, libc::MADV_POPULATE_READ)
        };
    }

    /// The range's first byte.
    fn bytes_ptr(&self) -> *const u8 {
        self.start.cast::<u8>().cast_const().wrapping_add(self.lead)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `start .. start + span` is the mapping made in `new`; no reference into it
        // outlives the method that made it.
        unsafe { libc::munmap(self.start, self.span) };
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_resident_range_is_copied_exactly_whatever_its_alignment() {
        let data: Vec<u8> = (0..300_000u32).map(|i| u8::try_from(i % 251).expect("byte")).collect();
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&data).expect("write");
        assert_eq!(std::fs::read(f.path()).expect("read"), data);
        let len = f.as_file().metadata().expect("metadata").len();
        for (o, n) in
            [(0usize, 300_000usize), (1, 4095), (4096, 8192), (12_345, 200_000), (299_999, 1)]
        {
            let mut buf = vec![0u8; n];
            assert!(copy_if_resident(f.as_file(), len, o as u64, &mut buf).expect("copies"));
            assert_eq!(&buf[..], &data[o..o + n], "{o}+{n}");
        }
        let mut past = vec![0u8; 2];
        assert!(copy_if_resident(f.as_file(), len, 299_999, &mut past).is_err(), "past the end");
    }

    #[test]
    fn a_read_file_is_resident_and_a_dropped_one_is_not() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&vec![3u8; 1 << 20]).expect("write");
        f.as_file().sync_all().expect("sync");
        assert_eq!(std::fs::read(f.path()).expect("read").len(), 1 << 20);
        assert!(resident(f.as_file(), 5000, 300_000).expect("asks"));
        assert!(resident(f.as_file(), 0, 0).expect("an empty range"));
        super::super::advice::drop_file(f.path()).expect("drop");
        // tmpfs (which refuses O_DIRECT) keeps its pages whatever the advice.
        if super::super::direct::open(f.path()).is_some() {
            assert!(!resident(f.as_file(), 5000, 300_000).expect("asks"));
            let mut buf = vec![9u8; 1000];
            assert!(!copy_if_resident(f.as_file(), 1 << 20, 5000, &mut buf).expect("asks"));
            assert_eq!(buf, vec![9u8; 1000], "untouched");
        }
    }
}
