//! Every expert read goes through one trait, [`ReadAt`], so tests can wrap the real reader in
//! a fault injector ([`crate::fault::FaultyReader`]).
//!
//! The real reader, [`ShardFiles`], keeps two descriptors per shard: a buffered one and, when
//! [`IoMode::Direct`] is asked for and the file system accepts it, an uncached one (`O_DIRECT`
//! on Linux, `F_NOCACHE` on macOS: [`crate::platform::direct`]). A read whose offset, length and
//! buffer address are all multiples of [`ALIGN`] goes to the direct descriptor (no page cache,
//! so the memory budget is real); anything else (a continuation after a short read, a file
//! system that refuses O_DIRECT such as tmpfs) goes to the buffered descriptor and, unless
//! plain buffered I/O was asked for, the pages it pulled into the page cache are dropped again
//! ([`crate::platform::advice`]).
//!
//! The spine store asks for [`ReadAt::read_at_cached`] instead (through [`FromCache`]): a range
//! that is already wholly in the page cache is copied from there, out of a mapping that reads
//! nothing ahead, leaving the pages as they were ([`crate::platform::residency`]): reading it
//! again from storage with O_DIRECT would cost a disk read and keep nothing the copy does not;
//! any other range is read as above.
//!
//! A queue-based backend ([`crate::uring`]) cannot call `read_at` (the kernel does the read), so
//! the trait also splits a read in two: [`ReadAt::prepare`] says which descriptor to read (or
//! completes the read at once, which is how a fault injector fails or shortens it) and
//! [`ReadAt::complete`] sees the kernel's result (where O_DIRECT's refusal turns into a retry
//! on the buffered descriptor, and buffered pages are dropped), so both backends share one seam.

use crate::index::{Span, ALIGN};
use crate::platform::{advice, direct, residency};
use crate::StoreError;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// [`ALIGN`] as a `usize`, for buffer lengths and addresses.
const ALIGN_USIZE: usize = 4096;

/// Positional reads from a set of files, addressed by index.
pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes of file `file` starting at `offset`; returns how many
    /// were read (0 at end of file). Short reads are allowed; callers loop.
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Reads like [`ReadAt::read_at`], except that a range wholly in the page cache may be
    /// copied from there rather than read again from storage (it grows the page cache by
    /// nothing). The default is [`ReadAt::read_at`].
    fn read_at_cached(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read_at(file, offset, buf)
    }

    /// The first half of a read done by a queue-based backend: which descriptor the kernel
    /// should read up to `buf.len()` bytes of file `file` at `offset` from (into `buf`, after
    /// this returns), or the result at once. The default reads synchronously with
    /// [`ReadAt::read_at`] (for readers that are not files, such as test readers in memory).
    fn prepare(&self, file: usize, offset: u64, buf: &mut [u8]) -> Prepared {
        Prepared::Ready(self.read_at(file, offset, buf))
    }

    /// The second half: the kernel's `result` for the prepared read `p`. Returns what the read
    /// gives its caller, or [`Completed::Retry`] to prepare it again (the default passes the
    /// result on).
    fn complete(
        &self,
        file: usize,
        offset: u64,
        p: &PreparedRead,
        result: io::Result<usize>,
    ) -> Completed {
        let _ = (file, offset, p);
        Completed::Done(result)
    }
}

/// What [`ReadAt::prepare`] decided.
#[derive(Debug)]
pub enum Prepared {
    /// Read through the kernel as described.
    Read(PreparedRead),
    /// No read: this is the result (an injected fault, or a file that ends here).
    Ready(io::Result<usize>),
    /// No read: this is the result, delivered after this long (a stalled injected fault).
    After(Duration, io::Result<usize>),
}

/// A read for the kernel to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedRead {
    /// The descriptor.
    pub fd: RawFd,
    /// Bytes to read (at most the length asked for).
    pub len: usize,
    /// Whether `fd` is the uncached (O_DIRECT / F_NOCACHE) descriptor.
    pub direct: bool,
    /// Start the read only after this long (a fault injector's stall).
    pub delay: Option<Duration>,
}

/// What [`ReadAt::complete`] decided.
#[derive(Debug)]
pub enum Completed {
    /// The read's result.
    Done(io::Result<usize>),
    /// Prepare and submit the read again (the uncached read was refused; the buffered
    /// descriptor is next).
    Retry,
}

