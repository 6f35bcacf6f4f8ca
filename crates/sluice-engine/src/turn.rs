//! One request's generation on top of the session cache: resume from the longest reusable prefix,
//! prefill the rest (snapshotting the state on the way), choose the first token, then decode with
//! [`generate`] (speculative when a drafter is given) or, when the caller needs every token's
//! logits, with plain one-token passes.
//!
//! The prompt's prefill runs here rather than inside [`generate`] so that the state can be
//! snapshotted at checkpoint boundaries (captured inside a pass, not cut at:
//! [`crate::prefill_pass`]) and at the end of the prompt — the point a follow-up chat
//! turn resumes from whether or not the reply re-tokenizes to the ids the model produced.
//! Decoding then continues with [`generate`] from the first token. The state after generation
//! is kept too, but only when a follow-up request can start with it ([`FollowUp`]): often it
//! cannot, and for Kimi K3 each kept state costs 0.6 GB.
//!
//! **Sampling positions.** Token 0 is drawn from the prefill logits with `(seed, 0)`. The
//! continuation is a new [`generate`] call whose positions restart at 0, so it samples with a
//! derived seed ([`continuation_sampling`]): token `i ≥ 1` uses `(seed', i − 1)`. Every path here
//! (speculative or plain, with or without reuse) follows this scheme, so the same seed always gives
//! the same tokens; greedy decoding does not depend on positions at all.

use crate::constraint::{choose, SharedConstraint};
use crate::draft::Drafter;
use crate::generate::{generate, GenerateOptions};
use crate::policy::WidthPolicy;
use crate::prefill_pass;
use crate::progress::{PrefillHook, Reporter};
use crate::sample::Sampling;
use crate::session::{Chain, Resume, SessionCache, Snapshot};
use crate::state_cache::StateCache;
use crate::EngineError;
use serde::Serialize;
use sluice_models::{LogitRows, Model, State, StateSnapshot};
use std::sync::Arc;
use std::time::Instant;

/// What to generate for one request.
#[derive(Debug, Clone)]
pub struct TurnOptions {
    /// Most new tokens.
    pub max_new: usize,
    /// Token ids that end generation (emitted, then generation stops).
    pub stop_ids: Vec<u32>,
    /// Greedy or seeded sampling.
    pub sampling: Sampling,
    /// Most drafts verified per pass (used only with a drafter and without `per_token_logits`).
    pub draft_max: usize,
    /// Hand every token's logits to the callback (decodes with plain one-token passes).
    pub per_token_logits: bool,
    /// Most rows one pass takes: prompt tokens per prefill pass (checkpoints inside a pass are
    /// captured; a pass is cut at one only when it cannot be, see [`crate::prefill_pass`]) and
    /// the pending token plus drafts of a decode pass; the memory plan's chunk (0: no limit).
    pub prefill_chunk: usize,
    /// Called before the first prefill pass and after each one (see [`crate::progress`]);
    /// positions resumed from the session cache count as done.
    pub on_prefill: Option<PrefillHook>,
    /// Prompt positions that end a message (e.g. the system prompt's end): the state there is
    /// captured (kept in the session cache and, with an on-disk state cache, written to it).
    pub boundaries: Vec<usize>,
    /// Write the state at the prompt's end to the on-disk state cache (a repeated prompt, or a
    /// follow-up that extends it, restores it). `false` when no later prompt can start with
    /// this one: a chat format that writes a `tool_choice` or `response_format` message after
    /// the last message writes it after the next request's messages instead, and a Kimi K3
    /// state no request restores is 0.6 GB written for nothing.
    pub keep_prompt_end: bool,
    /// Restricts every generated token to what a grammar allows (see [`crate::constraint`]).
    pub constraint: Option<SharedConstraint>,
    /// What a follow-up request of this conversation starts with, which decides whether the
    /// state after generation is kept (see [`FollowUp`]); `None`: a follow-up sends the
    /// generated ids back as they are.
    pub follow_up: Option<FollowUp>,
}

