//! The two ways reads reach the disk, behind one submission API ([`Readers`]): the kernel's
//! io_uring (one ring at the configured queue depth; Linux only, [`crate::platform::ring`]) or
//! the pread pool ([`crate::reader`], that many threads each blocked in `pread`). Which one runs
//! is chosen at runtime ([`IoBackend::Auto`]): io_uring when the kernel lets this process create
//! a ring (it may be compiled out, disabled by `kernel.io_uring_disabled`, or refused by a
//! seccomp filter; macOS has none), the pool otherwise.
//!
//! A job is a [`ReadTask`]: when a backend starts it, it names the spans to read and the memory
//! they go to; when every span is in (or one failed), the backend calls its `finish`. Both
//! backends read through the same [`ReadAt`] seam, so injected faults reach either.

use crate::index::Span;
use crate::io::{read_span, ReadAt};
use crate::platform::ring::{self, Ring};
use crate::reader::{JobHandle, Priority, ReaderPool};
use crate::StoreError;
use std::io;
use std::sync::Arc;

/// Which read backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// io_uring when the kernel allows it, else the pread pool.
    #[default]
    Auto,
    /// io_uring, or an error where the kernel refuses it.
    Uring,
    /// The pread thread pool.
    Pread,
}

impl IoBackend {
    /// Parses `auto`, `uring` or `pread`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "uring" | "io_uring" => Some(Self::Uring),
            "pread" => Some(Self::Pread),
            _ => None,
        }
    }

    /// The concrete backends this process can read through, in a fixed order: io_uring first
    /// when the kernel lets this process create a ring ([`uring_available`] says why not),
    /// then the pread pool, which always works. Never [`IoBackend::Auto`]. For running the
    /// same reads on every backend: the tests, and `sluice probe --io both`.
    pub fn usable() -> Vec<Self> {
        match uring_available() {
            Ok(()) => vec![Self::Uring, Self::Pread],
            Err(_) => vec![Self::Pread],
        }
    }

    /// The name [`Readers::name`] reports for this backend once it runs: `"io_uring"` or
    /// `"pread"` (`"auto"` for [`IoBackend::Auto`], which becomes one of the two).
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Uring => "io_uring",
            Self::Pread => "pread",
        }
    }
}

/// Whether this process may use io_uring: creates (and drops) a small ring. The error is the
/// kernel's reason (`ENOSYS` not built in, `EPERM` disabled by sysctl or seccomp, ...; on macOS,
/// that io_uring is Linux-only).
pub fn uring_available() -> io::Result<()> {
    ring::available()
}

/// Where one span's aligned read region goes.
#[derive(Debug, Clone, Copy)]
pub struct SpanTarget {
    /// The span.
    pub span: Span,
    /// First byte of the destination (the span's aligned read region).
    pub buf: *mut u8,
    /// Bytes at `buf` (the span's [`Span::region_len`]).
    pub len: usize,
}

// SAFETY: a `SpanTarget` is only an address; `ReadTask`'s contract makes the memory exclusively
// the reading backend's from `start` to `finish`, whichever thread that runs on.
unsafe impl Send for SpanTarget {}

/// A failed span: the span and the error (`UnexpectedEof` for a file that ended first).
#[derive(Debug)]
pub struct SpanError {
    /// The span whose read failed.
    pub span: Span,
    /// Why.
    pub error: io::Error,
}

/// One read job.
///
/// # Safety
/// Every [`SpanTarget`] returned by `start` must point to `len` bytes that stay valid and that
/// nothing else reads or writes until `finish` has been called or the task has been dropped;
/// the backend writes the file's bytes there from any thread.
pub unsafe trait ReadTask: Send + 'static {
    /// Called once when a backend starts the job (never for a job cancelled while queued).
    /// Returns the spans to read; none is allowed (the job then finishes with `Ok(0)`).
    fn start(&mut self) -> Vec<SpanTarget>;
    /// Called once when every span is read (`Ok(total bytes transferred)`) or one failed (the
    /// first failure; the others have ended too, so the memory is free again).
    fn finish(self: Box<Self>, result: Result<u64, SpanError>);
}

/// A running read backend.
#[derive(Debug)]
pub enum Readers {
    /// io_uring.
    Uring(Ring),
    /// The pread pool and the reader its threads call.
    Pread {
        /// The threads.
        pool: ReaderPool,
        /// What they read through.
        reader: Arc<dyn ReadAt>,
        /// Why io_uring is not used, when it was asked for with `auto` and refused.
        fallback: Option<String>,
    },
}

