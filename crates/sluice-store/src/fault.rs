//! A fault-injecting [`ReadAt`] wrapper for tests: fail the Nth read (or reads of one byte
//! range) with an OS error, return short reads, stall, or pretend a file ends early. Faults
//! are rules added at any time through `&self`, so a test can break reads mid-run and then
//! [`FaultyReader::clear`] them to check that the next request works.
//!
//! The same rules apply to reads done by the io_uring backend, through [`ReadAt::prepare`]: an
//! error or an end of file completes the read without submitting it, a short read submits
//! fewer bytes, and a stall delays the submission (the ring waits, not a thread).

use crate::io::{Completed, Prepared, PreparedRead, ReadAt};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What happens to a read a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail with this OS error number (e.g. `libc::EIO`).
    Error(i32),
    /// Return at most this many bytes (at least 1).
    Short(usize),
    /// Sleep this long, then read normally.
    Stall(Duration),
    /// The file appears to end at this length.
    Truncate(u64),
}

/// Which reads a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The `n`-th call of [`ReadAt::read_at`] on this wrapper, counting from 1.
    Nth(u64),
    /// Every read.
    Always,
    /// Reads of `file`.
    File(usize),
    /// Reads of `file` that overlap bytes `start..end`.
    Overlaps {
        /// Shard index.
        file: usize,
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    when: When,
    fault: Fault,
    remaining: Option<u64>,
}

/// Wraps a reader and injects [`Fault`]s into the reads that rules match.
#[derive(Debug)]
pub struct FaultyReader<R> {
    inner: R,
    rules: Mutex<Vec<Rule>>,
    calls: AtomicU64,
    faults: AtomicU64,
    /// Wakes [`FaultyReader::wait_faults`] when a rule has altered a read.
    faulted: (Mutex<()>, Condvar),
}

