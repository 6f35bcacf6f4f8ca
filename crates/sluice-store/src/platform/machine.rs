//! What running a model costs the machine, as the OS reports it: bytes the process read and
//! wrote, swap traffic, major page faults, the page-cache share of a file, the block device a
//! path lives on and that device's lifetime write counter, the swap areas, and free space.
//!
//! Every reader returns `None` where the OS refuses or does not report the figure (no
//! permission, a container without `/sys/block`, an overlay filesystem with no backing
//! device): callers print "n/a", never an error and never a zero that was not measured. The
//! Linux readers that parse a file have a `*_from(path)` form so tests can point them at a
//! missing or unreadable file.
//!
//! - **Linux**: `/proc/self/io` (`read_bytes`, `write_bytes`), `/proc/vmstat` (`pswpin`,
//!   `pswpout`, system-wide pages), `getrusage` (`ru_majflt`), `mincore` over a read-only
//!   mapping, `/sys/dev/block/MAJ:MIN` → the whole disk (a partition's parent, a device
//!   mapper's or md's first slave) → `/sys/block/DEV/stat` (sectors written, 512 bytes each),
//!   `/proc/swaps`, `statvfs`.
//! - **macOS**: `proc_pid_rusage(RUSAGE_INFO_V4)` (`ri_diskio_bytesread/written`), `getrusage`,
//!   `mincore` and `statvfs`; swap traffic and the disk's write counter (IOKit) are "n/a".

use std::path::{Path, PathBuf};

/// Bytes a process caused to be read from and written to storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIo {
    /// Bytes fetched from storage (page-cache hits are not counted).
    pub read: u64,
    /// Bytes sent (or to be sent) to storage.
    pub written: u64,
}

/// System-wide pages swapped in and out since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapPages {
    /// Pages read back from swap.
    pub pages_in: u64,
    /// Pages written to swap.
    pub pages_out: u64,
}

/// The whole block device a path lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name (`nvme0n1`, `vda`, `sda`).
    pub name: String,
    /// The device's statistics file (`/sys/block/NAME/stat`).
    pub stat: PathBuf,
}

/// One swap area (`/proc/swaps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapArea {
    /// The swap file or partition.
    pub path: PathBuf,
    /// The whole disk it lives on, where known.
    pub disk: Option<String>,
    /// Size in bytes.
    pub size: u64,
}

/// The page size, 4096 where unknown.
pub fn page_size() -> u64 {
    // SAFETY: `sysconf` only reads its integer argument.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Major page faults of this process so far (`getrusage`'s `ru_majflt`).
pub fn major_faults() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `rusage` to the pointer, which is valid for it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    // SAFETY: zero-initialised plain integers, filled in by the successful call.
    (rc == 0).then(|| u64::try_from(unsafe { usage.assume_init() }.ru_majflt).ok()).flatten()
}

/// Free bytes (for an unprivileged user) and total bytes of the filesystem holding `path`.
pub fn free_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is NUL-terminated and `st` is valid for one `statvfs`.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: filled in by the successful call above.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::useless_conversion)] // the field types differ between systems
    let frsize = u64::from(st.f_frsize);
    #[allow(clippy::useless_conversion)]
    let (avail, blocks) = (u64::from(st.f_bavail), u64::from(st.f_blocks));
    Some((avail.saturating_mul(frsize), blocks.saturating_mul(frsize)))
}

