//! Admission and the job queue between the HTTP handlers and the engine thread.
//!
//! One generation runs at a time; up to `queue` more requests may wait (or be tokenized) behind
//! it. A handler first [`Scheduler::reserve`]s a slot — refused at once with 429 when
//! `running + waiting + reserved` would exceed `1 + queue` — then prepares its prompt off the
//! async threads and [`Reservation::submit`]s the job. The engine thread takes jobs in FIFO order.
//!
//! Cancellation: the handler (or the SSE stream) owns a [`JobHandle`]. Dropping it — the client
//! disconnected, or the response is complete — raises the job's cancel flag, which the engine
//! polls at every pass boundary, and removes the job from the queue if it has not started, so
//! its slot is free at once. A job removed from the queue that way counts as a cancelled
//! generation, as does one stopped while running (the engine thread counts those).
//!
//! Shutdown ([`Scheduler::shutdown`], on SIGINT or SIGTERM): the running job is cancelled at its
//! next pass boundary, every queued job and every job submitted afterwards is answered
//! [`Event::ShuttingDown`] (503), and no new request is admitted.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::worker::{Event, Job};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<Job>,
    reserved: usize,
    running: bool,
    closed: bool,
}

/// The bounded FIFO queue in front of the engine.
#[derive(Debug)]
pub struct Scheduler {
    inner: Mutex<Inner>,
    ready: Condvar,
    queue_limit: usize,
    metrics: Arc<Metrics>,
    /// Raised by [`Scheduler::shutdown`]; the engine polls it with the job's own cancel flag.
    stopping: AtomicBool,
}

/// A slot held while a request is prepared; dropped without submitting, it frees the slot.
#[derive(Debug)]
pub struct Reservation {
    sched: Arc<Scheduler>,
    held: bool,
}

/// The handler's hold on a submitted job.
#[derive(Debug)]
pub struct JobHandle {
    id: u64,
    cancel: Arc<AtomicBool>,
    sched: Arc<Scheduler>,
}

impl Scheduler {
    /// A scheduler admitting one running job and `queue_limit` waiting ones, counting the
    /// queued jobs whose handles are dropped in `metrics`.
    pub fn new(queue_limit: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
            queue_limit,
            metrics,
            stopping: AtomicBool::new(false),
        })
    }

    /// The lock; a panic elsewhere while holding it leaves data that is still consistent (every
    /// critical section is a few field updates), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a slot, or answers 429.
    pub fn reserve(self: &Arc<Self>) -> Result<Reservation, ApiError> {
        let mut g = self.lock();
        let waiting = g.queue.len() + g.reserved;
        if g.closed {
            return Err(if self.stopping() {
                ApiError::ShuttingDown
            } else {
                ApiError::Unavailable
            });
        }
        let admitted = usize::from(g.running) + waiting;
        if admitted > self.queue_limit {
            // One admitted request is running or next to run (it may still be tokenizing, or
            // the engine is between jobs); the others wait. Counting the next-to-run one as
            // queued said "0 running and 1 queued (queue limit 0)".
            return Err(ApiError::QueueFull { queued: admitted - 1, limit: self.queue_limit });
        }
        g.reserved += 1;
        Ok(Reservation { sched: Arc::clone(self), held: true })
    }

    /// Requests waiting (queued or being prepared).
    pub fn depth(&self) -> usize {
        let g = self.lock();
        g.queue.len() + g.reserved
    }

    /// Whether a generation is running.
    pub fn running(&self) -> bool {
        self.lock().running
    }

    /// The engine thread's next job (blocks); `None` once closed.
    pub fn next(&self) -> Option<Job> {
        let mut g = self.lock();
        loop {
            if g.closed {
                return None;
            }
            if let Some(job) = g.queue.pop_front() {
                g.running = true;
                return Some(job);
            }
            g = self.ready.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The engine finished its job.
    pub fn done(&self) {
        self.lock().running = false;
    }

    /// Stops the engine thread after its current job; queued jobs are dropped.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        g.queue.clear();
        self.ready.notify_all();
    }

    /// Stops the server's work: the running job ends at its next pass boundary (the engine
    /// polls [`Scheduler::stopping`]), queued jobs are answered [`Event::ShuttingDown`], new
    /// requests are refused with 503, and the engine thread ends after the running job.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        let queued: Vec<Job> = {
            let mut g = self.lock();
            g.closed = true;
            self.ready.notify_all();
            g.queue.drain(..).collect()
        };
        for job in queued {
            self.metrics.cancelled();
            let _ = job.events.send(Event::ShuttingDown);
        }
    }

    /// Whether [`Scheduler::shutdown`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

