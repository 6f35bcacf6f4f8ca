//! Every operating-system-specific call sluice makes, one module per concern, each holding its
//! Linux and its macOS version side by side. The rest of the workspace calls these functions and
//! never `libc`, `/proc` or `/sys` directly, so a port to another system fills in these files:
//!
//! - [`direct`]: reads that bypass the page cache (`O_DIRECT` / `F_NOCACHE` with read-ahead off);
//! - [`ring`]: the queue-based read backend where the system has one (io_uring on Linux);
//! - [`advice`]: dropping a file's cached pages (`posix_fadvise` / `msync(MS_INVALIDATE)`), and
//!   the whole page cache where this process may;
//! - [`residency`]: whether a file range is already in the page cache (`mincore`), and a
//!   descriptor without read-ahead to copy it from there;
//! - [`holes`]: giving a file range's blocks back (`fallocate(PUNCH_HOLE)` / `F_PUNCHHOLE`);
//! - [`memory`]: physical memory, limits and pressure, the default budget, and a memory limit for
//!   a child process (`sluice bench --cgroup-limit`);
//! - [`counters`]: peak resident set, bytes read from storage, load average;
//! - [`machine`]: what a run costs the machine (bytes written, swap, major faults, page-cache
//!   share, the disk's lifetime writes, swap areas, free space).
//!
//! Why here: `sluice-core` must not do I/O, and `sluice-store` is the lowest crate that does;
//! everything that needs these calls (the store's readers and disk cache, the engine's plan and
//! statistics, the CLI's `bench` and `probe`) already depends on it.
//!
//! On a system that is neither Linux nor macOS each module stops the build with a
//! `compile_error!` naming the piece to write, rather than compiling a fallback that would, for
//! example, read through the page cache outside the memory budget.

pub mod advice;
pub mod counters;
pub mod direct;
pub mod holes;
pub mod machine;
pub mod memory;
pub mod residency;
pub mod ring;

/// `(offset, len)` as the C `off_t` pair most of these calls take, or `InvalidInput` where a
/// value does not fit.
pub(crate) fn off_pair(offset: u64, len: u64) -> std::io::Result<(libc::off_t, libc::off_t)> {
    match (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
        (Ok(o), Ok(n)) => Ok((o, n)),
        _ => Err(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
    }
}
