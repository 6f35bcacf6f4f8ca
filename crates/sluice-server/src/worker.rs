//! The engine thread: owns the model, the session cache and the drafter, takes jobs from the
//! [`Scheduler`] one at a time, and streams each job's output back to its handler as [`Event`]s.
//!
//! All per-token work happens here, off the async runtime: the model passes, detokenization, the
//! K3 reasoning/tool-call parser, stop strings and log-softmax. The event channel is unbounded so
//! that a slow client never stalls the engine; it holds at most one event per generated token.
//! A closed channel (the handler is gone) cancels the job at the next pass boundary.

use crate::follow_up::ChatEcho;
use crate::machine_metrics::MachineWatch;
use crate::metrics::Metrics;
use crate::output::{Delta, Output, OutputKind, Reply};
use crate::scheduler::Scheduler;
use sluice_engine::constraint::SharedConstraint;
use sluice_engine::progress::LineThrottle;
use sluice_engine::session::SessionCache;
use sluice_engine::turn::{run_turn, TurnOptions, TurnStats};
use sluice_engine::{Drafter, PrefillHook, PrefillProgress, Sampling};
use sluice_models::Model;
use sluice_tokenizer::PromptFormat;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// The failure a job cancelled before the engine started it ends with (nobody reads it: its
/// client is gone).
const CANCELLED_BEFORE_START: &str = "cancelled";
/// One generation request, ready for the engine.
#[derive(Debug)]
pub struct Job {
    /// Unique id (scheduler bookkeeping).
    pub id: u64,
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Prompt positions where a message ends (the state cache writes the state there).
    pub boundaries: Vec<usize>,
    /// Write the state at the prompt's end to the state cache (`false`: no later prompt can
    /// start with this one: see `message_boundaries` in the API handlers).
    pub keep_prompt_end: bool,
    /// A chat prompt's conversation: what a follow-up request starts with, which decides
    /// whether the state after the reply is kept (`None`: completions, whose follow-up sends
    /// the ids back as they are).
    pub(crate) echo: Option<ChatEcho>,
    /// Most new tokens.
    pub max_new: usize,
    /// Sampling.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Alternatives per token when logprobs are wanted.
    pub logprobs: Option<usize>,
    /// How to turn ids into output.
    pub output: OutputKind,
    /// The grammar the output must match (`response_format`, a required `tool_choice`).
    pub constraint: Option<SharedConstraint>,
    /// Raised when the client is gone.
    pub cancel: Arc<AtomicBool>,
    /// Where output goes.
    pub events: UnboundedSender<Event>,
    /// When the job was queued.
    pub enqueued: Instant,
}

/// The end of a job.
#[derive(Debug, Clone)]
pub struct Summary {
    /// `stop`, `length`, `tool_calls` or `cancelled`.
    pub finish_reason: String,
    /// Every generated id (including a final stop token).
    pub generated_ids: Vec<u32>,
    /// Tokens inside the think channel.
    pub reasoning_tokens: usize,
    /// The stop string that ended generation, if one did.
    pub stop_sequence: Option<String>,
    /// Seconds queued before the engine took the job.
    pub queue_s: f64,
    /// Seconds from the engine taking the job to its end.
    pub total_s: f64,
    /// Engine statistics.
    pub stats: TurnStats,
}

/// What the engine sends a handler.
#[derive(Debug)]
pub enum Event {
    /// New output.
    Delta(Delta),
    /// Generation ended.
    Done(Box<Summary>),
    /// Generation failed.
    Failed(String),
    /// The grammar engine failed mid-reply ([`sluice_engine::constraint::Constraint::error`]):
    /// from then on its mask allowed only the end token, so the reply ended early and does not
    /// match the requested format. The cause and how many tokens were generated.
    GrammarFailed {
        /// The grammar engine's message.
        cause: String,
        /// Tokens generated (the last is the forced end token).
        generated: usize,
    },
    /// The server stopped before the job started (answered 503).
    ShuttingDown,
}

/// The engine-side settings (the drafter itself is handed to [`crate::serve`]).
#[derive(Debug, Clone, Copy)]
pub struct EngineSettings {
    /// Most drafts per pass.
    pub draft_max: usize,
    /// Print one statistics line per request on stderr (`sluice serve --stats`).
    pub stats: bool,
    /// Most rows per pass: the memory plan's prefill chunk (0: no limit).
    pub prefill_chunk: usize,
}

/// The engine thread's state.
pub struct Worker {
    model: Model,
    fmt: Arc<PromptFormat>,
    cache: SessionCache,
    drafter: Option<Box<dyn Drafter>>,
    /// Whether the drafter's failure was reported.
    draft_failure_seen: bool,
    draft_max: usize,
    stats: bool,
    prefill_chunk: usize,
    stop_ids: Vec<u32>,
    sched: Arc<Scheduler>,
    metrics: Arc<Metrics>,
}

