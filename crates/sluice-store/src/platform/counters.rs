//! What a run reports about its own process: peak resident set and the bytes the kernel read
//! from storage for it (spine pages faulted in, uncached expert reads), plus the system's load
//! average, which `sluice bench` records beside each measurement.
//!
//! - **Linux**: `VmHWM` of `/proc/self/status` (what `getrusage`'s `ru_maxrss` reports, there
//!   in KiB), `read_bytes` of `/proc/self/io`, and `/proc/loadavg`.
//! - **macOS**: `getrusage`'s `ru_maxrss`, which macOS reports in bytes, not KiB;
//!   `ri_diskio_bytesread` of `proc_pid_rusage(RUSAGE_INFO_V4)`; and `getloadavg`.

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/counters.rs has no process-counter version for this OS (Linux \
     reads /proc/self/status and /proc/self/io, macOS getrusage and proc_pid_rusage): --stats \
     could not report peak memory or bytes read"
);

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where unknown.
#[cfg(target_os = "linux")]
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| {
            st.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb * 1024)
}

/// Bytes this process has caused to be fetched from storage (`read_bytes` of
/// `/proc/self/io`), or `None` where the kernel does not report it.
#[cfg(target_os = "linux")]
pub fn read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// The one-minute load average.
#[cfg(target_os = "linux")]
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Peak resident set size of this process in bytes (`ru_maxrss`, bytes on macOS), 0 where
/// unknown.
#[cfg(target_os = "macos")]
pub fn peak_rss() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `rusage` to the pointer, which is valid for it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: zero-initialised plain integers, filled in by the successful call above.
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_maxrss).unwrap_or(0)
}

/// Bytes this process has read from storage (`ri_diskio_bytesread`), or `None` where the
/// kernel does not report it.
#[cfg(target_os = "macos")]
pub fn read_bytes() -> Option<u64> {
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
    Some(unsafe { info.assume_init() }.ri_diskio_bytesread)
}

/// The one-minute load average.
#[cfg(target_os = "macos")]
pub fn load_average() -> Option<f64> {
    let mut avg = [0f64; 1];
    // SAFETY: `getloadavg` writes at most `nelem` (1) doubles to the array.
    let n = unsafe { libc::getloadavg(avg.as_mut_ptr(), 1) };
    (n == 1).then_some(avg[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reports_its_counters() {
        let buf = std::hint::black_box(vec![1u8; 8 << 20]);
        assert!(peak_rss() >= buf.len() as u64, "peak RSS counts the 8 MiB just touched");
        assert!(read_bytes().is_some(), "Linux and macOS report bytes read");
        assert!(load_average().is_some_and(|l| l >= 0.0));
        drop(buf);
    }
}
