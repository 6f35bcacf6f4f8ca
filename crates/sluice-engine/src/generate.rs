//! Greedy decoding with optional exact speculative verification.
//!
//! The prompt runs in passes of at most `prefill_chunk` rows (the memory plan's chunk; each
//! expert read once per layer per pass). Then every pass feeds the
//! pending token (the target's own choice, not yet in the state) followed by up to k drafted
//! tokens; row i's logits give the target's choice after row i. Drafts are accepted while they
//! equal the target's choice; the target's token after the last accepted row becomes the new
//! pending token. The state then commits exactly the rows whose tokens were emitted, so it holds
//! what plain decoding would hold — and because every kernel is batch-invariant, every emitted
//! token's logits are bit-identical to plain decoding's. Stop tokens and `max_new` apply inside
//! the accepted prefix.

use crate::constraint::SharedConstraint;
use crate::draft::Drafter;
use crate::layer_stats::{phase_bytes, process_read_bytes, Snapshot};
use crate::policy::WidthPolicy;
use crate::progress::{PrefillHook, Reporter};
use crate::route_trace::{RouteTap, TracePass};
use crate::sample::Sampling;
use crate::state_cache::StateCache;
use crate::turn::{end_state_resumable, FollowUp};
use crate::EngineError;
use serde::Serialize;
use sluice_kernels::pool::{self, PoolCounters};
use sluice_kernels::Pool;
use sluice_models::kimi_k3::Trace;
use sluice_models::{LogitRows, Model, State, StateSnapshot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most new tokens.
    pub max_new: usize,
    /// Token ids that end generation (the stop token is emitted, then generation stops).
    pub stop_ids: Vec<u32>,
    /// Keep the logits of every generated step.
    pub keep_logits: bool,
    /// Most drafts verified per pass (0 disables speculation).
    pub draft_max: usize,
    /// Greedy or seeded sampling.
    pub sampling: Sampling,
    /// Prompt tokens per prefill pass (0: the whole prompt in one pass), and the most rows a
    /// decode pass takes (the pending token and its drafts): the rows whose working memory the
    /// plan charged (`Plan::chunk`). Each pass reads every routed expert it needs once per
    /// layer, so fewer, larger chunks read fewer bytes; the logits are bit-identical whatever
    /// the chunking.
    pub prefill_chunk: usize,
    /// Always verify `draft_max` drafts instead of letting the width policy choose (for
    /// benchmarks that compare the policy with fixed widths).
    pub fixed_width: bool,
    /// Raised (by a signal handler: `sluice run` on Ctrl-C) to stop at the next pass boundary,
    /// prefill chunks included; generation then ends as `interrupted`, keeping what was emitted.
    pub interrupt: Option<&'static AtomicBool>,
    /// Called before the first prefill pass and after each one (see [`crate::progress`]).
    pub on_prefill: Option<PrefillHook>,
    /// Receives every pass's routes (`--trace-routes`; see [`crate::route_trace`]).
    pub route_tap: Option<RouteTap>,
    /// The on-disk prompt-state cache: a fresh `state` starts from the longest cached prefix of
    /// the prompt, and the state is queued for writing every `every` prompt tokens, at the end
    /// of the prompt and at the end of generation ([`crate::state_cache`]) when a follow-up
    /// can restore it (`follow_up`).
    pub state_cache: Option<Arc<StateCache>>,
    /// What a follow-up request starts with, which decides whether the state after generation
    /// is written to the state cache ([`crate::turn::FollowUp`]); `None`: a follow-up sends
    /// the prompt and the generated ids back as they are.
    pub follow_up: Option<FollowUp>,
    /// Restricts every chosen token to what a grammar allows (drafts included: the verifier
    /// masks each row; see [`crate::constraint`]).
    pub constraint: Option<SharedConstraint>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new: 32,
            stop_ids: Vec::new(),
            keep_logits: false,
            draft_max: 0,
            sampling: Sampling::greedy(),
            prefill_chunk: 0,
            fixed_width: false,
            interrupt: None,
            on_prefill: None,
            route_tap: None,
            state_cache: None,
            follow_up: None,
            constraint: None,
        }
    }
}

