//! Counters for `GET /metrics`, in the Prometheus text exposition format (version 0.0.4).
//!
//! Requests are counted by route and status; the engine adds tokens, prefill work saved by state
//! reuse, pass time (sum and count), time to first token, expert bytes and cancellations; gauges
//! report the queue, the running generation and the session cache.

use sluice_engine::state_cache::StateCache;
use sluice_engine::turn::TurnStats;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::machine_metrics::MachineWatch;

/// Server-wide counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    passes: AtomicU64,
    prefill_captures: AtomicU64,
    capture_cuts: AtomicU64,
    pass_micros: AtomicU64,
    ttft_count: AtomicU64,
    ttft_micros: AtomicU64,
    expert_bytes: AtomicU64,
    expert_bytes_read: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    snapshots: AtomicU64,
    snapshot_bytes: AtomicU64,
    session_entries: AtomicU64,
    session_snapshots: AtomicU64,
    session_bytes: AtomicU64,
    prefill_done: AtomicU64,
    prefill_total: AtomicU64,
    prefill_read: AtomicU64,
    machine: OnceLock<MachineWatch>,
    /// The on-disk prompt-state cache, whose live counters are exported when configured.
    state_cache: OnceLock<Arc<StateCache>>,
}

fn micros(s: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let m = (s.max(0.0) * 1e6).round() as u64;
    m
}

