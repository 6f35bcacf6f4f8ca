//! The io_uring read backend: one ring and one driver thread keep up to `depth` reads in the
//! kernel at once, where the pread pool needs `depth` blocked threads for the same queue depth.
//!
//! Jobs wait in two queues, demand before prefetch, exactly as in the pool, and stay
//! cancellable ([`JobHandle::cancel`]) until the driver takes them. Callers queue a batch (a
//! layer's misses) and then [`UringReader::kick`] once: the driver wakes (an eventfd read is
//! always armed in the ring), turns every queued job it has room for into read SQEs and submits
//! them with one system call. Each read is prepared through [`ReadAt::prepare`] and its result
//! passed through [`ReadAt::complete`], so O_DIRECT's `EINVAL` falls back to the buffered
//! descriptor and injected faults apply; a short read is resubmitted for the rest of its span,
//! and a stalled read waits on a ring timeout before it is submitted.
//!
//! The ring's one system call, `io_uring_enter`, is retried when it fails with a transient error
//! (EINTR, EAGAIN, EBUSY), at most [`ENTER_ATTEMPTS`] times in a row; any other error, or that
//! many in a row, gives the ring up for good (module `limp`): every read that would need the ring
//! again fails with an error naming the system call and the OS error, reads the kernel already
//! holds end as the kernel completes them, and later jobs run on a pread pool started then.
//! `tests/uring_given_up.rs` makes the system call really fail, with a seccomp filter.

mod limp;

use crate::backend::{run_sync, ReadTask, SpanError, SpanTarget};
use crate::io::{ended_early, Completed, Prepared, PreparedRead, ReadAt};
use crate::reader::{JobHandle, Priority};
use io_uring::{opcode, squeue, types, IoUring};
use limp::Broken;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest single read submitted (Linux transfers at most 0x7fff_f000 bytes per read anyway).
const MAX_READ: usize = 1 << 30;
/// `user_data` of the armed eventfd read.
const WAKE: u64 = u64::MAX;
/// `user_data` of the cancellation of that read at shutdown.
const CANCEL: u64 = u64::MAX - 1;
/// Low bit of an op's `user_data`: set for its stall timer, clear for its read.
const TIMER: u64 = 1;
/// Failures of `io_uring_enter` in a row with a transient error (EINTR, EAGAIN, EBUSY) after
/// which the ring is given up. The waits between them double from 1 ms (about 0.5 s in all).
pub const ENTER_ATTEMPTS: u32 = 10;

struct Queued {
    task: Box<dyn ReadTask>,
    handle: JobHandle,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Queued>,
    prefetch: VecDeque<Queued>,
    shutdown: bool,
}

struct Shared {
    queues: Mutex<Queues>,
    wake: OwnedFd,
    /// Set once, with the queues locked, when the ring is given up.
    broken: OnceLock<Broken>,
    /// Wakes a driver whose ring is given up (it can no longer wait on the eventfd read).
    limp: Condvar,
}

impl Shared {
    fn queues(&self) -> MutexGuard<'_, Queues> {
        // Nothing runs under this lock but queue pushes and pops.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer to an eventfd this struct owns. A
        // failure (counter saturated) means a wake-up is already pending.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if self.broken.get().is_some() {
            self.limp.notify_all();
        }
    }
}

/// An io_uring reader (see the module docs).
pub struct UringReader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    depth: usize,
    /// What the fallback pool reads through once the ring is given up.
    reader: Arc<dyn ReadAt>,
}

impl std::fmt::Debug for UringReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringReader").field("depth", &self.depth).finish_non_exhaustive()
    }
}