impl<R: ReadAt + ?Sized> ReadAt for Arc<R> {
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(file, offset, buf)
    }

    fn read_at_cached(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at_cached(file, offset, buf)
    }

    fn prepare(&self, file: usize, offset: u64, buf: &mut [u8]) -> Prepared {
        (**self).prepare(file, offset, buf)
    }

    fn complete(
        &self,
        file: usize,
        offset: u64,
        p: &PreparedRead,
        result: io::Result<usize>,
    ) -> Completed {
        (**self).complete(file, offset, p, result)
    }
}

/// A [`ReadAt`] whose `read_at` is the wrapped reader's [`ReadAt::read_at_cached`], for
/// [`read_span`] callers that prefer the page cache's copy of a resident range.
#[derive(Clone, Copy)]
pub struct FromCache<'a>(pub &'a dyn ReadAt);

impl std::fmt::Debug for FromCache<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FromCache")
    }
}

impl ReadAt for FromCache<'_> {
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at_cached(file, offset, buf)
    }
}

impl std::fmt::Debug for dyn ReadAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn ReadAt")
    }
}

/// How [`ShardFiles`] treats the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Uncached reads (O_DIRECT on Linux, F_NOCACHE on macOS) where the file system allows
    /// them; elsewhere buffered reads whose pages are dropped after reading.
    #[default]
    Direct,
    /// Buffered reads whose pages are dropped after reading ([`crate::platform::advice`]).
    BufferedDropCache,
    /// Plain buffered reads; the page cache keeps what it likes (outside the budget).
    Buffered,
}

/// One shard's descriptors.
#[derive(Debug)]
struct Shard {
    buffered: File,
    direct: Option<File>,
    /// Whether [`ReadAt::read_at_cached`] copies ranges already in the page cache (not in
    /// [`IoMode::Buffered`], where every read is buffered anyway).
    copy_resident: bool,
    /// The file's length at open: a range is checked for residency up to here only.
    len: u64,
    /// Cleared when the direct descriptor refuses a read ([`direct::refused`]), so later reads
    /// skip it.
    direct_ok: AtomicBool,
}

/// The real [`ReadAt`]: the checkpoint's shard files.
#[derive(Debug)]
pub struct ShardFiles {
    shards: Vec<Shard>,
    paths: Vec<PathBuf>,
    mode: IoMode,
    direct_reads: AtomicU64,
    buffered_reads: AtomicU64,
    cached_reads: AtomicU64,
}

impl ShardFiles {
    /// Opens every file of `paths` for reading in `mode`. O_DIRECT is tried per file; a file
    /// system that refuses it silently gets the buffered fallback ([`ShardFiles::direct`]
    /// says which files got it).
    pub fn open(paths: &[PathBuf], mode: IoMode) -> Result<Self, StoreError> {
        let mut shards = Vec::with_capacity(paths.len());
        for p in paths {
            let buffered =
                File::open(p).map_err(|source| StoreError::Io { path: p.clone(), source })?;
            let direct = match mode {
                IoMode::Direct => direct::open(p),
                IoMode::BufferedDropCache | IoMode::Buffered => None,
            };
            let direct_ok = AtomicBool::new(direct.is_some());
            let copy_resident = mode != IoMode::Buffered;
            let len =
                buffered.metadata().map_err(|source| StoreError::Io { path: p.clone(), source })?;
            shards.push(Shard { buffered, direct, copy_resident, len: len.len(), direct_ok });
        }
        Ok(Self {
            shards,
            paths: paths.to_vec(),
            mode,
            direct_reads: AtomicU64::new(0),
            buffered_reads: AtomicU64::new(0),
            cached_reads: AtomicU64::new(0),
        })
    }

    /// True when reads of `file` that are aligned go through O_DIRECT.
    pub fn direct(&self, file: usize) -> bool {
        self.shards.get(file).is_some_and(|s| s.direct_ok.load(Ordering::Relaxed))
    }

    /// Reads served so far through O_DIRECT and through the buffered descriptor.
    pub fn read_counts(&self) -> (u64, u64) {
        (self.direct_reads.load(Ordering::Relaxed), self.buffered_reads.load(Ordering::Relaxed))
    }