/// Called with each emitted token; returning `false` cancels generation at the next pass
/// boundary (the tokens emitted so far stand, the state holds exactly them).
pub type OnToken<'a> = &'a mut dyn FnMut(u32) -> bool;

/// Run statistics (printed by `--stats`, recorded by `--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Wall seconds of the prefill passes.
    pub prefill_s: f64,
    /// Prefill passes (chunks of the prompt, and one more per state-cache interval edge a
    /// pass was cut at).
    pub prefill_passes: usize,
    /// States captured inside prefill passes at the state cache's interval edges (written
    /// without cutting the pass there; see [`crate::prefill_pass`]).
    pub prefill_captures: usize,
    /// Prefill passes cut at an interval edge because the state could not be captured there.
    pub capture_cuts: usize,
    /// Expert bytes read from storage during prefill.
    pub prefill_expert_bytes_read: u64,
    /// Bytes of the distinct experts each prefill pass routed to, summed over layers and passes
    /// (what reading each routed expert exactly once per layer per pass costs).
    pub prefill_distinct_expert_bytes: u64,
    /// Seconds prefill waited on expert reads.
    pub prefill_io_wait_s: f64,
    /// Expert bytes read from storage during decode passes.
    pub decode_expert_bytes_read: u64,
    /// Seconds decode passes waited on expert reads.
    pub decode_io_wait_s: f64,
    /// Wall seconds of prefill during which at least one expert read was in flight.
    pub prefill_read_busy_s: f64,
    /// Wall seconds of decode during which at least one expert read was in flight (expert
    /// bytes read over it is the bandwidth the disk gave the engine's own reads).
    pub decode_read_busy_s: f64,
    /// Bytes read by prefetches that were not used.
    pub prefetch_wasted_bytes: u64,
    /// Per-MoE-layer store counters of the prefill passes.
    pub prefill_layers: Vec<crate::layer_stats::LayerStats>,
    /// Per-MoE-layer store counters of the decode passes.
    pub decode_layers: Vec<crate::layer_stats::LayerStats>,
    /// Bytes this process had fetched from storage when generation ended (`/proc/self/io`
    /// `read_bytes`, loading included), 0 where unknown.
    pub process_read_bytes: u64,
    /// Wall seconds of all decode passes.
    pub decode_s: f64,
    /// Decode seconds per generated token after the first (the first comes from prefill).
    pub s_per_token: f64,
    /// Target passes run (prefill included).
    pub passes: usize,
    /// Tokens emitted per decode pass.
    pub tokens_per_pass: f64,
    /// Drafter in use (`none` without speculation).
    pub drafter: String,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// `accepted / drafted`.
    pub acceptance: f64,
    /// Decode passes by number of drafts verified (index = drafts).
    pub width_histogram: Vec<usize>,
    /// Seconds spent in the drafter (a draft model's passes; included in `decode_s`).
    pub draft_s: f64,
    /// The width policy's final estimates (absent without a drafter).
    pub policy: Option<WidthPolicy>,
    /// Spine weight bytes swept per generated token (decode passes only): one sweep per pass,
    /// so speculation divides it by the tokens each pass emits.
    pub spine_bytes_per_token: f64,
    /// Expert requests served by the store.
    pub expert_requests: u64,
    /// Expert bytes handed to the model.
    pub expert_bytes: u64,
    /// Expert bytes read from storage.
    pub expert_bytes_read: u64,
    /// Expert reads that failed. In a run that succeeded, these are read-ahead or prefetch
    /// reads that failed before a pass took them: dropped, and read again by a pass that needed
    /// the expert (a failure a pass waits on fails the request).
    pub expert_read_errors: u64,
    /// Expert reads completed (one per expert read from storage, prefetches included).
    pub expert_reads: u64,
    /// Disk requests those reads made (one per span: `expert_span_reads / expert_reads` is the
    /// requests per expert, 1 where an expert's parts coalesce into one read).
    pub expert_span_reads: u64,
    /// Expert bytes handed to the model per generated token (decode passes only).
    pub expert_bytes_per_token: f64,
    /// Expert bytes read from storage per generated token (decode passes only).
    pub expert_bytes_read_per_token: f64,
    /// Expert requests that hit the cache.
    pub expert_hits: u64,
    /// Expert requests that had to wait for a read.
    pub expert_misses: u64,
    /// `hits / (hits + misses)`.
    pub hit_rate: f64,
    /// Prefetch reads issued.
    pub prefetch_issued: u64,
    /// Demanded experts that a prefetch had already read or started.
    pub prefetch_used: u64,
    /// `prefetch_used / misses-or-prefetched demands` over the run.
    pub prefetch_recall: f64,
    /// Seconds the model waited on expert reads.
    pub io_wait_s: f64,
    /// Seconds reader threads spent reading (summed over threads).
    pub read_s: f64,
    /// Spine bytes read from storage (streamed layers and embedding rows; 0 when resident).
    pub spine_bytes_read: u64,
    /// Spine bytes read per decode pass.
    pub spine_bytes_per_pass: f64,
    /// Seconds the model waited for spine reads (streamed layers and embedding rows).
    pub spine_io_wait_s: f64,
    /// Bytes of sequence state at the end.
    pub state_bytes: usize,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_rss_bytes: u64,
    /// Prompt tokens restored from the on-disk state cache instead of prefilled.
    pub state_cache_tokens_restored: usize,
    /// Bytes of state-cache files read to restore them.
    pub state_cache_bytes_restored: u64,
    /// Bytes of state-cache files this run queued for writing (written off the token path).
    pub state_cache_bytes_written: u64,
    /// Why generation stopped: "stop", "length", "cancelled", "interrupted".
    pub finish_reason: String,
    /// The kernel thread pool's calls during prefill: `prefill_s` less their `busy_ns` is
    /// the work the engine thread did alone.
    pub prefill_pool: PoolCounters,
    /// The kernel thread pool's calls during decode (see `prefill_pool`).
    pub decode_pool: PoolCounters,
}