impl UringReader {
    /// Creates a ring for `depth` (≥ 1) reads in flight and starts its driver thread. Fails
    /// with the kernel's error where io_uring is unavailable.
    pub fn new(depth: usize, reader: Arc<dyn ReadAt>) -> io::Result<Self> {
        let depth = depth.max(1);
        // Each op holds at most one SQE (its read or its stall timer), plus the wake read and
        // one cancel: at most `depth + 2` completions are ever outstanding, and the completion
        // queue (twice `entries`) holds them all, so no completion lands in the kernel's
        // overflow list, where a given-up ring could strand it.
        let entries = u32::try_from((depth + 2).next_power_of_two()).map_err(io::Error::other)?;
        let ring = IoUring::new(entries)?;
        // SAFETY: `eventfd` takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            wake,
            broken: OnceLock::new(),
            limp: Condvar::new(),
        });
        let mut driver = Driver {
            ring,
            shared: shared.clone(),
            reader: reader.clone(),
            depth,
            jobs: Vec::new(),
            ops: Vec::new(),
            ready: VecDeque::new(),
            live: 0,
            wake_buf: Box::new([0u8; 8]),
            wake_armed: false,
            unsubmitted: VecDeque::new(),
            stashed: Vec::new(),
            failures: 0,
        };
        let thread =
            std::thread::Builder::new().name("sluice-uring".into()).spawn(move || driver.run())?;
        Ok(Self { shared, thread: Some(thread), depth, reader })
    }

    /// Queues `task` at `priority`; it is submitted at the next [`UringReader::kick`]. Once the
    /// ring is given up, it goes to the fallback pool instead.
    pub fn submit(&self, priority: Priority, task: Box<dyn ReadTask>) -> JobHandle {
        let mut q = self.shared.queues();
        // Checked with the queues locked: the driver gives the ring up with them locked too, so
        // a job is either queued before and handed over by the driver, or goes to the pool here.
        if let Some(pool) = self.shared.broken.get().and_then(|b| b.pool.as_ref()) {
            drop(q);
            let reader = self.reader.clone();
            return pool.submit(priority, move || run_sync(task, &*reader));
        }
        let handle = JobHandle::queued();
        let job = Queued { task, handle: handle.clone() };
        match priority {
            Priority::Demand => q.demand.push_back(job),
            Priority::Prefetch => q.prefetch.push_back(job),
        }
        handle
    }

    /// Wakes the driver to submit what is queued.
    pub fn kick(&self) {
        self.shared.kick();
    }

    /// Reads in flight at most.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// `"io_uring"`, or `"pread"` once the ring is given up and the fallback pool reads.
    pub fn name(&self) -> &'static str {
        match self.shared.broken.get() {
            Some(b) if b.pool.is_some() => "pread",
            _ => "io_uring",
        }
    }

    /// Why the ring was given up (the system call and the OS error), if it was.
    pub fn failure(&self) -> Option<&str> {
        self.shared.broken.get().map(|b| b.message.as_str())
    }
}