    /// Reads served so far by copying a range already in the page cache
    /// ([`ReadAt::read_at_cached`]); counted in neither of [`ShardFiles::read_counts`].
    pub fn cached_reads(&self) -> u64 {
        self.cached_reads.load(Ordering::Relaxed)
    }

    /// The mode asked for at open.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// The file `file` (empty if out of range).
    pub fn path(&self, file: usize) -> &Path {
        self.paths.get(file).map_or(Path::new(""), PathBuf::as_path)
    }
}

/// True when `offset`, the buffer address and the buffer length are all O_DIRECT-aligned.
fn aligned(offset: u64, addr: usize, len: usize) -> bool {
    offset.is_multiple_of(ALIGN)
        && addr.is_multiple_of(ALIGN_USIZE)
        && len.is_multiple_of(ALIGN_USIZE)
}

impl ReadAt for ShardFiles {
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(s) = self.shards.get(file) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no shard file {file}")));
        };
        if let Some(d) = &s.direct {
            if s.direct_ok.load(Ordering::Relaxed)
                && aligned(offset, buf.as_ptr() as usize, buf.len())
            {
                match d.read_at(buf, offset) {
                    Err(e) if direct::refused(&e) => {
                        s.direct_ok.store(false, Ordering::Relaxed);
                    }
                    r => {
                        self.direct_reads.fetch_add(1, Ordering::Relaxed);
                        return r;
                    }
                }
            }
        }
        self.buffered_reads.fetch_add(1, Ordering::Relaxed);
        let n = s.buffered.read_at(buf, offset)?;
        if self.mode != IoMode::Buffered && n > 0 {
            drop_cached(&s.buffered, offset, n);
        }
        Ok(n)
    }

    fn read_at_cached(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(s) = self.shards.get(file) else { return self.read_at(file, offset, buf) };
        // Only the bytes the file has (a read past its end is short, as `read_at`'s would be).
        let want =
            usize::try_from(s.len.saturating_sub(offset)).map_or(buf.len(), |n| n.min(buf.len()));
        if s.copy_resident && want > 0 {
            if let Some(b) = buf.get_mut(..want) {
                // The pages were cached before this copy and are left as they are.
                if let Ok(true) = residency::copy_if_resident(&s.buffered, s.len, offset, b) {
                    self.cached_reads.fetch_add(1, Ordering::Relaxed);
                    return Ok(want);
                }
            }
        }
        self.read_at(file, offset, buf)
    }

    fn prepare(&self, file: usize, offset: u64, buf: &mut [u8]) -> Prepared {
        let Some(s) = self.shards.get(file) else {
            let e = io::Error::new(io::ErrorKind::NotFound, format!("no shard file {file}"));
            return Prepared::Ready(Err(e));
        };
        let len = buf.len();
        let direct = s.direct.as_ref().filter(|_| {
            s.direct_ok.load(Ordering::Relaxed) && aligned(offset, buf.as_ptr() as usize, len)
        });
        let (fd, direct) = match direct {
            Some(d) => (d.as_raw_fd(), true),
            None => (s.buffered.as_raw_fd(), false),
        };
        Prepared::Read(PreparedRead { fd, len, direct, delay: None })
    }

    fn complete(
        &self,
        file: usize,
        offset: u64,
        p: &PreparedRead,
        result: io::Result<usize>,
    ) -> Completed {
        let Some(s) = self.shards.get(file) else { return Completed::Done(result) };
        if p.direct {
            if result.as_ref().is_err_and(direct::refused) {
                s.direct_ok.store(false, Ordering::Relaxed);
                return Completed::Retry;
            }
            self.direct_reads.fetch_add(1, Ordering::Relaxed);
        } else {
            self.buffered_reads.fetch_add(1, Ordering::Relaxed);
            if let Ok(n) = result {
                if self.mode != IoMode::Buffered && n > 0 {
                    drop_cached(&s.buffered, offset, n);
                }
            }
        }
        Completed::Done(result)
    }
}