impl<R: ReadAt> FaultyReader<R> {
    /// A wrapper that injects nothing until rules are added.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            rules: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            faulted: (Mutex::new(()), Condvar::new()),
        }
    }

    /// Adds a rule: reads matching `when` suffer `fault`, for the next `times` matches
    /// (`None`: for ever).
    pub fn inject(&self, when: When, fault: Fault, times: Option<u64>) {
        self.rules().push(Rule { when, fault, remaining: times });
    }

    /// Fails the `n`-th read from now with `errno`.
    pub fn fail_nth(&self, n: u64, errno: i32) {
        let at = self.calls().saturating_add(n.max(1));
        self.inject(When::Nth(at), Fault::Error(errno), Some(1));
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules().clear();
    }

    /// Calls of `read_at` so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Acquire)
    }

    /// Reads that a rule altered so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::Acquire)
    }

    /// Waits until rules have altered at least `n` reads (a stalled read counts when its
    /// stall begins) or `timeout` passes; returns whether they had. Tests wait on this event
    /// instead of sleeping.
    pub fn wait_faults(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &self.faulted;
        let mut g = lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while self.faults() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = cv.wait_timeout(g, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
        true
    }

    /// The wrapped reader.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn rules(&self) -> MutexGuard<'_, Vec<Rule>> {
        // A panic while holding this lock cannot leave the rule list inconsistent.
        self.rules.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl When {
    fn matches(&self, call: u64, file: usize, offset: u64, len: u64) -> bool {
        match *self {
            When::Nth(n) => n == call,
            When::Always => true,
            When::File(f) => f == file,
            When::Overlaps { file: f, start, end } => {
                f == file && offset < end && offset.saturating_add(len) > start
            }
        }
    }
}

/// What the rules decided for one read.
struct Decision {
    stall: Option<Duration>,
    error: Option<i32>,
    limit: usize,
}

impl<R: ReadAt> FaultyReader<R> {
    /// Counts the call and applies every matching rule to a read of `len` bytes.
    fn decide(&self, file: usize, offset: u64, len: usize) -> Decision {
        let call = self.calls.fetch_add(1, Ordering::AcqRel) + 1;
        let mut hits: Vec<Fault> = Vec::new();
        {
            let mut rules = self.rules();
            for r in rules.iter_mut() {
                if r.remaining != Some(0) && r.when.matches(call, file, offset, len as u64) {
                    hits.push(r.fault);
                    if let Some(n) = &mut r.remaining {
                        *n -= 1;
                    }
                }
            }
            rules.retain(|r| r.remaining != Some(0));
        }
        if !hits.is_empty() {
            self.faults.fetch_add(1, Ordering::AcqRel);
            // Taken so a waiter between its check and its wait cannot miss this wake-up.
            let _g = self.faulted.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.faulted.1.notify_all();
        }
        let mut d = Decision { stall: None, error: None, limit: len };
        for f in hits {
            match f {
                Fault::Stall(t) => d.stall = Some(d.stall.unwrap_or_default() + t),
                Fault::Error(code) => d.error = d.error.or(Some(code)),
                Fault::Short(max) => d.limit = d.limit.min(max.max(1)),
                Fault::Truncate(end) => {
                    let room = usize::try_from(end.saturating_sub(offset)).unwrap_or(usize::MAX);
                    d.limit = d.limit.min(room);
                }
            }
        }
        d
    }
}

impl<R: ReadAt> FaultyReader<R> {
    /// A synchronous read with this reader's faults: the stall, the error or the short count
    /// decided for it, else `read` of the part of `buf` the count allows.
    fn faulty_read(
        &self,
        (file, offset): (usize, u64),
        buf: &mut [u8],
        read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let d = self.decide(file, offset, buf.len());
        if let Some(t) = d.stall {
            std::thread::sleep(t);
        }
        if let Some(code) = d.error {
            return Err(io::Error::from_raw_os_error(code));
        }
        match buf.get_mut(..d.limit) {
            Some(part) if !part.is_empty() => read(part),
            _ => Ok(0),
        }
    }
}

impl<R: ReadAt> ReadAt for FaultyReader<R> {
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.faulty_read((file, offset), buf, |part| self.inner.read_at(file, offset, part))
    }

    /// The same faults as [`ReadAt::read_at`], in front of the wrapped reader's copy from the
    /// page cache (the spine store's path for resident ranges), so fault tests reach it too.
    fn read_at_cached(&self, file: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.faulty_read((file, offset), buf, |part| self.inner.read_at_cached(file, offset, part))
    }

    fn prepare(&self, file: usize, offset: u64, buf: &mut [u8]) -> Prepared {
        let d = self.decide(file, offset, buf.len());
        let now_or_later = |r| match d.stall {
            Some(t) => Prepared::After(t, r),
            None => Prepared::Ready(r),
        };
        if let Some(code) = d.error {
            return now_or_later(Err(io::Error::from_raw_os_error(code)));
        }
        let Some(part) = buf.get_mut(..d.limit).filter(|p| !p.is_empty()) else {
            return now_or_later(Ok(0));
        };
        match self.inner.prepare(file, offset, part) {
            Prepared::Read(mut p) => {
                p.delay = match (p.delay, d.stall) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                Prepared::Read(p)
            }
            Prepared::Ready(r) => now_or_later(r),
            Prepared::After(t, r) => Prepared::After(t + d.stall.unwrap_or_default(), r),
        }
    }

    fn complete(
        &self,
        file: usize,
        offset: u64,
        p: &PreparedRead,
        result: io::Result<usize>,
    ) -> Completed {
        self.inner.complete(file, offset, p, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Zeros;

    impl ReadAt for Zeros {
        fn read_at(&self, _file: usize, _offset: u64, buf: &mut [u8]) -> io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
    }

    #[test]
    fn rules_fire_as_asked() {
        let r = FaultyReader::new(Zeros);
        let mut buf = [1u8; 100];
        r.fail_nth(2, libc::EIO);
        assert_eq!(r.read_at(0, 0, &mut buf).expect("first read is fine"), 100);
        let err = r.read_at(0, 0, &mut buf).expect_err("second read fails");
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert_eq!(r.read_at(0, 0, &mut buf).expect("third is fine"), 100);

        r.inject(When::File(1), Fault::Short(7), None);
        assert_eq!(r.read_at(1, 0, &mut buf).expect("short"), 7);
        assert_eq!(r.read_at(0, 0, &mut buf).expect("other file"), 100);

        r.inject(When::Always, Fault::Truncate(150), None);
        assert_eq!(r.read_at(0, 120, &mut buf).expect("cut"), 30);
        assert_eq!(r.read_at(0, 200, &mut buf).expect("past end"), 0);
        r.clear();

        r.inject(When::Overlaps { file: 0, start: 50, end: 60 }, Fault::Error(libc::EIO), Some(1));
        assert!(r.read_at(0, 60, &mut buf[..10]).is_ok(), "does not overlap");
        assert!(r.read_at(0, 0, &mut buf).is_err(), "overlaps");
        assert!(r.read_at(0, 0, &mut buf).is_ok(), "rule used up");
        assert_eq!(r.faults(), 5);
    }
}