impl TurnOptions {
    /// Greedy decoding of at most `max_new` tokens and nothing else: no stop ids, no drafts,
    /// no per-token logits, passes of any length, no prefill hook, no message boundaries, the
    /// prompt's end kept, no constraint, and a follow-up that sends the generated ids back as
    /// they are. Callers change what they need with struct update syntax
    /// (`TurnOptions { draft_max: 4, ..TurnOptions::greedy(8) }`).
    pub fn greedy(max_new: usize) -> Self {
        Self {
            max_new,
            stop_ids: Vec::new(),
            sampling: Sampling::greedy(),
            draft_max: 0,
            per_token_logits: false,
            prefill_chunk: 0,
            on_prefill: None,
            boundaries: Vec::new(),
            keep_prompt_end: true,
            constraint: None,
            follow_up: None,
        }
    }
}

/// What a follow-up request starts with, given every id this turn generated: the prompt of the
/// next request of the conversation up to the end of this reply (the conversation with the
/// reply appended as the client sends it back, rendered through the chat format), or `None`
/// when no follow-up can start with this turn's tokens.
///
/// The state after generation holds the prompt and every generated id but the last. It is
/// kept (in the session cache and in the on-disk state cache) only when it is a prefix of
/// what the follow-up starts with: a chat client sends the reply back as text, and the chat
/// format renders it again (a history turn may drop the reasoning, a tool call's arguments
/// are re-serialized, a trailing `tool_choice` message moves past the new messages, the text
/// may tokenize otherwise), so the generated ids are often not what the next prompt holds.
/// A state no follow-up can restore would cost a Kimi K3 turn 0.6 GB of disk writes (and as
/// much session memory) for nothing.
#[derive(Clone)]
pub struct FollowUp(Arc<FollowUpFn>);

/// The follow-up test: the prompt ids a next request starts with, given this generation's ids.
type FollowUpFn = dyn Fn(&[u32]) -> Option<Vec<u32>> + Send + Sync;

impl FollowUp {
    /// A follow-up computed by `f` from the generated ids.
    pub fn new(f: impl Fn(&[u32]) -> Option<Vec<u32>> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// No follow-up request starts with this turn's tokens (e.g. every request renders a
    /// conversation of one turn).
    pub fn none() -> Self {
        Self::new(|_| None)
    }

    /// Whether a follow-up of a turn that generated `generated` starts with `held`, the
    /// ids of the state after generation.
    pub fn resumes(&self, held: &[u32], generated: &[u32]) -> bool {
        (self.0)(generated).is_some_and(|ids| ids.starts_with(held))
    }
}

impl std::fmt::Debug for FollowUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FollowUp(..)")
    }
}

/// Whether the state after generation, holding `held` (the prompt and every generated id but
/// the last), is worth keeping: it holds more than the prompt (whose end state is kept
/// already) and a follow-up request can start with it.
pub fn end_state_resumable(
    follow_up: Option<&FollowUp>,
    prompt_len: usize,
    held: &[u32],
    generated: &[u32],
) -> bool {
    held.len() > prompt_len && follow_up.is_none_or(|f| f.resumes(held, generated))
}

/// Statistics of one turn.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TurnStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the session cache instead of being prefilled.
    pub cached_tokens: usize,
    /// Prompt tokens actually run through the model.
    pub prefill_tokens: usize,
    /// Prefill passes (one per chunk, and one more per checkpoint point a pass was cut at).
    pub prefill_passes: usize,
    /// States captured inside prefill passes at checkpoint points (snapshots taken without
    /// cutting the pass there; see [`crate::prefill_pass`]).
    pub prefill_captures: usize,
    /// Prefill passes cut at a checkpoint point because the state could not be captured there
    /// (a family without captures, or more points in one pass than it captures).
    pub capture_cuts: usize,
    /// Wall seconds of the prefill passes.
    pub prefill_s: f64,
    /// Seconds from the start of the turn to the first token.
    pub ttft_s: f64,
    /// Decode passes.
    pub decode_passes: usize,
    /// Wall seconds of decoding after the first token.
    pub decode_s: f64,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Expert bytes handed to the model.
    pub expert_bytes: u64,
    /// Expert bytes read from storage.
    pub expert_bytes_read: u64,
    /// Bytes of sequence state at the end.
    pub state_bytes: usize,
    /// Snapshots of the state stored for reuse during this turn.
    pub snapshots: usize,
    /// Bytes those snapshots added (cache rows shared with earlier snapshots not counted).
    pub snapshot_bytes: usize,
    /// Prompt tokens restored from the on-disk state cache (included in `cached_tokens`).
    pub state_cache_tokens_restored: usize,
    /// Bytes of state-cache files read to restore them.
    pub state_cache_bytes_restored: u64,
    /// Bytes of state-cache files this turn queued for writing (written off the token path).
    pub state_cache_bytes_written: u64,
    /// `stop` (stop token or the callback asked to stop), `length`, or `cancelled`.
    pub finish_reason: String,
    /// The speculative width policy's estimates and last decision (absent without a drafter,
    /// and when no speculative decoding ran: logprobs, or a reply of one token).
    pub policy: Option<WidthPolicy>,
}