/// Drops the page-cache pages of `file` covering `offset..offset + len` (rounded out to whole
/// pages, since the kernel keeps partial pages). Best effort: a failure only costs memory.
fn drop_cached(file: &File, offset: u64, len: usize) {
    let start = offset - offset % ALIGN;
    let end = (offset + len as u64).div_ceil(ALIGN) * ALIGN;
    let _ = advice::drop_range(file, start, end - start);
}

/// Reads `span`'s aligned region into `region` (exactly [`Span::region_len`] bytes), looping
/// over short reads and retrying interrupted ones, until at least [`Span::needed`] bytes are
/// in. Returns the bytes transferred; a file that ends first is `UnexpectedEof`.
pub fn read_span(reader: &dyn ReadAt, span: &Span, region: &mut [u8]) -> io::Result<u64> {
    let needed = usize::try_from(span.needed()).map_err(io::Error::other)?;
    let base = span.read_offset();
    let mut got = 0usize;
    while got < needed {
        let Some(rest) = region.get_mut(got..) else {
            return Err(io::Error::other("slot region shorter than the span"));
        };
        match reader.read_at(span.file, base + got as u64, rest) {
            Ok(0) => return Err(ended_early(span, got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got as u64)
}

/// The error for a file that ended after `got` bytes of `span`'s aligned region.
pub(crate) fn ended_early(span: &Span, got: usize) -> io::Error {
    let lead = usize::try_from(span.lead()).unwrap_or(0);
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("file ended after {} of {} bytes", got.saturating_sub(lead), span.len),
    )
}

/// A copy of `e` for a second receiver of the same failure (keeps the OS error code).
pub fn clone_io_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader over one in-memory file that returns at most `chunk` bytes per call.
    struct Mem {
        data: Vec<u8>,
        chunk: usize,
    }

    impl ReadAt for Mem {
        fn read_at(&self, _file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
            let start = usize::try_from(offset).map_err(io::Error::other)?.min(self.data.len());
            let n = buf.len().min(self.chunk).min(self.data.len() - start);
            buf[..n].copy_from_slice(&self.data[start..start + n]);
            Ok(n)
        }
    }

    #[test]
    fn short_reads_are_continued_and_eof_is_an_error() {
        let data: Vec<u8> = (0..10_000u32).map(|i| u8::try_from(i % 251).expect("byte")).collect();
        let mem = Mem { data: data.clone(), chunk: 777 };
        let span = Span { file: 0, offset: 5000, len: 3000, region: 0 };
        let mut region = vec![0u8; 8192];
        let n = read_span(&mem, &span, &mut region).expect("reads");
        assert!(n >= span.needed());
        assert_eq!(&region[904..904 + 3000], &data[5000..8000]);

        let past = Span { file: 0, offset: 9000, len: 2000, region: 0 };
        let err = read_span(&mem, &past, &mut region).expect_err("file too short");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("after 1000 of 2000 bytes"), "{err}");
    }

    #[test]
    fn shard_files_read_aligned_and_unaligned_ranges_exactly() {
        use std::io::Write;
        let data: Vec<u8> = (0..20_000u32).map(|i| u8::try_from(i % 253).expect("byte")).collect();
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&data).expect("write");
        let paths = [f.path().to_path_buf()];
        for mode in [IoMode::Direct, IoMode::BufferedDropCache, IoMode::Buffered] {
            let files = ShardFiles::open(&paths, mode).expect("opens");
            let arena = crate::arena::Arena::new(1, 16_384).expect("aligned buffer");
            // SAFETY: this test is the arena's only user.
            let buf = unsafe { arena.slot_mut(0) };
            // Aligned: O_DIRECT where available. The tail past the end of the file is short.
            let n = files.read_at(0, 8192, buf).expect("aligned read");
            assert_eq!(&buf[..n], &data[8192..]);
            // Unaligned offset and length: always the buffered descriptor.
            let n = files.read_at(0, 1234, &mut buf[..999]).expect("unaligned read");
            assert_eq!(&buf[..n], &data[1234..1234 + 999]);
            let (direct, buffered) = files.read_counts();
            assert_eq!(direct + buffered, 2);
            assert_eq!(direct, u64::from(files.direct(0)));
            assert!(files.read_at(1, 0, buf).is_err(), "no such file");
        }
    }

    #[test]
    fn cloned_errors_keep_the_os_code() {
        let e = clone_io_error(&io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
}
