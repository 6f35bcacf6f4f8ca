//! Prefill progress: a hook the engine calls between prefill passes so a front end can show
//! how far a long prompt has come (a progress bar in `sluice run`, gauges and a log line in
//! `sluice serve`).
//!
//! The hook is optional and costs nothing when absent: the engine reads the store's counters
//! only when a hook is set. It is called once before the first pass (0 positions done) and
//! after every pass, so the last call always has `done == total`.

use sluice_models::Model;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// How far a prefill has come.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillProgress {
    /// Prompt positions prefilled so far (positions resumed from a cache count as done).
    pub done: usize,
    /// Prompt positions in all.
    pub total: usize,
    /// Routed-expert bytes read from storage since the prefill started.
    pub expert_bytes_read: u64,
    /// Wall seconds since the prefill started.
    pub elapsed_s: f64,
}

impl PrefillProgress {
    /// Seconds the rest is expected to take at the rate so far (`None` before any position was
    /// prefilled in this run).
    pub fn eta_s(&self, start: usize) -> Option<f64> {
        let ran = self.done.checked_sub(start).filter(|&n| n > 0)?;
        #[allow(clippy::cast_precision_loss)]
        let per = self.elapsed_s / ran as f64;
        #[allow(clippy::cast_precision_loss)]
        Some(per * self.total.saturating_sub(self.done) as f64)
    }
}

/// A callback for prefill progress (shared, so options that hold it stay `Clone`).
#[derive(Clone)]
pub struct PrefillHook(pub Arc<dyn Fn(&PrefillProgress) + Send + Sync>);

impl PrefillHook {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&PrefillProgress) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl fmt::Debug for PrefillHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrefillHook")
    }
}

/// When a progress line is worth printing, for front ends that log lines rather than draw a
/// bar: never for the report before the first pass, at most one every `every_s` seconds while
/// the prefill runs, and at its end only if it took more than one pass (so short prompts print
/// nothing).
#[derive(Debug)]
pub struct LineThrottle {
    every_s: f64,
    reports: usize,
    last: Instant,
}

impl LineThrottle {
    /// At most one line every `every_s` seconds.
    pub fn new(every_s: f64) -> Self {
        Self { every_s, reports: 0, last: Instant::now() }
    }

    /// Whether to print a line for `p` (call it for every report, in order).
    pub fn due(&mut self, p: &PrefillProgress) -> bool {
        self.reports += 1;
        let due = match (self.reports, p.done >= p.total) {
            (1, _) => false,
            (n, true) => n > 2,
            (_, false) => self.last.elapsed().as_secs_f64() >= self.every_s,
        };
        if due {
            self.last = Instant::now();
        }
        due
    }
}

/// Reports one prefill's progress to an optional hook.
pub(crate) struct Reporter<'a> {
    hook: Option<&'a PrefillHook>,
    model: &'a Model,
    total: usize,
    start: Instant,
    read0: u64,
}

impl<'a> Reporter<'a> {
    /// Starts a prefill of `total` positions (the store's counters are read only with a hook).
    pub(crate) fn new(hook: Option<&'a PrefillHook>, model: &'a Model, total: usize) -> Self {
        let read0 = if hook.is_some() { model.store_stats().bytes_read } else { 0 };
        Self { hook, model, total, start: Instant::now(), read0 }
    }

    /// Reports `done` positions.
    pub(crate) fn report(&self, done: usize) {
        if let Some(h) = self.hook {
            (h.0)(&PrefillProgress {
                done,
                total: self.total,
                expert_bytes_read: self.model.store_stats().bytes_read.saturating_sub(self.read0),
                elapsed_s: self.start.elapsed().as_secs_f64(),
            });
        }
    }
}