/// Of `file`'s pages, how many of up to `windows` evenly spread windows of `window_pages`
/// pages each are in the page cache: `(resident, sampled)` pages. It maps the file read-only
/// (nothing is faulted in) and makes one `mincore` call per window, so its cost is `windows`
/// system calls whatever the file's size. `None` where the file cannot be mapped.
pub fn resident_pages(file: &std::fs::File, windows: u64, window_pages: u64) -> Option<(u64, u64)> {
    let len = file.metadata().ok()?.len();
    if len == 0 {
        return Some((0, 0));
    }
    let page = page_size();
    let map = super::residency::Mapping::new(file, 0, len).ok()?;
    let pages = len.div_ceil(page);
    let window = window_pages.clamp(1, pages);
    let n = windows.clamp(1, pages / window);
    let stride = pages / n;
    let mut vec = vec![0u8; usize::try_from(window).ok()?];
    let (mut resident, mut sampled) = (0u64, 0u64);
    for i in 0..n {
        let first = i * stride;
        let count = window.min(pages - first);
        let bytes = (count * page).min(len - first * page);
        let (off, b) = (usize::try_from(first * page).ok()?, usize::try_from(bytes).ok()?);
        resident += map.resident_pages(off, b, &mut vec).ok()?;
        sampled += count;
    }
    Some((resident, sampled))
}

/// Creates `path` (which must not exist) for uncached writes (`O_DIRECT`), or `None` where
/// the filesystem refuses; a file the refused open left behind is removed.
#[cfg(target_os = "linux")]
pub fn create_direct(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Some(f),
        Err(e) => {
            // tmpfs creates the file, then refuses O_DIRECT with EINVAL; O_EXCL means the file
            // did not exist before, so it is ours to remove.
            if e.raw_os_error() == Some(libc::EINVAL) {
                let _ = std::fs::remove_file(path);
            }
            None
        }
    }
}

/// Bytes this process read from and wrote to storage (`/proc/self/io`).
#[cfg(target_os = "linux")]
pub fn process_io() -> Option<ProcessIo> {
    process_io_from(Path::new("/proc/self/io"))
}

/// [`process_io`] read from `path`.
#[cfg(target_os = "linux")]
pub fn process_io_from(path: &Path) -> Option<ProcessIo> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(ProcessIo { read: field(&text, "read_bytes:")?, written: field(&text, "write_bytes:")? })
}

/// System-wide pages swapped in and out since boot (`/proc/vmstat`).
#[cfg(target_os = "linux")]
pub fn swap_pages() -> Option<SwapPages> {
    swap_pages_from(Path::new("/proc/vmstat"))
}

/// [`swap_pages`] read from `path`.
#[cfg(target_os = "linux")]
pub fn swap_pages_from(path: &Path) -> Option<SwapPages> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(SwapPages { pages_in: field(&text, "pswpin ")?, pages_out: field(&text, "pswpout ")? })
}

/// The value after `key` on the line that starts with it.
#[cfg(target_os = "linux")]
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok())
}

/// The whole disk holding `path`, or `None` where it has no block device (an overlay or
/// network filesystem, a container without `/sys`).
#[cfg(target_os = "linux")]
pub fn block_device(path: &Path) -> Option<BlockDevice> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    disk_of_devnum(Path::new("/sys"), libc::major(dev), libc::minor(dev))
}