/// The result of [`generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// New token ids (including a stop token if one ended generation).
    pub tokens: Vec<u32>,
    /// Logits `[vocab]` from which each token was chosen (when asked for).
    pub logits: Vec<Vec<f32>>,
    /// Statistics.
    pub stats: Stats,
}

/// Index of the largest logit (lowest index on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    u32::try_from(best).unwrap_or(u32::MAX)
}

/// Emission bookkeeping shared by the prefill and every pass.
struct Emitter<'a, 'b> {
    opts: &'a GenerateOptions,
    out: Generation,
    done: bool,
    on_token: Option<OnToken<'b>>,
}

impl Emitter<'_, '_> {
    /// The token the target chooses at the next generated position.
    fn choose(&self, logits: &[f32]) -> u32 {
        let c = self.opts.constraint.as_ref();
        crate::constraint::choose(&self.opts.sampling, logits, self.out.tokens.len(), c)
    }

    /// Whether [`GenerateOptions::interrupt`] was raised; if so, generation is done.
    fn interrupted(&mut self) -> bool {
        let hit = self.opts.interrupt.is_some_and(|f| f.load(Ordering::Acquire));
        if hit {
            self.out.stats.finish_reason = "interrupted".into();
            self.done = true;
        }
        hit
    }

    /// Emits `tok` chosen from `logits`; returns false once generation must stop.
    fn emit(&mut self, tok: u32, logits: &[f32]) -> bool {
        self.out.tokens.push(tok);
        if let Some(c) = &self.opts.constraint {
            c.commit(tok);
        }
        if self.opts.keep_logits {
            self.out.logits.push(logits.to_vec());
        }
        if self.opts.stop_ids.contains(&tok) {
            self.out.stats.finish_reason = "stop".into();
            self.done = true;
        } else if self.out.tokens.len() >= self.opts.max_new {
            self.done = true;
        }
        if let Some(cb) = self.on_token.as_mut() {
            if !cb(tok) && !self.done {
                self.out.stats.finish_reason = "cancelled".into();
                self.done = true;
            }
        }
        !self.done
    }
}