impl Readers {
    /// Starts `backend` with `depth` reads in flight (ring entries or threads), reading
    /// through `reader`.
    pub fn start(
        backend: IoBackend,
        depth: usize,
        reader: Arc<dyn ReadAt>,
    ) -> Result<Self, StoreError> {
        let depth = depth.max(1);
        let pool = |reader, fallback| {
            let pool = ReaderPool::new(depth).map_err(|e| {
                StoreError::Config(format!("cannot start {depth} reader threads: {e}"))
            })?;
            Ok(Self::Pread { pool, reader, fallback })
        };
        match backend {
            IoBackend::Pread => pool(reader, None),
            IoBackend::Uring => Ring::new(depth, reader)
                .map(Self::Uring)
                .map_err(|e| StoreError::Config(format!("io_uring is not available: {e}"))),
            IoBackend::Auto => match Ring::new(depth, reader.clone()) {
                Ok(u) => Ok(Self::Uring(u)),
                Err(e) => pool(reader, Some(e.to_string())),
            },
        }
    }

    /// Queues `task` at `priority`. An io_uring backend submits it at the next
    /// [`Readers::kick`] (so a layer's misses go to the kernel as one batch); the pool starts
    /// it as soon as a thread is free.
    pub fn submit(&self, priority: Priority, task: Box<dyn ReadTask>) -> JobHandle {
        match self {
            Self::Uring(u) => u.submit(priority, task),
            Self::Pread { pool, reader, .. } => {
                let reader = reader.clone();
                pool.submit(priority, move || run_sync(task, &*reader))
            }
        }
    }

    /// Hands everything queued since the last kick to the kernel (no-op for the pool).
    pub fn kick(&self) {
        if let Self::Uring(u) = self {
            u.kick();
        }
    }

    /// `"io_uring"` or `"pread"` (also for an io_uring backend whose ring was given up after
    /// `io_uring_enter` failed: its reads then run on a pread pool, see [`crate::uring`]).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Uring(u) => u.name(),
            Self::Pread { .. } => "pread",
        }
    }

    /// Why `auto` fell back to the pool, if it did, or why a running ring was given up.
    pub fn fallback_reason(&self) -> Option<&str> {
        match self {
            Self::Pread { fallback, .. } => fallback.as_deref(),
            Self::Uring(u) => u.failure(),
        }
    }

    /// Reads in flight at most (queue depth or threads).
    pub fn depth(&self) -> usize {
        match self {
            Self::Uring(u) => u.depth(),
            Self::Pread { pool, .. } => pool.threads(),
        }
    }
}

/// Runs `task` on the calling thread with [`read_span`]: a one-span task (a whole Kimi K3 expert)
/// in place; a task of several spans (an expert whose parts are separate runs of a shard: one
/// per stacked tensor in GPT-OSS, one per matrix in Qwen3-MoE when its tensors are apart) reads
/// them concurrently, one scoped thread per span after the first, so its latency is its slowest
/// span's rather than their sum. The first failing span (in span order) is reported.
pub(crate) fn run_sync(mut task: Box<dyn ReadTask>, reader: &dyn ReadAt) {
    let targets = task.start();
    let read = |t: SpanTarget| {
        // SAFETY: `ReadTask`'s contract: `t.buf..t.buf + t.len` is valid and ours alone until
        // `finish`, which is called below, after every read has returned; the spans of a task
        // land in disjoint regions of its slot, so concurrent reads never share a byte.
        let region = unsafe { std::slice::from_raw_parts_mut(t.buf, t.len) };
        read_span(reader, &t.span, region).map_err(|error| SpanError { span: t.span, error })
    };
    let results: Vec<Result<u64, SpanError>> = match targets.split_first() {
        None => Vec::new(),
        Some((&first, [])) => vec![read(first)],
        Some((&first, rest)) => std::thread::scope(|s| {
            let others: Vec<_> = rest.iter().map(|&t| (t.span, s.spawn(move || read(t)))).collect();
            let mut all = vec![read(first)];
            all.extend(others.into_iter().map(|(span, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(SpanError { span, error: io::Error::other("a span reader panicked") })
                })
            }));
            all
        }),
    };
    let mut total = 0u64;
    for r in results {
        match r {
            Ok(n) => total += n,
            Err(e) => return task.finish(Err(e)),
        }
    }
    task.finish(Ok(total));
}