/// The whole disk behind device `major:minor`, looked up under `sys` (normally `/sys`).
#[cfg(target_os = "linux")]
pub fn disk_of_devnum(sys: &Path, major: u32, minor: u32) -> Option<BlockDevice> {
    let link = sys.join(format!("dev/block/{major}:{minor}"));
    let mut dir = std::fs::canonicalize(link).ok()?;
    // A device mapper or md device stacks on others: follow the first slave down to a disk.
    for _ in 0..8 {
        let first_slave = std::fs::read_dir(dir.join("slaves"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .and_then(|e| std::fs::canonicalize(e.path()).ok());
        match first_slave {
            Some(s) => dir = s,
            None => break,
        }
    }
    // A partition's directory sits inside its disk's and has a `partition` file.
    if dir.join("partition").exists() {
        dir = dir.parent()?.to_path_buf();
    }
    let name = dir.file_name()?.to_str()?.to_string();
    let stat = sys.join("block").join(&name).join("stat");
    stat.exists().then_some(BlockDevice { name, stat })
}

/// Bytes written to `disk` since boot (`sectors written` × 512; the kernel counts 512-byte
/// sectors whatever the device's block size).
#[cfg(target_os = "linux")]
pub fn disk_written(disk: &BlockDevice) -> Option<u64> {
    disk_written_from(&disk.stat)
}

/// [`disk_written`] read from a `stat` file at `path`.
#[cfg(target_os = "linux")]
pub fn disk_written_from(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    // Fields: reads, reads merged, sectors read, ms reading, writes, writes merged,
    // sectors written, ...
    text.split_whitespace().nth(6)?.parse::<u64>().ok().map(|s| s * 512)
}

/// The active swap areas (`/proc/swaps`), `None` where it cannot be read.
#[cfg(target_os = "linux")]
pub fn swap_areas() -> Option<Vec<SwapArea>> {
    swap_areas_from(Path::new("/proc/swaps"))
}

/// [`swap_areas`] read from `path`.
#[cfg(target_os = "linux")]
pub fn swap_areas_from(path: &Path) -> Option<Vec<SwapArea>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let mut f = line.split_whitespace();
        let (Some(p), Some(kind), Some(kb)) = (f.next(), f.next(), f.next()) else { continue };
        let path = PathBuf::from(p.replace("\\040", " "));
        let disk = if kind == "partition" {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&path).ok().and_then(|m| {
                let r = m.rdev();
                disk_of_devnum(Path::new("/sys"), libc::major(r), libc::minor(r))
            })
        } else {
            block_device(&path)
        };
        out.push(SwapArea {
            path,
            disk: disk.map(|d| d.name),
            size: kb.parse::<u64>().unwrap_or(0) * 1024,
        });
    }
    Some(out)
}

/// Bytes this process read from and wrote to storage (`proc_pid_rusage`).
#[cfg(target_os = "macos")]
pub fn process_io() -> Option<ProcessIo> {
    let mut info = std::mem::MaybeUninit::<libc::rusage_info_v4>::zeroed();
    // SAFETY: `proc_pid_rusage` with `RUSAGE_INFO_V4` writes one `rusage_info_v4` to the
    // pointer, which is valid for it; our own pid is always ours to ask about.
    let rc = unsafe {
        libc::proc_pid_rusage(
            libc::getpid(),
            libc::RUSAGE_INFO_V4,
            info.as_mut_ptr().cast::<libc::rusage_info_t>(),
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialised plain integers, filled in by the successful call above.
    let info = unsafe { info.assume_init() };
    Some(ProcessIo { read: info.ri_diskio_bytesread, written: info.ri_diskio_byteswritten })
}

/// Creates `path` (which must not exist) for uncached writes (`F_NOCACHE`), or `None`.
#[cfg(target_os = "macos")]
pub fn create_direct(path: &Path) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::options().write(true).create_new(true).open(path).ok()?;
    // SAFETY: `fcntl` with an integer argument on a descriptor `f` keeps open; it changes only
    // how the kernel caches this file.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        drop(f);
        let _ = std::fs::remove_file(path);
        return None;
    }
    Some(f)
}

/// Swap traffic is not read on macOS ("n/a").
#[cfg(target_os = "macos")]
pub fn swap_pages() -> Option<SwapPages> {
    None
}

/// The disk's counters need IOKit, which sluice does not call on macOS ("n/a").
#[cfg(target_os = "macos")]
pub fn block_device(path: &Path) -> Option<BlockDevice> {
    let _ = path;
    None
}

/// Never reached on macOS ([`block_device`] is `None`).
#[cfg(target_os = "macos")]
pub fn disk_written(disk: &BlockDevice) -> Option<u64> {
    let _ = disk;
    None
}

/// Swap areas are not listed on macOS (the system manages swap files itself).
#[cfg(target_os = "macos")]
pub fn swap_areas() -> Option<Vec<SwapArea>> {
    None
}
