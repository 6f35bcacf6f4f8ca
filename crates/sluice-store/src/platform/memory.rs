//! How much memory sluice may plan with, and a memory limit for a benchmark's child processes.
//!
//! - **Linux**: physical memory (`MemTotal` in `/proc/meminfo`) or this process's cgroup limit
//!   (v2 `memory.max`, v1 `memory.limit_in_bytes`), whichever is smaller. The default budget
//!   is 85% of that less 512 MiB for the OS. Pressure is not consulted: the cgroup limit is the
//!   contract. A child is limited by a v1 memory cgroup, which also charges its page cache.
//! - **macOS**: physical memory is `hw.memsize`; there are no cgroups. Memory is unified: the
//!   OS, the window server and the GPU take their share of the same RAM, and the kernel
//!   compresses and swaps rather than refusing, so the default budget leaves more room: 75% of
//!   `hw.memsize` less 2 GiB, and only 60% (warn) or 45% (critical) while
//!   `kern.memorystatus_vm_pressure_level` reports pressure at start. A child cannot be given a
//!   hard limit, so `sluice bench --cgroup-limit` is refused with that reason.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/memory.rs has no memory-size version for this OS (Linux reads \
     /proc/meminfo and cgroups, macOS hw.memsize and the pressure level): without it the \
     default --memory budget would be a guess"
);

/// The kernel's memory-pressure level at the time of asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// No pressure.
    Normal,
    /// The kernel is compressing or swapping to keep up.
    Warn,
    /// The kernel is about to end processes.
    Critical,
}

/// Memory this process may use: the smallest of physical memory and any limit on the process.
pub fn available() -> Option<u64> {
    match (physical(), limit()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Physical memory (`MemTotal`).
#[cfg(target_os = "linux")]
pub fn physical() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The memory limit of this process's own cgroup (v2 `memory.max` or v1
/// `memory.limit_in_bytes`, found through `/proc/self/cgroup`), if one is set.
#[cfg(target_os = "linux")]
pub fn limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut limits = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup/{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory/{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Some(v) =
            std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse::<u64>().ok())
        {
            limits.push(v);
        }
    }
    limits.into_iter().min()
}

/// Not consulted on Linux (see the module docs).
#[cfg(target_os = "linux")]
pub fn pressure() -> Option<Pressure> {
    None
}

/// The default budget: 85% of [`available`] less 512 MiB for the OS (8 GiB where unknown).
#[cfg(target_os = "linux")]
pub fn default_budget() -> u64 {
    available().map_or(8 << 30, |m| (m / 100 * 85).saturating_sub(512 << 20).max(256 << 20))
}

/// Physical memory (`hw.memsize`).
#[cfg(target_os = "macos")]
pub fn physical() -> Option<u64> {
    sysctl_by_name::<u64>(c"hw.memsize")
}

/// No per-process limit exists on macOS.
#[cfg(target_os = "macos")]
pub fn limit() -> Option<u64> {
    None
}

/// `kern.memorystatus_vm_pressure_level`: 1 normal, 2 warn, 4 critical.
#[cfg(target_os = "macos")]
pub fn pressure() -> Option<Pressure> {
    match sysctl_by_name::<i32>(c"kern.memorystatus_vm_pressure_level")? {
        1 => Some(Pressure::Normal),
        2 => Some(Pressure::Warn),
        4 => Some(Pressure::Critical),
        _ => None,
    }
}

/// The default budget: 75% of physical memory less 2 GiB (60% or 45% under pressure), since
/// the OS and the GPU share the same memory (8 GiB where unknown).
#[cfg(target_os = "macos")]
pub fn default_budget() -> u64 {
    let percent = match pressure() {
        Some(Pressure::Critical) => 45,
        Some(Pressure::Warn) => 60,
        Some(Pressure::Normal) | None => 75,
    };
    available().map_or(8 << 30, |m| (m / 100 * percent).saturating_sub(2 << 30).max(256 << 20))
}

/// One fixed-size value read with `sysctlbyname`, or `None` if the name is unknown.
#[cfg(target_os = "macos")]
fn sysctl_by_name<T: Copy + Default>(name: &std::ffi::CStr) -> Option<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: `value` is `len` writable bytes that live across the call; the kernel writes at
    // most `len` bytes there and sets `len` to what it wrote. `name` is NUL-terminated.
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            std::ptr::from_mut(&mut value).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0 && len == std::mem::size_of::<T>()).then_some(value)
}

/// A hard memory limit for child processes (`sluice bench --cgroup-limit`), removed on drop.
#[derive(Debug)]
pub struct ChildLimit {
    dir: PathBuf,
}

impl ChildLimit {
    /// Creates a v1 memory cgroup limited to `bytes` (page cache included).
    #[cfg(target_os = "linux")]
    pub fn new(bytes: u64) -> io::Result<Self> {
        let dir =
            PathBuf::from(format!("/sys/fs/cgroup/memory/sluice-bench-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating the memory cgroup {} (cgroup v1 writable?): {e}", dir.display()),
            )
        })?;
        let limit = Self { dir };
        let file = limit.dir.join("memory.limit_in_bytes");
        std::fs::write(&file, bytes.to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("setting {}: {e}", file.display())))?;
        Ok(limit)
    }

    /// Refused: macOS cannot give a process a hard memory limit.
    #[cfg(target_os = "macos")]
    pub fn new(bytes: u64) -> io::Result<Self> {
        let _ = bytes;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a hard memory limit for child processes needs a Linux memory cgroup; macOS has \
             none (run without --cgroup-limit; --memory still bounds sluice itself)",
        ))
    }

    /// The limit's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command that runs `exe` inside the limit: a shell moves itself into the group, then
    /// becomes `exe`, so nothing the child allocates escapes it.
    pub fn command(&self, exe: &Path) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.dir.join("cgroup.procs"))
            .arg(exe);
        c
    }
}

impl Drop for ChildLimit {
    fn drop(&mut self) {
        // The children have exited; an empty group can be removed.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_reports_its_memory_and_a_budget_below_it() {
        let m = physical().expect("physical memory is known on Linux and macOS");
        assert!(m >= 256 << 20, "{m}");
        let avail = available().expect("available");
        assert!(avail <= m);
        assert!(default_budget() < avail.max(256 << 20) + 1);
    }
}
