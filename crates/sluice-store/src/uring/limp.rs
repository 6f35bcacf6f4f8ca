//! The io_uring driver after its ring is given up ([`Driver::give_up`]): `io_uring_enter` failed
//! with an error that is not transient, or with a transient one [`super::ENTER_ATTEMPTS`] times
//! in a row, so nothing more can be submitted to the ring or waited for on it.
//!
//! Nothing may hang and no buffer may be freed while the kernel can still write it. So reads
//! whose SQEs the kernel never took (and ops waiting to be issued) fail at once with the error,
//! which names the system call and the OS error; reads the kernel took end as the kernel completes
//! them — their completions still arrive in the shared completion queue without a system call of
//! ours, posted as task work when this thread next returns from the kernel, which a short timed
//! wait makes it do — and if one then needs the ring again (a short read, a stall timer, an
//! O_DIRECT retry) it fails too. Jobs that were queued when the ring was given up, and every job
//! submitted afterwards, run on a pread pool started then ([`Broken::pool`]), through the same
//! [`crate::io::ReadAt`] as before; if its threads cannot be started, they fail with the error.

use super::{Driver, Queued, TIMER, WAKE};
use crate::backend::{run_sync, SpanError};
use crate::reader::{Priority, ReaderPool};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::PoisonError;
use std::time::Duration;

/// Why the ring was given up, and what reads instead.
pub(super) struct Broken {
    /// `io_uring_enter failed: …`: the system call and the OS error.
    pub(super) message: String,
    /// The OS error's kind, kept by every read error made from `message`.
    kind: io::ErrorKind,
    /// The threads that run jobs from now on (`None` if they could not be started, or the
    /// reader was shutting down: later jobs then fail with `message`).
    pub(super) pool: Option<ReaderPool>,
}

impl Broken {
    /// A read error for one failed read.
    fn error(&self) -> io::Error {
        io::Error::new(self.kind, self.message.clone())
    }
}

impl Driver {
    /// Gives the ring up after `io_uring_enter` failed with `e` (see the module docs): records
    /// why, starts the fallback pool, hands it every queued job, and fails every op the kernel
    /// does not hold.
    pub(super) fn give_up(&mut self, e: &io::Error, message: String) {
        let shutting_down = self.shared.queues().shutdown;
        let pool = if shutting_down { None } else { ReaderPool::new(self.depth).ok() };
        let (demand, prefetch) = {
            // With the queues locked, so that `UringReader::submit` either queued a job before
            // (it is handed over below) or sees the pool.
            let mut q = self.shared.queues();
            let _ = self.shared.broken.set(Broken { message, kind: e.kind(), pool });
            (std::mem::take(&mut q.demand), std::mem::take(&mut q.prefetch))
        };
        for j in demand {
            self.hand_over(j, Priority::Demand);
        }
        for j in prefetch {
            self.hand_over(j, Priority::Prefetch);
        }
        let stranded: Vec<usize> = (0..self.ops.len()).filter(|&o| !self.in_kernel(o)).collect();
        self.ready.clear();
        for o in stranded {
            self.fail(o);
        }
    }

    /// The driver loop once the ring is given up: ends the ops the kernel still holds as their
    /// completions come in, fails what would need the ring, hands queued jobs over, and returns
    /// at shutdown once the kernel holds no op.
    pub(super) fn limp(&mut self) {
        loop {
            self.reap();
            while let Some(o) = self.ready.pop_front() {
                self.fail(o);
            }
            let (jobs, shutdown) = {
                let mut q = self.shared.queues();
                let mut jobs: Vec<(Queued, Priority)> =
                    q.demand.drain(..).map(|j| (j, Priority::Demand)).collect();
                jobs.extend(q.prefetch.drain(..).map(|j| (j, Priority::Prefetch)));
                (jobs, q.shutdown)
            };
            for (j, p) in jobs {
                self.hand_over(j, p);
            }
            if shutdown && self.live == 0 {
                break;
            }
            let q = self.shared.queues();
            if q.demand.is_empty() && q.prefetch.is_empty() && !q.shutdown {
                // A kick (jobs queued when there is no pool) or shutdown ends this wait early.
                let wait = Duration::from_millis(if self.live > 0 { 1 } else { 1000 });
                let r = self.shared.limp.wait_timeout(q, wait);
                drop(r.unwrap_or_else(PoisonError::into_inner));
            }
        }
        self.forget_wake();
    }

    /// Leaks the eventfd read's buffer if the kernel still holds that read: only the ring's
    /// teardown, after this driver is gone, cancels it, and until then a kick could fill it.
    pub(super) fn forget_wake(&mut self) {
        if self.wake_armed && !self.unsubmitted.contains(&WAKE) {
            Box::leak(std::mem::replace(&mut self.wake_buf, Box::new([0u8; 8])));
        }
    }

    /// Whether the kernel holds an SQE of op `o` (taken by it, completion not yet reaped).
    fn in_kernel(&self, o: usize) -> bool {
        let ud = (o as u64) << 1;
        self.ops.get(o).and_then(Option::as_ref).is_some_and(|op| {
            op.pushed && !self.unsubmitted.iter().any(|&u| u == ud || u == ud | TIMER)
        })
    }

    /// Ends op `o` (if it is still live) with the error the ring was given up with.
    pub(super) fn fail(&mut self, o: usize) {
        let e = self.broken_error();
        self.end_op(o, Err(e));
    }

    fn broken_error(&self) -> io::Error {
        match self.shared.broken.get() {
            Some(b) => b.error(),
            None => io::Error::other("invariant: the io_uring ring was given up"),
        }
    }

    /// Runs a job that never reached the ring on the fallback pool, or fails it if there is
    /// none. The caller keeps the job's handle, so it can still cancel the job until a pool
    /// thread takes it (then the task is dropped unrun, as the driver would have dropped it).
    fn hand_over(&self, job: Queued, priority: Priority) {
        let Some(pool) = self.shared.broken.get().and_then(|b| b.pool.as_ref()) else {
            return self.fail_unstarted(job);
        };
        let reader = self.reader.clone();
        pool.submit(priority, move || {
            if job.handle.try_start() {
                let task = job.task;
                // The handle is marked done even if the task panics (the pool survives it).
                let _ = catch_unwind(AssertUnwindSafe(|| run_sync(task, &*reader)));
                job.handle.done();
            }
        });
    }

    /// Starts `job` and finishes it at once with the ring's error (on its first span).
    fn fail_unstarted(&self, job: Queued) {
        if !job.handle.try_start() {
            return;
        }
        let mut task = job.task;
        let targets = task.start();
        let result = match targets.first() {
            Some(t) => Err(SpanError { span: t.span, error: self.broken_error() }),
            None => Ok(0),
        };
        let _ = catch_unwind(AssertUnwindSafe(|| task.finish(result)));
        job.handle.done();
    }
}
