//! The machine-cost part of `GET /metrics`: what the server has cost the machine since it
//! started (bytes read and written by the process, expert disk-cache and state-file bytes,
//! swap traffic, major faults, peak RSS against the budget, the page-cache share of the model's
//! files, the model disk's lifetime write counter), and the same figures for the last finished
//! request.
//!
//! A figure the OS refuses ([`sluice_store::telemetry`] says `None`) is left out of the
//! exposition rather than shown as 0, the Prometheus way of saying "not available". The
//! page-cache share is sampled at each scrape: 64 `mincore` calls per model file, whatever its
//! size.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use sluice_store::telemetry::{model_files, Sample, Telemetry};

/// The server's start sample, its model's files, and the last request's figures.
#[derive(Debug)]
pub struct MachineWatch {
    start: Sample,
    files: Vec<PathBuf>,
    budget: Option<u64>,
    last: Mutex<Option<Telemetry>>,
}

impl MachineWatch {
    /// Starts watching now, for a model in `model_dir` (its disk and its shards) run within
    /// `budget` bytes.
    pub fn new(model_dir: Option<&Path>, budget: Option<u64>) -> Self {
        Self {
            start: Sample::now(model_dir),
            files: model_dir.map(model_files).unwrap_or_default(),
            budget,
            last: Mutex::new(None),
        }
    }

    /// A sample to take when a request starts (no disk: that is read at scrape time).
    pub fn request_start() -> Sample {
        Sample::now(None)
    }

    /// Records a finished request that started at `start`.
    pub fn request_done(&self, start: &Sample) {
        let t = Telemetry::since(start);
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(t);
    }

    /// The machine families of the exposition text.
    pub fn render(&self, out: &mut String) {
        let mut t = Telemetry::since(&self.start).with_page_cache(&self.files);
        t.budget_bytes = self.budget;
        let mut metric = |name: &str, kind: &str, help: &str, value: Option<String>| {
            if let Some(v) = value {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
            }
        };
        let s = |v: Option<u64>| v.map(|v| v.to_string());
        let c = |v: u64| Some(v.to_string());
        metric(
            "sluice_process_read_bytes_total",
            "counter",
            "Bytes the server process caused to be read from storage since it started.",
            s(t.process_read_bytes),
        );
        metric(
            "sluice_process_written_bytes_total",
            "counter",
            "Bytes the server process caused to be written to storage since it started.",
            s(t.process_written_bytes),
        );
        metric(
            "sluice_expert_cache_written_bytes_total",
            "counter",
            "Bytes written into the expert disk cache (stream mode).",
            c(t.expert_cache_written_bytes),
        );
        metric(
            "sluice_state_file_read_bytes_total",
            "counter",
            "Bytes of state files (prompt-state cache, hot set) read.",
            c(t.state_read_bytes),
        );
        metric(
            "sluice_state_file_written_bytes_total",
            "counter",
            "Bytes of state files (prompt-state cache, hot set) written.",
            c(t.state_written_bytes),
        );
        metric(
            "sluice_swap_in_bytes_total",
            "counter",
            "Bytes swapped in system-wide since the server started.",
            s(t.swap_in_bytes),
        );
        metric(
            "sluice_swap_out_bytes_total",
            "counter",
            "Bytes swapped out system-wide since the server started.",
            s(t.swap_out_bytes),
        );
        metric(
            "sluice_major_faults_total",
            "counter",
            "Major page faults of the server process since it started.",
            s(t.major_faults),
        );
        metric(
            "sluice_peak_rss_bytes",
            "gauge",
            "Peak resident memory of the server process.",
            s(t.peak_rss_bytes),
        );
        metric("sluice_memory_budget_bytes", "gauge", "The --memory budget.", s(t.budget_bytes));
        metric(
            "sluice_model_page_cache_ratio",
            "gauge",
            "Share of the model's files in the page cache (sampled: 64 windows per file).",
            t.model_page_cache.as_ref().map(|p| format!("{:.6}", p.fraction)),
        );
        metric(
            "sluice_model_disk_written_bytes",
            "gauge",
            "The model disk's lifetime bytes written (all processes), now.",
            s(t.disk_written_after_bytes),
        );
        metric(
            "sluice_model_disk_written_since_start_bytes",
            "gauge",
            "Bytes the model disk wrote (all processes) since the server started.",
            s(t.disk_written_bytes()),
        );
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(l) = last {
            metric(
                "sluice_last_request_read_bytes",
                "gauge",
                "Bytes the process read from storage during the last finished request.",
                s(l.process_read_bytes),
            );
            metric(
                "sluice_last_request_written_bytes",
                "gauge",
                "Bytes the process wrote to storage during the last finished request.",
                s(l.process_written_bytes),
            );
            metric(
                "sluice_last_request_expert_read_bytes",
                "gauge",
                "Routed-expert bytes read during the last finished request.",
                c(l.expert_read_bytes),
            );
            metric(
                "sluice_last_request_swap_in_bytes",
                "gauge",
                "Bytes swapped in (system-wide) during the last finished request.",
                s(l.swap_in_bytes),
            );
            metric(
                "sluice_last_request_swap_out_bytes",
                "gauge",
                "Bytes swapped out (system-wide) during the last finished request.",
                s(l.swap_out_bytes),
            );
            metric(
                "sluice_last_request_major_faults",
                "gauge",
                "Major page faults during the last finished request.",
                s(l.major_faults),
            );
        }
    }
}
