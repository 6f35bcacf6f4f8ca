//! The queue-based read backend, where the system has one: many reads handed to the kernel at
//! once by one thread, instead of one blocked thread per read in flight ([`crate::reader`]).
//!
//! - **Linux**: io_uring ([`crate::uring`]). The kernel may still refuse it at runtime (built
//!   out, `kernel.io_uring_disabled`, a seccomp filter); [`available`] asks by creating a ring.
//! - **macOS**: none. POSIX AIO there allows only a few requests in flight per process, so the
//!   pread pool (with `F_NOCACHE` descriptors, [`super::direct`]) is the reader; [`Ring`] is an
//!   uninhabited type, and [`available`] says why, so `--io auto` takes the pool and
//!   `--io uring` is refused with that reason.

use std::io;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "sluice-store/src/platform/ring.rs has no version for this OS: say whether it has a \
     queue-based read backend (Linux: io_uring) or, like macOS, only the pread pool"
);

/// The queue-based reader (io_uring).
#[cfg(target_os = "linux")]
pub use crate::uring::UringReader as Ring;

/// Whether this process may use the queue-based reader: creates (and drops) a small ring. The
/// error is the kernel's reason (`ENOSYS` not built in, `EPERM` disabled by sysctl or seccomp).
#[cfg(target_os = "linux")]
pub fn available() -> io::Result<()> {
    io_uring::IoUring::new(4).map(drop)
}

#[cfg(target_os = "macos")]
pub use macos::Ring;

/// Whether this process may use the queue-based reader: never on macOS.
#[cfg(target_os = "macos")]
pub fn available() -> io::Result<()> {
    Err(macos::unsupported())
}

#[cfg(target_os = "macos")]
mod macos {
    use crate::backend::ReadTask;
    use crate::io::ReadAt;
    use crate::reader::{JobHandle, Priority};
    use std::io;
    use std::sync::Arc;

    /// No queue-based reader exists on macOS: a value of this type cannot be made, so every
    /// method below is unreachable and exists only to keep [`crate::backend`] free of `cfg`s.
    #[derive(Debug)]
    pub enum Ring {}

    /// Why there is no ring.
    pub(super) fn unsupported() -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring is Linux-only; macOS reads through the pread pool",
        )
    }

    impl Ring {
        /// Always fails: macOS has no ring.
        pub fn new(depth: usize, reader: Arc<dyn ReadAt>) -> io::Result<Self> {
            let _ = (depth, reader);
            Err(unsupported())
        }

        /// Unreachable (no `Ring` exists).
        pub fn submit(&self, priority: Priority, task: Box<dyn ReadTask>) -> JobHandle {
            let _ = (priority, task);
            match *self {}
        }

        /// Unreachable (no `Ring` exists).
        pub fn kick(&self) {
            match *self {}
        }

        /// Unreachable (no `Ring` exists).
        pub fn depth(&self) -> usize {
            match *self {}
        }

        /// Unreachable (no `Ring` exists).
        pub fn name(&self) -> &'static str {
            match *self {}
        }

        /// Unreachable (no `Ring` exists).
        pub fn failure(&self) -> Option<&str> {
            match *self {}
        }
    }
}