impl Worker {
    /// A worker over a loaded model, speculating with `drafter` when there is one.
    pub fn new(
        model: Model,
        fmt: Arc<PromptFormat>,
        cache: SessionCache,
        drafter: Option<Box<dyn Drafter>>,
        settings: EngineSettings,
        sched: Arc<Scheduler>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let stop_ids = fmt.stop_ids().to_vec();
        Self {
            model,
            fmt,
            cache,
            drafter,
            draft_failure_seen: false,
            draft_max: settings.draft_max,
            stats: settings.stats,
            prefill_chunk: settings.prefill_chunk,
            stop_ids,
            sched,
            metrics,
        }
    }

    /// Runs the engine loop on its own thread until the scheduler closes; `done` is dropped when
    /// the thread ends (so a stopping server can wait for it with a deadline).
    pub fn spawn(self, done: std::sync::mpsc::Sender<()>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new().name("sluice-engine".into()).spawn(move || {
            self.run();
            drop(done);
        })
    }

    fn run(mut self) {
        while let Some(job) = self.sched.next() {
            let event = match catch_unwind(AssertUnwindSafe(|| self.process(&job))) {
                Ok(e) => e,
                Err(_) => {
                    // A bug in the engine: the cache may hold a half-updated entry, so drop it.
                    self.cache.clear();
                    Event::Failed("the engine panicked on this request".into())
                }
            };
            let (entries, snaps, bytes) =
                (self.cache.len(), self.cache.snapshots(), self.cache.bytes());
            self.metrics.set_sessions(entries, snaps, bytes);
            self.sched.done();
            // A job cancelled before it started was counted as cancelled, not failed.
            if matches!(&event, Event::Failed(why) if why != CANCELLED_BEFORE_START)
                || matches!(event, Event::GrammarFailed { .. })
            {
                self.metrics.failed();
            }
            // Once the job has freed its slot and been counted: a reader of the log (the
            // tests) can take the line as the job's end.
            if let (true, Event::Done(s)) = (self.stats, &event) {
                let t = &s.stats;
                eprintln!(
                    "stats: job {}, prompt {} tokens ({} reused, {} prefilled in {} passes, {} captures, {} capture cuts, {:.3}s), \
                     ttft {:.3}s, generated {} tokens in {:.3}s ({} decode passes, {} drafted, {} accepted), \
                     experts {} bytes served / {} read, snapshots {} (+{} bytes), \
                     state cache {} tokens restored ({} bytes read) / {} bytes written, \
                     session store {entries} conversations / {snaps} snapshots / {bytes} bytes, finish {}{}",
                    job.id,
                    t.prompt_tokens,
                    t.cached_tokens,
                    t.prefill_tokens,
                    t.prefill_passes,
                    t.prefill_captures,
                    t.capture_cuts,
                    t.prefill_s,
                    t.ttft_s,
                    t.generated_tokens,
                    t.decode_s,
                    t.decode_passes,
                    t.drafted,
                    t.accepted,
                    t.expert_bytes,
                    t.expert_bytes_read,
                    t.snapshots,
                    t.snapshot_bytes,
                    t.state_cache_tokens_restored,
                    t.state_cache_bytes_restored,
                    t.state_cache_bytes_written,
                    s.finish_reason,
                    t.policy.as_ref().map(|p| format!("; draft width: {p}")).unwrap_or_default(),
                );
            }
            let _ = job.events.send(event);
        }
    }

