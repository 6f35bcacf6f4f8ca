//! Progress reporting for a pull: a trait, a silent implementation and indicatif bars.
//!
//! The pull calls [`Progress`] from its worker threads. [`Bars`] shows one overall bar
//! (bytes, rate, ETA) and one bar per file in flight, and prints retries above the bars so
//! a flaky connection is visible without scrolling the bars away.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The overall bar: bytes, rate, ETA.
const TOTAL_TEMPLATE: &str =
    "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}";
/// One bar per file in flight.
const FILE_TEMPLATE: &str =
    "{msg:40!} [{bar:20}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}";

/// Receives progress events from a pull. Every method has a do-nothing default.
pub trait Progress: Send + Sync {
    /// The pull starts: `bytes` to download over `files` files.
    fn begin(&self, bytes: u64, files: usize) {
        let _ = (bytes, files);
    }
    /// A file starts downloading: `len` bytes in all, `done` already local.
    fn file_start(&self, path: &str, len: u64, done: u64) {
        let _ = (path, len, done);
    }
    /// `n` more bytes of `path` arrived.
    fn bytes(&self, path: &str, n: u64) {
        let _ = (path, n);
    }
    /// `path` went back to `done` bytes (a restart after a 200 or a checksum mismatch).
    fn rewind(&self, path: &str, done: u64) {
        let _ = (path, done);
    }
    /// `path` is finished (or failed).
    fn file_end(&self, path: &str) {
        let _ = path;
    }
    /// A notice, such as a retry.
    fn note(&self, message: &str) {
        let _ = message;
    }
    /// The pull is over.
    fn end(&self) {}
}

/// A [`Progress`] that shows nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Terminal progress bars (indicatif), drawn on stderr.
#[derive(Debug)]
pub struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    files: Mutex<HashMap<String, ProgressBar>>,
}

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

impl Bars {
    /// Bars on stderr (hidden when stderr is not a terminal).
    pub fn new() -> Self {
        Self::with_target(ProgressDrawTarget::stderr())
    }

    /// Bars drawn to `target`.
    pub fn with_target(target: ProgressDrawTarget) -> Self {
        let multi = MultiProgress::with_draw_target(target);
        let total = multi.add(ProgressBar::new(0));
        total.set_style(style(TOTAL_TEMPLATE));
        total.set_prefix("total");
        total.enable_steady_tick(Duration::from_millis(200));
        Self { multi, total, files: Mutex::new(HashMap::new()) }
    }

    fn with_file(&self, path: &str, f: impl FnOnce(&ProgressBar)) {
        if let Ok(files) = self.files.lock() {
            if let Some(bar) = files.get(path) {
                f(bar);
            }
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl Progress for Bars {
    fn begin(&self, bytes: u64, _files: usize) {
        self.total.set_length(bytes);
    }

    fn file_start(&self, path: &str, len: u64, done: u64) {
        let bar = self.multi.add(ProgressBar::new(len));
        bar.set_style(style(FILE_TEMPLATE));
        bar.set_message(path.to_owned());
        bar.set_position(done);
        bar.reset_eta();
        if let Ok(mut files) = self.files.lock() {
            files.insert(path.to_owned(), bar);
        }
    }

    fn bytes(&self, path: &str, n: u64) {
        self.total.inc(n);
        self.with_file(path, |b| b.inc(n));
    }

    fn rewind(&self, path: &str, done: u64) {
        self.with_file(path, |b| {
            let lost = b.position().saturating_sub(done);
            self.total.set_position(self.total.position().saturating_sub(lost));
            b.set_position(done);
        });
    }

    fn file_end(&self, path: &str) {
        let bar = self.files.lock().ok().and_then(|mut f| f.remove(path));
        if let Some(bar) = bar {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
    }

    fn note(&self, message: &str) {
        let _ = self.multi.println(message);
    }

    fn end(&self) {
        self.total.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse() {
        for t in [TOTAL_TEMPLATE, FILE_TEMPLATE] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }
}