/// Greedy generation from `prompt`, continuing `state` (which must have no pending pass), with
/// drafts from `drafter` when `opts.draft_max > 0`.
pub fn generate(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut drafter: Option<&mut dyn Drafter>,
    on_token: Option<OnToken<'_>>,
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let vocab = model.vocab_size();
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::TokenOutOfVocab { id: bad, vocab });
    }
    let store0 = model.store_stats();
    let pool0 = pool::with_current(Pool::counters);
    let spine0 = model.spine_stats();
    let stats = Stats {
        prompt_tokens: prompt.len(),
        finish_reason: "length".into(),
        drafter: drafter.as_ref().map_or_else(|| "none".into(), |d| d.name()),
        ..Stats::default()
    };
    let mut em = Emitter {
        opts,
        out: Generation { tokens: Vec::new(), logits: Vec::new(), stats },
        done: opts.max_new == 0,
        on_token,
    };
    if em.done {
        return Ok(em.out);
    }
    let t0 = Instant::now();
    let layers0 = Snapshot(model.layer_store_stats());
    let chunk = if opts.prefill_chunk == 0 { prompt.len() } else { opts.prefill_chunk };
    let mut logits = Vec::new();
    // Only a fresh state's positions are the prompt's: a continued state is not cached.
    let disk = opts.state_cache.as_deref().filter(|_| state.is_empty());
    // A fresh state starts from the longest prefix the state cache holds.
    let mut done = 0;
    let mut base: Option<Arc<StateSnapshot>> = None;
    if let Some(r) = disk.and_then(|d| d.lookup(prompt, 0)) {
        *state = r.snapshot.restore();
        done = r.pos;
        logits = r.logits.unwrap_or_default();
        em.out.stats.state_cache_tokens_restored = r.pos;
        em.out.stats.state_cache_bytes_restored = r.bytes;
        base = Some(Arc::new(r.snapshot));
    }
    let progress = Reporter::new(opts.on_prefill.as_ref(), model, prompt.len());
    progress.report(done);
    let mut trace = opts.route_tap.as_ref().map(|_| Trace::routes_only());
    while done < prompt.len() {
        if em.interrupted() {
            break;
        }
        // Passes end at chunk ends; the state cache's interval edges inside a pass are
        // captured during it (or cut at when they cannot be: see [`crate::prefill_pass`]).
        let limit = (done + chunk).min(prompt.len());
        let every = disk.map_or(0, StateCache::every);
        let points = crate::prefill_pass::points(done, limit, every, 0, &[]);
        let plan = crate::prefill_pass::plan(done, limit, &points, state.can_capture());
        let end = plan.end;
        if let Some(d) = disk {
            d.make_room(plan.captures.len());
        }
        let (l, captures) = model.forward_capturing(
            state,
            &prompt[done..end],
            LogitRows::Prefill,
            trace.as_mut(),
            &plan.captures,
            base.as_deref(),
        )?;
        logits = l;
        state.commit(end - done);
        em.out.stats.prefill_captures += captures.len();
        em.out.stats.capture_cuts += usize::from(plan.cut);
        if let Some(d) = disk {
            // A capture keeps no logits: only the prompt's end serves a prompt ending there.
            for snap in captures {
                let snap = Arc::new(snap);
                em.out.stats.state_cache_bytes_written +=
                    d.submit(&prompt[..snap.len()], Arc::clone(&snap), None);
                base = Some(snap);
            }
        }
        if let (Some(tap), Some(tr)) = (&opts.route_tap, trace.as_mut()) {
            let n = end - done;
            tap.record(TracePass::from_routes(0, "prefill", done, n, n, &tr.routes));
            tr.routes.clear();
        }
        em.out.stats.prefill_passes += 1;
        done = end;
        progress.report(done);
        let at_point =
            |d: &StateCache| (d.every() > 0 && done % d.every() == 0) || done == prompt.len();
        if let Some(d) = disk.filter(|d| at_point(d)) {
            let snap = Arc::new(state.snapshot(base.as_deref()));
            em.out.stats.state_cache_bytes_written +=
                d.submit(&prompt[..done], Arc::clone(&snap), Some(Arc::from(logits.as_slice())));
            base = Some(snap);
        }
    }
    em.out.stats.prefill_s = t0.elapsed().as_secs_f64();
    // The prefill counts as one pass however it was chunked (none if interrupted before it).
    em.out.stats.passes = usize::from(em.out.stats.prefill_passes > 0);
    let mut pending = 0;
    if !em.done {
        pending = em.choose(&logits);
        em.emit(pending, &logits);
    }

    let draft_max = if drafter.is_some() { opts.draft_max } else { 0 };
    let mut policy =
        if opts.fixed_width { WidthPolicy::fixed(draft_max) } else { WidthPolicy::new(draft_max) };
    let mut context: Vec<u32> = prompt.to_vec();
    context.push(pending);
    let t1 = Instant::now();
    let store1 = model.store_stats();
    let layers1 = Snapshot(model.layer_store_stats());
    let spine1 = model.spine_stats();
    let pool1 = pool::with_current(Pool::counters);
    while !em.done && !em.interrupted() {
        let mut want = policy.width().min(opts.max_new.saturating_sub(em.out.tokens.len()));
        if opts.prefill_chunk > 0 {
            // The pending token and its drafts are one pass: no more rows than charged (the
            // plan charges a pass's first `ROW_BLOCK` rows at the full row, with replay rows
            // and logits; see `Plan::work`).
            want = want.min(opts.prefill_chunk.min(sluice_models::ROW_BLOCK) - 1);
        }
        let drafts = match (&mut drafter, want) {
            (Some(d), w) if w > 0 => {
                let td = Instant::now();
                let mut v = d.propose(&context, w);
                let secs = td.elapsed().as_secs_f64();
                policy.record_draft(w, secs);
                em.out.stats.draft_s += secs;
                v.truncate(w);
                v.retain(|&t| (t as usize) < vocab);
                v
            }
            _ => Vec::new(),
        };
        let mut rows = Vec::with_capacity(1 + drafts.len());
        rows.push(pending);
        rows.extend_from_slice(&drafts);
        let tp = Instant::now();
        let start = prompt.len() + em.out.tokens.len() - 1;
        let all = model.forward(state, &rows, LogitRows::All, trace.as_mut())?;
        let row = |i: usize| &all[i * vocab..(i + 1) * vocab];
        // Emit the accepted drafts, then the target's own token after the last accepted row.
        let mut emitted = 0usize;
        let mut accepted = 0usize;
        loop {
            let choice = em.choose(row(emitted));
            let is_draft = drafts.get(emitted) == Some(&choice);
            emitted += 1;
            let go_on = em.emit(choice, row(emitted - 1));
            context.push(choice);
            pending = choice;
            if is_draft {
                accepted += 1;
            }
            if !go_on || !is_draft {
                break;
            }
        }
        state.commit(emitted);
        let secs = tp.elapsed().as_secs_f64();
        if let (Some(tap), Some(tr)) = (&opts.route_tap, trace.as_mut()) {
            tap.record(TracePass::from_routes(0, "decode", start, rows.len(), emitted, &tr.routes));
            tr.routes.clear();
        }
        // The last emitted token was the target's own choice at a drafted position: a rejection
        // (not one when every draft was accepted, or generation stopped on an accepted draft).
        let rejected = accepted < emitted && emitted <= drafts.len();
        policy.record(rows.len(), secs, accepted, rejected);
        em.out.stats.passes += 1;
        em.out.stats.drafted += drafts.len();
        em.out.stats.accepted += accepted;
    }
    let mut stats = em.out.stats.clone();
    stats.decode_s = t1.elapsed().as_secs_f64();
    stats.generated_tokens = em.out.tokens.len();
    stats.width_histogram = policy.histogram.clone();
    if drafter.is_some() {
        stats.policy = Some(policy);
    }
    let decode_passes = stats.passes.saturating_sub(1);
    let decode_tokens = em.out.tokens.len().saturating_sub(1);
    #[allow(clippy::cast_precision_loss)]
    {
        if decode_passes > 0 {
            stats.s_per_token = stats.decode_s / decode_tokens.max(1) as f64;
            stats.tokens_per_pass = decode_tokens as f64 / decode_passes as f64;
        }
        if stats.drafted > 0 {
            stats.acceptance = stats.accepted as f64 / stats.drafted as f64;
        }
        let s2 = model.store_stats();
        if decode_tokens > 0 {
            let per_token = |bytes: u64| bytes as f64 / decode_tokens as f64;
            stats.expert_bytes_per_token = per_token(s2.bytes_served - store1.bytes_served);
            stats.expert_bytes_read_per_token = per_token(s2.bytes_read - store1.bytes_read);
            stats.spine_bytes_per_token =
                per_token(model.spine_bytes_per_pass().saturating_mul(decode_passes as u64));
        }
    }
    let s1 = model.store_stats();
    stats.prefill_pool = pool1.since(&pool0);
    stats.decode_pool = pool::with_current(Pool::counters).since(&pool1);
    stats.expert_hits = s1.hits - store0.hits;
    stats.expert_misses = s1.misses - store0.misses;
    stats.prefetch_issued = s1.prefetch_issued - store0.prefetch_issued;
    stats.prefetch_used = s1.prefetch_used - store0.prefetch_used;
    #[allow(clippy::cast_precision_loss)]
    {
        let lookups = stats.expert_hits + stats.expert_misses;
        if lookups > 0 {
            stats.hit_rate = stats.expert_hits as f64 / lookups as f64;
        }
        if stats.prefetch_issued > 0 {
            stats.prefetch_recall = stats.prefetch_used as f64 / lookups.max(1) as f64;
        }
        stats.io_wait_s = (s1.stall_ns - store0.stall_ns) as f64 * 1e-9;
        stats.read_s = (s1.read_ns - store0.read_ns) as f64 * 1e-9;
    }
    stats.peak_rss_bytes = peak_rss();
    stats.prefill_layers = layers0.delta(&layers1);
    stats.decode_layers = layers1.delta(&Snapshot(model.layer_store_stats()));
    (stats.prefill_expert_bytes_read, stats.prefill_distinct_expert_bytes) =
        phase_bytes(&stats.prefill_layers);
    stats.decode_expert_bytes_read = s1.bytes_read - store1.bytes_read;
    #[allow(clippy::cast_precision_loss)]
    {
        stats.prefill_io_wait_s = (store1.stall_ns - store0.stall_ns) as f64 * 1e-9;
        stats.decode_io_wait_s = (s1.stall_ns - store1.stall_ns) as f64 * 1e-9;
        stats.prefill_read_busy_s = (store1.busy_ns - store0.busy_ns) as f64 * 1e-9;
        stats.decode_read_busy_s = (s1.busy_ns - store1.busy_ns) as f64 * 1e-9;
    }
    stats.prefetch_wasted_bytes = s1.prefetch_wasted_bytes - store0.prefetch_wasted_bytes;
    stats.process_read_bytes = process_read_bytes().unwrap_or(0);
    stats.expert_requests = s1.requests - store0.requests;
    stats.expert_bytes = s1.bytes_served - store0.bytes_served;
    stats.expert_bytes_read = s1.bytes_read - store0.bytes_read;
    stats.expert_read_errors = s1.read_errors - store0.read_errors;
    stats.expert_reads = s1.expert_reads - store0.expert_reads;
    stats.expert_span_reads = s1.span_reads - store0.span_reads;
    let spine2 = model.spine_stats();
    stats.spine_bytes_read = spine2.bytes_read - spine0.bytes_read;
    #[allow(clippy::cast_precision_loss)]
    {
        stats.spine_io_wait_s = (spine2.wait_ns - spine0.wait_ns) as f64 * 1e-9;
        if decode_passes > 0 {
            stats.spine_bytes_per_pass =
                (spine2.bytes_read - spine1.bytes_read) as f64 / decode_passes as f64;
        }
    }
    stats.state_bytes = state.byte_len();
    // The state after generation (every emitted token but the last is in it): a later prompt
    // that continues this conversation resumes from it.
    if let (Some(d), Some(gen)) = (disk, em.out.tokens.len().checked_sub(1)) {
        let mut held = prompt.to_vec();
        held.extend_from_slice(&em.out.tokens[..gen]);
        let follow_up = opts.follow_up.as_ref();
        if state.len() == held.len()
            && end_state_resumable(follow_up, prompt.len(), &held, &em.out.tokens)
        {
            let snap = Arc::new(state.snapshot(base.as_deref()));
            stats.state_cache_bytes_written += d.submit(&held, snap, None);
        }
    }
    em.out.stats = stats;
    Ok(em.out)
}

/// Peak resident set size of this process in bytes, 0 where unknown
/// ([`sluice_store::platform::counters::peak_rss`]).
pub fn peak_rss() -> u64 {
    sluice_store::platform::counters::peak_rss()
}