    fn process(&mut self, job: &Job) -> Event {
        let started = Instant::now();
        let queue_s = started.duration_since(job.enqueued).as_secs_f64();
        if job.cancel.load(Ordering::Acquire) {
            self.metrics.cancelled();
            return Event::Failed(CANCELLED_BEFORE_START.into());
        }
        if self.sched.stopping() {
            self.metrics.cancelled();
            return Event::ShuttingDown;
        }
        let reply = match Output::new(&self.fmt, &job.output, &job.stop) {
            Ok(o) => Reply::shared(o),
            Err(e) => return Event::Failed(e.to_string()),
        };
        let opts = TurnOptions {
            max_new: job.max_new,
            stop_ids: self.stop_ids.clone(),
            sampling: job.sampling,
            draft_max: self.draft_max,
            per_token_logits: job.logprobs.is_some(),
            prefill_chunk: self.prefill_chunk,
            on_prefill: Some(prefill_hook(job.id, Arc::clone(&self.metrics))),
            boundaries: job.boundaries.clone(),
            keep_prompt_end: job.keep_prompt_end,
            constraint: job.constraint.clone(),
            follow_up: job
                .echo
                .clone()
                .map(|e| e.follow_up(Arc::clone(&self.fmt), Arc::clone(&reply))),
        };
        // The client leaving and the server stopping both end the job at the next pass.
        let cancel = || job.cancel.load(Ordering::Acquire) || self.sched.stopping();
        let fmt = &self.fmt;
        let mut on_token = |id: u32, logits: Option<&[f32]>| -> bool {
            let (mut d, stopped) = Reply::with(&reply, |r| (r.push(id), r.output().stopped()));
            if let (Some(n), Some(l)) = (job.logprobs, logits) {
                d.add_logprobs(fmt, l, id, n);
            }
            if !d.is_empty() && job.events.send(Event::Delta(d)).is_err() {
                job.cancel.store(true, Ordering::Release);
            }
            !stopped
        };
        let machine0 = MachineWatch::request_start();
        let drafter = self.drafter.as_mut().map(|d| &mut **d as &mut dyn Drafter);
        let turn = run_turn(
            &self.model,
            Some(&mut self.cache),
            &job.prompt,
            &opts,
            drafter,
            &cancel,
            &mut on_token,
        );
        if let (false, Some(why)) =
            (self.draft_failure_seen, self.drafter.as_ref().and_then(|d| d.failure()))
        {
            // Output is unaffected (drafts only ever save passes); say once that speculation
            // stopped.
            eprintln!("sluice: warning: drafting stopped: {why}");
            self.draft_failure_seen = true;
        }
        let turn = match turn {
            Ok(t) => t,
            Err(e) => return Event::Failed(e.to_string()),
        };
        let (last, tool_calls, reasoning_tokens, stop_sequence) = Reply::with(&reply, |r| {
            let out = r.output();
            let counts = (out.tool_calls(), out.reasoning_tokens(), out.stop_sequence());
            (r.finish(), counts.0, counts.1, counts.2)
        });
        if !last.is_empty() {
            let _ = job.events.send(Event::Delta(last));
        }
        let finish_reason = match turn.stats.finish_reason.as_str() {
            "stop" if tool_calls > 0 => "tool_calls".to_owned(),
            other => other.to_owned(),
        };
        if finish_reason == "cancelled" {
            self.metrics.cancelled();
        }
        self.metrics.record_turn(&turn.stats);
        if let Some(w) = self.metrics.machine() {
            w.request_done(&machine0);
        }
        // A grammar engine failure ends the reply with the end token as if it were complete:
        // the client is told, not handed a truncated reply as a finished one.
        let grammar_failure =
            job.constraint.as_ref().and_then(|c| c.with(|c| c.error().map(str::to_owned)));
        if let Some(cause) = grammar_failure {
            let generated = turn.tokens.len();
            eprintln!(
                "sluice: job {}: the grammar engine failed after {generated} generated tokens, \
                 the reply was cut short: {cause}",
                job.id
            );
            return Event::GrammarFailed { cause, generated };
        }
        Event::Done(Box::new(Summary {
            finish_reason,
            generated_ids: turn.tokens,
            reasoning_tokens,
            stop_sequence,
            queue_s,
            total_s: started.elapsed().as_secs_f64(),
            stats: turn.stats,
        }))
    }
}

/// The prefill progress of job `id`: the `/metrics` gauges follow every pass, and a prefill
/// of more than one pass is logged (every 2 s at most, and when it ends), so short prompts add
/// no log lines.
fn prefill_hook(id: u64, metrics: Arc<Metrics>) -> PrefillHook {
    let throttle = Mutex::new(LineThrottle::new(2.0));
    PrefillHook::new(move |p: &PrefillProgress| {
        metrics.set_prefill(p.done, p.total, p.expert_bytes_read);
        let log = throttle.lock().unwrap_or_else(PoisonError::into_inner).due(p);
        if log {
            eprintln!(
                "sluice: job {id}: prefill {}/{} positions, {:.1} MiB of experts read, {:.1}s",
                p.done,
                p.total,
                mib(p.expert_bytes_read),
                p.elapsed_s
            );
        }
    })
}

/// Bytes as MiB (for log lines).
fn mib(b: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / (1024.0 * 1024.0);
    m
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    /// A job that is never run (scheduler tests).
    pub(crate) fn dummy_job(id: u64) -> (Job, UnboundedReceiver<Event>) {
        let (tx, rx) = unbounded_channel();
        let job = Job {
            id,
            prompt: vec![1],
            boundaries: Vec::new(),
            keep_prompt_end: true,
            echo: None,
            max_new: 1,
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            logprobs: None,
            output: OutputKind::Text,
            constraint: None,
            cancel: Arc::new(AtomicBool::new(false)),
            events: tx,
            enqueued: Instant::now(),
        };
        (job, rx)
    }
}