/// The result of [`run_turn`].
#[derive(Debug, Clone)]
pub struct Turn {
    /// Generated ids (including a stop token that ended generation).
    pub tokens: Vec<u32>,
    /// Statistics.
    pub stats: TurnStats,
}

/// The sampling of the continuation after token 0 (see the module docs).
pub fn continuation_sampling(s: Sampling) -> Sampling {
    let mut z = s.seed ^ 0x6A09_E667_F3BC_C908;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    Sampling { seed: z ^ (z >> 31), ..s }
}

/// A drafter that sees the prompt as well: [`generate`] only knows the continuation's context.
struct Prefixed<'a> {
    prefix: &'a [u32],
    inner: &'a mut dyn Drafter,
    buf: Vec<u32>,
}

impl Drafter for Prefixed<'_> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        self.buf.clear();
        self.buf.extend_from_slice(self.prefix);
        self.buf.extend_from_slice(context);
        self.inner.propose(&self.buf, max)
    }
}

/// Snapshots `state` for the session cache, sharing cache rows with `base` (the latest snapshot it
/// descends from, which the new one then replaces), and counts what it cost.
fn take_snapshot(
    state: &State,
    base: &mut Option<Arc<StateSnapshot>>,
    stats: &mut TurnStats,
) -> Arc<StateSnapshot> {
    let snap = Arc::new(state.snapshot(base.as_deref()));
    stats.snapshots += 1;
    stats.snapshot_bytes += snap.bytes_beyond(base.as_deref());
    *base = Some(Arc::clone(&snap));
    snap
}