impl Drop for UringReader {
    fn drop(&mut self) {
        let pending: Vec<Queued> = {
            let mut q = self.shared.queues();
            q.shutdown = true;
            let mut all: Vec<Queued> = q.demand.drain(..).collect();
            all.extend(q.prefetch.drain(..));
            all
        };
        // Dropped unrun: each task's own `Drop` reports the failure it needs to.
        for j in pending {
            j.handle.cancel();
        }
        self.shared.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A started job.
struct Running {
    task: Option<Box<dyn ReadTask>>,
    handle: JobHandle,
    ops_left: usize,
    total: u64,
    error: Option<SpanError>,
}

/// One span of a started job, read (and resubmitted after short reads) until `needed` bytes.
struct Op {
    job: usize,
    target: SpanTarget,
    needed: usize,
    got: usize,
    /// Whether one of its SQEs (read or stall timer) is pushed and its completion not reaped.
    pushed: bool,
    prepared: Option<PreparedRead>,
    /// A result to deliver when the stall timer expires, instead of submitting a read.
    held: Option<io::Result<usize>>,
    /// The stall timer's duration; boxed so its address stays put until the SQE is submitted.
    timeout: Box<types::Timespec>,
}

struct Driver {
    ring: IoUring,
    shared: Arc<Shared>,
    reader: Arc<dyn ReadAt>,
    depth: usize,
    jobs: Vec<Option<Running>>,
    ops: Vec<Option<Op>>,
    /// Ops to prepare and submit (new, or continuing after a short read or a retry).
    ready: VecDeque<usize>,
    /// Ops started and not yet ended.
    live: usize,
    /// The armed eventfd read's buffer; the ring is torn down only after that read has ended
    /// (or the buffer is leaked, when the ring was given up with the read in the kernel).
    wake_buf: Box<[u8; 8]>,
    /// Whether the eventfd read is pushed and its completion not reaped.
    wake_armed: bool,
    /// `user_data` of the SQEs pushed and not yet taken by the kernel, oldest first.
    unsubmitted: VecDeque<u64>,
    /// Completions taken off the ring to make room (after EBUSY) and not yet handled.
    stashed: Vec<(u64, i32)>,
    /// `io_uring_enter` failures in a row.
    failures: u32,
}

/// Index of the first free entry of `v` (pushing a new one if none).
fn slot<T>(v: &mut Vec<Option<T>>, item: T) -> usize {
    if let Some(i) = v.iter().position(Option::is_none) {
        v[i] = Some(item);
        i
    } else {
        v.push(Some(item));
        v.len() - 1
    }
}

impl Driver {
    fn run(&mut self) {
        self.arm_wake();
        while !self.is_broken() {
            let shutdown = self.take_jobs();
            while let Some(op) = self.ready.pop_front() {
                self.issue(op);
            }
            if shutdown && self.live == 0 {
                break;
            }
            // The eventfd read is always armed, so a kick ends this wait as a completion does.
            self.enter(1);
            self.reap();
        }
        if self.is_broken() {
            return self.limp();
        }
        // Cancel the wake read and wait for it to end before `wake_buf` can be freed.
        if self.push(opcode::AsyncCancel::new(WAKE).build().user_data(CANCEL)) {
            while self.wake_armed && self.enter(1) {
                for (ud, _) in self.ring.completion().map(|c| (c.user_data(), c.result())) {
                    self.wake_armed &= ud != WAKE;
                }
            }
        }
        self.forget_wake();
    }

    /// Submits what is queued and waits for `want` completions. A transient failure (EINTR,
    /// EAGAIN, EBUSY) returns true after a short wait, for the caller to try again; any other
    /// failure, or [`ENTER_ATTEMPTS`] in a row, gives the ring up ([`Driver::give_up`]) and
    /// returns false (as does every call after that).
    fn enter(&mut self, want: usize) -> bool {
        if self.is_broken() {
            return false;
        }
        let r = self.ring.submit_and_wait(want);
        // Whatever the result, the kernel may have taken some SQEs.
        let left = self.ring.submission().len();
        while self.unsubmitted.len() > left {
            self.unsubmitted.pop_front();
        }
        let e = match r {
            Ok(_) => {
                self.failures = 0;
                return true;
            }
            Err(e) => e,
        };
        self.failures += 1;
        let code = e.raw_os_error();
        if !matches!(code, Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
            self.give_up(&e, format!("io_uring_enter failed: {e}"));
            return false;
        }
        if self.failures >= ENTER_ATTEMPTS {
            let n = self.failures;
            self.give_up(&e, format!("io_uring_enter failed {n} times in a row: {e}"));
            return false;
        }
        if code == Some(libc::EBUSY) {
            // The completion queue is full: make room so the kernel can post what it holds.
            let cqes = self.ring.completion().map(|c| (c.user_data(), c.result()));
            self.stashed.extend(cqes);
        }
        if code != Some(libc::EINTR) {
            std::thread::sleep(Duration::from_millis(1 << (self.failures - 1).min(9)));
        }
        true
    }

    fn is_broken(&self) -> bool {
        self.shared.broken.get().is_some()
    }

    /// Starts queued jobs, demand first, while fewer than `depth` ops are live. Returns
    /// whether the reader is shutting down.
    fn take_jobs(&mut self) -> bool {
        loop {
            if self.live >= self.depth {
                return self.shared.queues().shutdown;
            }
            let job = {
                let mut q = self.shared.queues();
                match q.demand.pop_front().or_else(|| q.prefetch.pop_front()) {
                    Some(j) => j,
                    None => return q.shutdown,
                }
            };
            if !job.handle.try_start() {
                continue;
            }
            let mut task = job.task;
            let targets = task.start();
            let j = slot(
                &mut self.jobs,
                Running {
                    task: Some(task),
                    handle: job.handle,
                    ops_left: targets.len(),
                    total: 0,
                    error: None,
                },
            );
            if targets.is_empty() {
                self.finish_job(j);
                continue;
            }
            for target in targets {
                let needed = usize::try_from(target.span.needed()).unwrap_or(usize::MAX);
                let op = Op {
                    job: j,
                    target,
                    needed,
                    got: 0,
                    pushed: false,
                    prepared: None,
                    held: None,
                    timeout: Box::new(types::Timespec::new()),
                };
                let o = slot(&mut self.ops, op);
                self.live += 1;
                if needed > target.len {
                    let e = io::Error::other("slot region shorter than the span");
                    self.end_op(o, Err(e));
                } else {
                    self.ready.push_back(o);
                }
            }
        }
    }

    /// Prepares op `o`'s next read and submits it (or handles a result given at once). Once the
    /// ring is given up, the op fails instead.
    fn issue(&mut self, o: usize) {
        if self.is_broken() {
            return self.fail(o);
        }
        let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) else { return };
        let t = op.target;
        let offset = t.span.read_offset() + op.got as u64;
        let len = (t.len - op.got).min(MAX_READ);
        // SAFETY: `ReadTask`'s contract makes `t.buf..t.buf + t.len` this driver's until the
        // job finishes, which is after this op ends; `got < needed <= len` keeps it in bounds,
        // and no other reference to these bytes is alive while this one is.
        let buf = unsafe { std::slice::from_raw_parts_mut(t.buf.add(op.got), len) };
        let ud = (o as u64) << 1;
        let entry = match self.reader.prepare(t.span.file, offset, buf) {
            Prepared::Ready(r) => return self.advance(o, r),
            Prepared::After(d, r) => {
                op.held = Some(r);
                timer(&mut op.timeout, d).user_data(ud | TIMER)
            }
            Prepared::Read(p) => {
                let p = PreparedRead { len: p.len.min(len), ..p };
                op.prepared = Some(PreparedRead { delay: None, ..p });
                match p.delay {
                    Some(d) => timer(&mut op.timeout, d).user_data(ud | TIMER),
                    None => read_entry(&p, buf.as_mut_ptr(), offset).user_data(ud),
                }
            }
        };
        if !self.push(entry) {
            self.fail(o);
        }
    }

    /// Queues one SQE, submitting first if the queue is full. False when the ring is given up
    /// (before or while making room): the entry was not queued.
    fn push(&mut self, entry: squeue::Entry) -> bool {
        let ud = entry.get_user_data();
        loop {
            if self.is_broken() {
                return false;
            }
            // SAFETY: every buffer and timespec an entry points to lives in an op (or in
            // `wake_buf`) that is not freed before the entry's completion is reaped, or before
            // the ring is given up with the entry never taken by the kernel.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.unsubmitted.push_back(ud);
                match ud {
                    WAKE => self.wake_armed = true,
                    CANCEL => {}
                    _ => {
                        let o = usize::try_from(ud >> 1).unwrap_or(usize::MAX);
                        if let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) {
                            op.pushed = true;
                        }
                    }
                }
                return true;
            }
            self.enter(0);
        }
    }

    fn arm_wake(&mut self) {
        let fd = self.shared.wake.as_raw_fd();
        let e = opcode::Read::new(types::Fd(fd), self.wake_buf.as_mut_ptr(), 8).build();
        self.push(e.user_data(WAKE));
    }

    fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.stashed);
        done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for (ud, res) in done {
            match ud {
                WAKE => {
                    self.wake_armed = false;
                    // A given-up ring is not waited on, so its wake read is not re-armed.
                    if !self.is_broken() {
                        self.arm_wake();
                    }
                }
                CANCEL => {}
                _ => {
                    let o = usize::try_from(ud >> 1).unwrap_or(usize::MAX);
                    if let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) {
                        op.pushed = false;
                    }
                    if ud & TIMER != 0 {
                        self.after_stall(o);
                    } else {
                        self.read_done(o, res);
                    }
                }
            }
        }
    }

    /// A stall timer expired: deliver the result or submit the read it held back.
    fn after_stall(&mut self, o: usize) {
        let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) else { return };
        if let Some(r) = op.held.take() {
            return self.advance(o, r);
        }
        let Some(p) = op.prepared else { return };
        let offset = op.target.span.read_offset() + op.got as u64;
        // SAFETY: as in `issue`: in bounds of the op's target, which only this driver writes.
        let ptr = unsafe { op.target.buf.add(op.got) };
        if !self.push(read_entry(&p, ptr, offset).user_data((o as u64) << 1)) {
            self.fail(o);
        }
    }

    fn read_done(&mut self, o: usize, res: i32) {
        let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) else { return };
        let Some(p) = op.prepared.take() else { return };
        let offset = op.target.span.read_offset() + op.got as u64;
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(usize::try_from(res).unwrap_or(0))
        };
        match self.reader.complete(op.target.span.file, offset, &p, result) {
            Completed::Retry => self.ready.push_back(o),
            Completed::Done(r) => self.advance(o, r),
        }
    }

    /// Applies one read's result to op `o`: continue, retry, or end it.
    fn advance(&mut self, o: usize, r: io::Result<usize>) {
        let Some(op) = self.ops.get_mut(o).and_then(Option::as_mut) else { return };
        match r {
            Ok(0) => {
                let e = ended_early(&op.target.span, op.got);
                self.end_op(o, Err(e));
            }
            Ok(n) => {
                op.got += n;
                if op.got >= op.needed {
                    let got = op.got as u64;
                    self.end_op(o, Ok(got));
                } else {
                    self.ready.push_back(o);
                }
            }
            Err(e)
                if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) =>
            {
                self.ready.push_back(o);
            }
            Err(e) => self.end_op(o, Err(e)),
        }
    }

    fn end_op(&mut self, o: usize, r: io::Result<u64>) {
        let Some(op) = self.ops.get_mut(o).and_then(Option::take) else { return };
        self.live -= 1;
        let Some(job) = self.jobs.get_mut(op.job).and_then(Option::as_mut) else { return };
        job.ops_left -= 1;
        match r {
            Ok(n) => job.total += n,
            Err(error) => {
                if job.error.is_none() {
                    job.error = Some(SpanError { span: op.target.span, error });
                }
            }
        }
        if job.ops_left == 0 {
            self.finish_job(op.job);
        }
    }

    fn finish_job(&mut self, j: usize) {
        let Some(mut job) = self.jobs.get_mut(j).and_then(Option::take) else { return };
        let result = match job.error.take() {
            Some(e) => Err(e),
            None => Ok(job.total),
        };
        if let Some(task) = job.task.take() {
            // A panicking task must not take the driver (and every other read) with it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.finish(result)));
        }
        job.handle.done();
    }
}

/// A timeout SQE of `d`, whose duration is kept in `ts` (which must outlive its submission).
fn timer(ts: &mut types::Timespec, d: std::time::Duration) -> squeue::Entry {
    *ts = types::Timespec::new().sec(d.as_secs()).nsec(d.subsec_nanos());
    let ts: *const types::Timespec = ts;
    opcode::Timeout::new(ts).build()
}

/// The read SQE for prepared read `p` into `ptr` at `offset`.
fn read_entry(p: &PreparedRead, ptr: *mut u8, offset: u64) -> squeue::Entry {
    // `p.len` is at most `MAX_READ`, which fits a u32.
    let len = u32::try_from(p.len).unwrap_or(u32::MAX);
    opcode::Read::new(types::Fd(p.fd), ptr, len).offset(offset).build()
}