fn n(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

impl Metrics {
    /// Counts a finished request.
    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        *m.entry((route.to_owned(), status)).or_default() += 1;
    }

    /// Adds one generation's statistics.
    pub fn record_turn(&self, s: &TurnStats) {
        let add = |c: &AtomicU64, v: u64| c.fetch_add(v, Ordering::Relaxed);
        add(&self.prompt_tokens, n(s.prompt_tokens));
        add(&self.generated_tokens, n(s.generated_tokens));
        add(&self.prefill_tokens, n(s.prefill_tokens));
        add(&self.cached_tokens, n(s.cached_tokens));
        add(&self.passes, n(s.prefill_passes + s.decode_passes));
        add(&self.prefill_captures, n(s.prefill_captures));
        add(&self.capture_cuts, n(s.capture_cuts));
        add(&self.pass_micros, micros(s.prefill_s + s.decode_s));
        if s.generated_tokens > 0 {
            add(&self.ttft_count, 1);
            add(&self.ttft_micros, micros(s.ttft_s));
        }
        add(&self.expert_bytes, s.expert_bytes);
        add(&self.expert_bytes_read, s.expert_bytes_read);
        add(&self.snapshots, n(s.snapshots));
        add(&self.snapshot_bytes, n(s.snapshot_bytes));
    }

    /// Counts a generation cancelled because its client went away (while it ran, or while it
    /// was still queued).
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Generations cancelled so far.
    pub fn cancelled_total(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Counts a generation that failed in the engine.
    pub fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the session-cache gauges.
    pub fn set_sessions(&self, entries: usize, snapshots: usize, bytes: usize) {
        self.session_entries.store(n(entries), Ordering::Relaxed);
        self.session_snapshots.store(n(snapshots), Ordering::Relaxed);
        self.session_bytes.store(n(bytes), Ordering::Relaxed);
    }

    /// Sets the prefill progress gauges (the running request's, or the last one's once it
    /// finished).
    pub fn set_prefill(&self, done: usize, total: usize, expert_bytes_read: u64) {
        self.prefill_done.store(n(done), Ordering::Relaxed);
        self.prefill_total.store(n(total), Ordering::Relaxed);
        self.prefill_read.store(expert_bytes_read, Ordering::Relaxed);
    }

    /// Starts the machine-cost figures (see [`crate::machine_metrics`]) for a model in
    /// `model_dir` run within `budget`; a second call changes nothing.
    pub fn watch_machine(&self, model_dir: Option<&std::path::Path>, budget: Option<u64>) {
        let _ = self.machine.set(MachineWatch::new(model_dir, budget));
    }

    /// The machine-cost figures, once [`Metrics::watch_machine`] started them.
    pub fn machine(&self) -> Option<&MachineWatch> {
        self.machine.get()
    }

    /// Exports `cache`'s counters (`sluice_state_cache_*`).
    pub fn set_state_cache(&self, cache: Arc<StateCache>) {
        let _ = self.state_cache.set(cache);
    }

    /// Prefill tokens saved by state reuse so far.
    pub fn cached_tokens(&self) -> u64 {
        self.cached_tokens.load(Ordering::Relaxed)
    }

    /// The exposition text, with the queue gauges read by the caller.
    pub fn render(&self, queue_depth: usize, running: bool) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        };
        let secs = |c: &AtomicU64| Duration6(get(c)).to_string();
        metric(
            "sluice_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generations.",
            get(&self.prompt_tokens).to_string(),
        );
        metric(
            "sluice_generation_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generated_tokens).to_string(),
        );
        metric(
            "sluice_prefill_tokens_total",
            "counter",
            "Prompt tokens run through the model.",
            get(&self.prefill_tokens).to_string(),
        );
        metric(
            "sluice_prefill_tokens_saved_total",
            "counter",
            "Prompt tokens resumed from stored conversation state instead of prefilled.",
            get(&self.cached_tokens).to_string(),
        );
        metric(
            "sluice_pass_seconds_sum",
            "counter",
            "Wall seconds of model passes (prefill chunks and decode passes).",
            secs(&self.pass_micros),
        );
        metric(
            "sluice_pass_seconds_count",
            "counter",
            "Model passes.",
            get(&self.passes).to_string(),
        );
        metric(
            "sluice_prefill_captures_total",
            "counter",
            "States captured inside prefill passes at checkpoints instead of cutting the pass.",
            get(&self.prefill_captures).to_string(),
        );
        metric(
            "sluice_capture_cuts_total",
            "counter",
            "Prefill passes cut at a checkpoint that could not be captured.",
            get(&self.capture_cuts).to_string(),
        );
        metric(
            "sluice_time_to_first_token_seconds_sum",
            "counter",
            "Engine seconds from taking a job to its first token.",
            secs(&self.ttft_micros),
        );
        metric(
            "sluice_time_to_first_token_seconds_count",
            "counter",
            "Generations that produced a token.",
            get(&self.ttft_count).to_string(),
        );
        metric(
            "sluice_expert_bytes_served_total",
            "counter",
            "Routed-expert bytes handed to the model.",
            get(&self.expert_bytes).to_string(),
        );
        metric(
            "sluice_expert_bytes_read_total",
            "counter",
            "Routed-expert bytes read from storage.",
            get(&self.expert_bytes_read).to_string(),
        );
        metric(
            "sluice_generations_cancelled_total",
            "counter",
            "Generations cancelled because the client went away (running or queued).",
            get(&self.cancelled).to_string(),
        );
        metric(
            "sluice_generations_failed_total",
            "counter",
            "Generations that failed in the engine.",
            get(&self.failed).to_string(),
        );
        metric(
            "sluice_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            queue_depth.to_string(),
        );
        metric(
            "sluice_generation_running",
            "gauge",
            "1 while a generation runs.",
            u8::from(running).to_string(),
        );
        metric(
            "sluice_prefill_positions_done",
            "gauge",
            "Prompt positions prefilled (or resumed) so far by the running request, or by the \
             last one once it finished.",
            get(&self.prefill_done).to_string(),
        );
        metric(
            "sluice_prefill_positions_total",
            "gauge",
            "Prompt positions of that request.",
            get(&self.prefill_total).to_string(),
        );
        metric(
            "sluice_prefill_expert_bytes_read",
            "gauge",
            "Routed-expert bytes read from storage by that request's prefill so far.",
            get(&self.prefill_read).to_string(),
        );
        metric(
            "sluice_session_entries",
            "gauge",
            "Conversations held for state reuse.",
            get(&self.session_entries).to_string(),
        );
        metric(
            "sluice_snapshots_total",
            "counter",
            "Conversation-state snapshots taken for reuse.",
            get(&self.snapshots).to_string(),
        );
        metric(
            "sluice_snapshot_bytes_total",
            "counter",
            "Bytes those snapshots added (cache rows shared with an earlier snapshot not counted).",
            get(&self.snapshot_bytes).to_string(),
        );
        metric(
            "sluice_session_snapshots",
            "gauge",
            "Distinct snapshots held for state reuse.",
            get(&self.session_snapshots).to_string(),
        );
        metric(
            "sluice_session_bytes",
            "gauge",
            "Bytes of stored conversation state.",
            get(&self.session_bytes).to_string(),
        );
        if let Some(c) = self.state_cache.get() {
            let st = c.stats();
            for (name, kind, help, v) in [
                ("files_written_total", "counter", "State files written.", st.files_written),
                (
                    "bytes_written_total",
                    "counter",
                    "Bytes of state files written.",
                    st.bytes_written,
                ),
                ("restores_total", "counter", "Prompt states restored from files.", st.restores),
                (
                    "bytes_restored_total",
                    "counter",
                    "Bytes of state files restored.",
                    st.bytes_restored,
                ),
                (
                    "tokens_restored_total",
                    "counter",
                    "Prompt tokens restored from files instead of prefilled.",
                    st.tokens_restored,
                ),
                (
                    "refused_total",
                    "counter",
                    "State files refused (corrupt, truncated, another model or format).",
                    st.refused,
                ),
                ("evicted_total", "counter", "State files deleted for size.", st.evicted),
                (
                    "write_errors_total",
                    "counter",
                    "State files that failed to write.",
                    st.write_errors,
                ),
                ("files", "gauge", "State files held.", st.files),
                ("bytes", "gauge", "Bytes of state files held.", st.bytes_held),
            ] {
                metric(&format!("sluice_state_cache_{name}"), kind, help, v.to_string());
            }
        }
        if let Some(w) = self.machine.get() {
            w.render(&mut out);
        }
        out.push_str("# HELP sluice_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE sluice_requests_total counter\n");
        let m = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        for ((route, status), count) in m.iter() {
            let _ = writeln!(
                out,
                "sluice_requests_total{{route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out
    }
}

/// Microseconds shown as seconds.
struct Duration6(u64);

impl std::fmt::Display for Duration6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lists_every_family_and_request_counts() {
        let m = Metrics::default();
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 429);
        m.record_turn(&TurnStats {
            prompt_tokens: 10,
            cached_tokens: 6,
            prefill_tokens: 4,
            generated_tokens: 3,
            prefill_passes: 1,
            prefill_captures: 3,
            capture_cuts: 1,
            decode_passes: 2,
            prefill_s: 0.5,
            decode_s: 0.25,
            ttft_s: 0.5,
            snapshots: 2,
            snapshot_bytes: 4096,
            ..TurnStats::default()
        });
        m.set_sessions(1, 2, 5000);
        m.set_prefill(512, 2000, 1 << 20);
        let text = m.render(2, true);
        for line in [
            "sluice_prefill_tokens_saved_total 6",
            "sluice_pass_seconds_sum 0.750000",
            "sluice_pass_seconds_count 3",
            "sluice_prefill_captures_total 3",
            "sluice_capture_cuts_total 1",
            "sluice_queue_depth 2",
            "sluice_snapshots_total 2",
            "sluice_snapshot_bytes_total 4096",
            "sluice_session_snapshots 2",
            "sluice_session_bytes 5000",
            "sluice_generation_running 1",
            "sluice_prefill_positions_done 512",
            "sluice_prefill_positions_total 2000",
            "sluice_prefill_expert_bytes_read 1048576",
            "sluice_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2",
            "sluice_requests_total{route=\"/v1/chat/completions\",status=\"429\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("sluice_process_written_bytes_total"), "not watched yet");
    }

    #[test]
    fn machine_figures_appear_once_watched_and_per_request() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("model.safetensors"), vec![0u8; 1 << 16]).expect("shard");
        let m = Metrics::default();
        m.watch_machine(Some(dir.path()), Some(1 << 30));
        let start = MachineWatch::request_start();
        sluice_store::telemetry::count_state_write(10);
        m.machine().expect("watched").request_done(&start);
        let text = m.render(0, false);
        for name in [
            "sluice_memory_budget_bytes 1073741824",
            "sluice_process_written_bytes_total ",
            "sluice_swap_out_bytes_total ",
            "sluice_major_faults_total ",
            "sluice_model_page_cache_ratio ",
            "sluice_last_request_written_bytes ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "missing {name:?} in\n{text}");
        }
    }
}