impl Reservation {
    /// Queues `job`; the returned handle cancels it when dropped.
    pub fn submit(mut self, job: Job) -> JobHandle {
        let handle = JobHandle {
            id: job.id,
            cancel: Arc::clone(&job.cancel),
            sched: Arc::clone(&self.sched),
        };
        let mut g = self.sched.lock();
        g.reserved -= 1;
        self.held = false;
        if g.closed {
            // Prepared while the server began stopping: it will never run.
            drop(g);
            let _ = job.events.send(Event::ShuttingDown);
            return handle;
        }
        g.queue.push_back(job);
        self.sched.ready.notify_one();
        handle
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.held {
            self.sched.lock().reserved -= 1;
        }
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
        let mut g = self.sched.lock();
        let queued = g.queue.len();
        g.queue.retain(|j| j.id != self.id);
        if g.queue.len() < queued {
            // Its client went away before the engine took it.
            self.sched.metrics.cancelled();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::tests::dummy_job;

    #[test]
    fn admission_counts_running_waiting_and_reserved() {
        let s = Scheduler::new(1, Arc::default());
        let r1 = s.reserve().unwrap_or_else(|e| panic!("{e}"));
        let (job, _rx) = dummy_job(1);
        let h1 = r1.submit(job);
        let _ = s.next().unwrap_or_else(|| panic!("job"));
        assert!(s.running());
        let r2 = s.reserve().unwrap_or_else(|e| panic!("{e}"));
        let e = s.reserve().expect_err("queue full");
        assert!(matches!(e, ApiError::QueueFull { queued: 1, limit: 1 }));
        drop(r2);
        let (job2, _rx2) = dummy_job(2);
        let h2 = s.reserve().unwrap_or_else(|e| panic!("{e}")).submit(job2);
        assert_eq!(s.depth(), 1);
        drop(h2);
        assert_eq!(s.depth(), 0, "a dropped handle leaves the queue at once");
        drop(h1);
        s.done();
        assert!(!s.running());
    }

    #[test]
    fn shutdown_answers_queued_and_late_jobs_and_refuses_new_ones() {
        let s = Scheduler::new(2, Arc::default());
        let (running, _r0) = dummy_job(1);
        let _h0 = s.reserve().unwrap_or_else(|e| panic!("{e}")).submit(running);
        let _taken = s.next().unwrap_or_else(|| panic!("job"));
        let (queued, mut rx1) = dummy_job(2);
        let _h1 = s.reserve().unwrap_or_else(|e| panic!("{e}")).submit(queued);
        let late = s.reserve().unwrap_or_else(|e| panic!("{e}"));
        assert!(!s.stopping());
        s.shutdown();
        assert!(s.stopping(), "the running job sees the flag at its next pass");
        assert!(matches!(rx1.try_recv(), Ok(Event::ShuttingDown)));
        let (job, mut rx2) = dummy_job(3);
        let _h2 = late.submit(job);
        assert!(matches!(rx2.try_recv(), Ok(Event::ShuttingDown)));
        assert!(matches!(s.reserve(), Err(ApiError::ShuttingDown)));
        assert!(s.next().is_none(), "the engine thread ends");
    }

    #[test]
    fn queue_full_said_more_queued_than_the_limit() {
        // --queue 0: one request admitted and still being prepared (nothing running yet).
        let s = Scheduler::new(0, Arc::default());
        let _first = s.reserve().unwrap_or_else(|e| panic!("{e}"));
        let e = s.reserve().expect_err("one at a time");
        assert!(matches!(e, ApiError::QueueFull { queued: 0, limit: 0 }), "{e}");
        assert_eq!(
            e.to_string(),
            "The server is busy: one generation running and 0 queued (queue limit 0); retry later"
        );
    }

    #[test]
    fn dropping_a_handle_raises_the_cancel_flag() {
        let metrics = Arc::new(Metrics::default());
        let s = Scheduler::new(0, Arc::clone(&metrics));
        let (job, _rx) = dummy_job(7);
        let flag = Arc::clone(&job.cancel);
        let h = s.reserve().unwrap_or_else(|e| panic!("{e}")).submit(job);
        assert!(!flag.load(Ordering::Acquire));
        drop(h);
        assert!(flag.load(Ordering::Acquire));
        assert_eq!(metrics.cancelled_total(), 1, "dropped while queued: cancelled");
        // A handle dropped once its job has been taken is counted by the engine thread, not here.
        let (job, _rx) = dummy_job(8);
        let h = s.reserve().unwrap_or_else(|e| panic!("{e}")).submit(job);
        let _taken = s.next().unwrap_or_else(|| panic!("job"));
        drop(h);
        assert_eq!(metrics.cancelled_total(), 1);
        s.done();
        s.close();
        assert!(s.next().is_none());
    }
}