/// Generates a reply to `prompt`, resuming from `cache` when given (and storing the conversation
/// back into it). `on_token` gets every generated id (and its logits with `per_token_logits`);
/// returning `false` stops generation (`stop`). `cancel` is polled between passes; when it turns
/// true generation ends as `cancelled`.
pub fn run_turn(
    model: &Model,
    mut cache: Option<&mut SessionCache>,
    prompt: &[u32],
    opts: &TurnOptions,
    drafter: Option<&mut dyn Drafter>,
    cancel: &dyn Fn() -> bool,
    on_token: &mut dyn FnMut(u32, Option<&[f32]>) -> bool,
) -> Result<Turn, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let vocab = model.vocab_size();
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::TokenOutOfVocab { id, vocab });
    }
    let t0 = Instant::now();
    let store0 = model.store_stats();
    let mut stats = TurnStats {
        prompt_tokens: prompt.len(),
        finish_reason: "length".into(),
        ..TurnStats::default()
    };
    if opts.max_new == 0 {
        return Ok(Turn { tokens: Vec::new(), stats });
    }
    let every = cache.as_ref().map_or(0, |c| c.config().checkpoint_every);
    let disk: Option<Arc<StateCache>> = cache.as_ref().and_then(|c| c.disk().cloned());
    let disk_every = disk.as_ref().map_or(0, |d| d.every());
    let mut resume = match cache.as_deref_mut() {
        Some(c) => c.resume(prompt),
        None => Resume::fresh(),
    };
    // What memory does not hold, the disk may: a longer prefix restored from a file.
    if let Some(r) = disk.as_ref().and_then(|d| d.lookup(prompt, resume.reused)) {
        stats.state_cache_tokens_restored = r.pos;
        stats.state_cache_bytes_restored = r.bytes;
        let snap = Arc::new(r.snapshot);
        let logits: Option<Arc<[f32]>> = r.logits.map(Arc::from);
        resume.chain.push(Snapshot::shared_logits(Arc::clone(&snap), logits.clone()));
        resume = Resume { from: Some(snap), reused: r.pos, logits, chain: resume.chain };
    }
    let Resume { from, reused, logits: cached_logits, chain } = resume;
    let mut state = from.as_deref().map_or_else(|| model.new_state(), StateSnapshot::restore);
    // The latest snapshot this state descends from: the next one shares its cache rows.
    let mut base: Option<Arc<StateSnapshot>> = from;
    stats.cached_tokens = reused;
    // Whether the session cache keeps one more snapshot of `bytes`, with room made for it next
    // to the snapshots this request has taken (`SessionCache::make_room`).
    let keep =
        |c: &mut Option<&mut SessionCache>, chain: &Chain, snaps: &[Snapshot], bytes: usize| {
            c.as_deref_mut().is_some_and(|c| c.make_room(chain, snaps, bytes))
        };

    let mut snaps = Vec::new();
    let mut logits: Option<Vec<f32>> = cached_logits.map(|l| l.to_vec());
    let mut pos = reused;
    let progress = Reporter::new(opts.on_prefill.as_ref(), model, prompt.len());
    progress.report(pos);
    while pos < prompt.len() {
        if cancel() {
            stats.finish_reason = "cancelled".into();
            if let Some(c) = cache {
                c.store(chain, snaps, prompt.to_vec());
            }
            return Ok(Turn { tokens: Vec::new(), stats });
        }
        // The pass runs to the end of its chunk or of the prompt; the checkpoint points
        // inside it (multiples of `every` and of the state cache's interval, message
        // boundaries: only where a snapshot can be kept) are captured during the pass, or cut
        // at when the state cannot capture them (see [`crate::prefill_pass`]).
        let limit = match opts.prefill_chunk {
            0 => prompt.len(),
            chunk => prompt.len().min(pos + chunk),
        };
        let points = if cache.is_some() {
            prefill_pass::points(pos, limit, every, disk_every, &opts.boundaries)
        } else {
            Vec::new()
        };
        let to_disk_at = |p: usize| {
            disk.as_ref().filter(|_| {
                (p == prompt.len() && opts.keep_prompt_end)
                    || (disk_every > 0 && p.is_multiple_of(disk_every))
                    || opts.boundaries.contains(&p)
            })
        };
        // A point only the session cache would keep is not captured when the state now
        // (smaller than any later one) already does not fit.
        let fits_now = keep(&mut cache, &chain, &snaps, state.snapshot_bytes());
        let points: Vec<usize> =
            points.into_iter().filter(|&p| fits_now || to_disk_at(p).is_some()).collect();
        let plan = prefill_pass::plan(pos, limit, &points, state.can_capture());
        let end = plan.end;
        if let Some(d) = &disk {
            d.make_room(plan.captures.iter().filter(|&&o| to_disk_at(pos + o).is_some()).count());
        }
        let tp = Instant::now();
        let (l, captures) = model.forward_capturing(
            &mut state,
            &prompt[pos..end],
            LogitRows::Prefill,
            None,
            &plan.captures,
            base.as_deref(),
        )?;
        state.commit(end - pos);
        stats.prefill_s += tp.elapsed().as_secs_f64();
        stats.prefill_passes += 1;
        stats.prefill_tokens += end - pos;
        stats.prefill_captures += captures.len();
        stats.capture_cuts += usize::from(plan.cut);
        // A capture keeps no logits (the pass computes its last row's only): a prompt that ends
        // exactly at it resumes from an earlier snapshot with logits (see `crate::session`).
        for snap in captures {
            let at = snap.len();
            let snap = Arc::new(snap);
            stats.snapshots += 1;
            stats.snapshot_bytes += snap.bytes_beyond(base.as_deref());
            base = Some(Arc::clone(&snap));
            if let Some(d) = to_disk_at(at) {
                stats.state_cache_bytes_written += d.submit(&prompt[..at], Arc::clone(&snap), None);
            }
            if keep(&mut cache, &chain, &snaps, snap.byte_len()) {
                snaps.push(Snapshot::shared_logits(snap, None));
            }
        }
        pos = end;
        progress.report(pos);
        let to_disk = to_disk_at(end);
        let to_memory = keep(&mut cache, &chain, &snaps, state.snapshot_bytes());
        if to_memory || to_disk.is_some() {
            let snap = take_snapshot(&state, &mut base, &mut stats);
            let shared: Arc<[f32]> = Arc::from(l.as_slice());
            if let Some(d) = to_disk {
                stats.state_cache_bytes_written +=
                    d.submit(&prompt[..end], Arc::clone(&snap), Some(Arc::clone(&shared)));
            }
            if to_memory {
                snaps.push(Snapshot::shared_logits(snap, Some(shared)));
            }
        }
        logits = Some(l);
    }
    let first_logits = logits.ok_or(EngineError::EmptyPrompt)?;
    let constraint = opts.constraint.as_ref();
    let first = choose(&opts.sampling, &first_logits, 0, constraint);
    if let Some(c) = constraint {
        c.commit(first);
    }
    stats.ttft_s = t0.elapsed().as_secs_f64();
    let mut tokens = vec![first];
    let go = on_token(first, opts.per_token_logits.then_some(first_logits.as_slice()));
    let finish = |tok: u32, n: usize, go: bool| -> Option<&'static str> {
        if opts.stop_ids.contains(&tok) {
            Some("stop")
        } else if n >= opts.max_new {
            Some("length")
        } else if !go {
            Some(if cancel() { "cancelled" } else { "stop" })
        } else {
            None
        }
    };
    let td = Instant::now();
    let cont = continuation_sampling(opts.sampling);
    match finish(first, 1, go) {
        Some(reason) => stats.finish_reason = reason.into(),
        None if opts.per_token_logits => {
            let mut pending = first;
            loop {
                let l = model.forward(&mut state, &[pending], LogitRows::Last, None)?;
                state.commit(1);
                stats.decode_passes += 1;
                let tok = choose(&cont, &l, tokens.len() - 1, constraint);
                if let Some(c) = constraint {
                    c.commit(tok);
                }
                tokens.push(tok);
                let go = on_token(tok, Some(&l)) && !cancel();
                if let Some(reason) = finish(tok, tokens.len(), go) {
                    stats.finish_reason = reason.into();
                    break;
                }
                pending = tok;
            }
        }
        None => {
            let gopts = GenerateOptions {
                max_new: opts.max_new - 1,
                stop_ids: opts.stop_ids.clone(),
                keep_logits: false,
                draft_max: opts.draft_max,
                sampling: cont,
                prefill_chunk: opts.prefill_chunk,
                constraint: opts.constraint.clone(),
                ..GenerateOptions::default()
            };
            let mut prefixed =
                drafter.map(|inner| Prefixed { prefix: prompt, inner, buf: Vec::new() });
            let mut asked_stop = false;
            let mut cb = |tok: u32| {
                let go = on_token(tok, None);
                asked_stop |= !go;
                go && !cancel()
            };
            let d = prefixed.as_mut().map(|p| p as &mut dyn Drafter);
            let g = generate(model, &mut state, &[first], &gopts, d, Some(&mut cb))?;
            tokens.extend_from_slice(&g.tokens);
            stats.decode_passes = g.stats.passes;
            stats.drafted = g.stats.drafted;
            stats.accepted = g.stats.accepted;
            stats.finish_reason = match g.stats.finish_reason.as_str() {
                "cancelled" if asked_stop => "stop".into(),
                other => other.into(),
            };
            stats.policy = g.stats.policy;
        }
    }
    stats.decode_s = td.elapsed().as_secs_f64();
    stats.generated_tokens = tokens.len();
    stats.state_bytes = state.byte_len();
    let store1 = model.store_stats();
    stats.expert_bytes = store1.bytes_served - store0.bytes_served;
    stats.expert_bytes_read = store1.bytes_read - store0.bytes_read;
    if let Some(c) = cache {
        let mut all = prompt.to_vec();
        all.extend_from_slice(&tokens);
        // The state holds every generated token but the last (never fed).
        let held = all.get(..state.len()).unwrap_or_default();
        if end_state_resumable(opts.follow_up.as_ref(), prompt.len(), held, &tokens) {
            let to_memory = c.make_room(&chain, &snaps, state.snapshot_bytes());
            if to_memory || disk.is_some() {
                let snap = take_snapshot(&state, &mut base, &mut stats);
                if let Some(d) = &disk {
                    stats.state_cache_bytes_written += d.submit(held, Arc::clone(&snap), None);
                }
                if to_memory {
                    snaps.push(Snapshot::shared(snap, None));
                }
            }
        }
        c.store(chain, snaps, all);
    }
    Ok(Turn { tokens, stats })
}
