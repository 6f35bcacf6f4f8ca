//! Greedy decoding over a model and its sequence state: one prefill pass over the whole
//! prompt (each expert read once per layer), then one pass per generated token, each committed
//! before the next. Statistics cover wall time per phase and bytes served by the expert store.

use crate::EngineError;
use serde::Serialize;
use sluice_models::{LogitRows, Model, State};
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
}

/// Run statistics (printed by `--stats`, recorded by `--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Wall seconds of the prefill pass.
    pub prefill_s: f64,
    /// Wall seconds of all decode passes.
    pub decode_s: f64,
    /// Decode seconds per generated token after the first (the first comes from prefill).
    pub s_per_token: f64,
    /// Target passes run (prefill included).
    pub passes: usize,
    /// Tokens emitted per decode pass.
    pub tokens_per_pass: f64,
    /// Expert requests served by the store.
    pub expert_requests: u64,
    /// Expert bytes handed to the model.
    pub expert_bytes: u64,
    /// Expert bytes read from storage.
    pub expert_bytes_read: u64,
    /// Bytes of sequence state at the end.
    pub state_bytes: usize,
    /// Why generation stopped: "stop", "length".
    pub finish_reason: String,
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

/// Greedy generation from `prompt`, continuing `state` (which must have no pending pass).
pub fn generate(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let vocab = model.vocab_size();
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::TokenOutOfVocab { id: bad, vocab });
    }
    let store0 = model.store_stats();
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Stats::default() };
    let mut out = Generation { tokens: Vec::new(), logits: Vec::new(), stats: Stats::default() };
    if opts.max_new == 0 {
        stats.finish_reason = "length".into();
        out.stats = stats;
        return Ok(out);
    }
    let t0 = Instant::now();
    let mut logits = model.forward(state, prompt, LogitRows::Last, None)?;
    state.commit(prompt.len());
    stats.prefill_s = t0.elapsed().as_secs_f64();
    stats.passes = 1;
    let t1 = Instant::now();
    stats.finish_reason = "length".into();
    loop {
        let tok = argmax(&logits);
        out.tokens.push(tok);
        if opts.keep_logits {
            out.logits.push(std::mem::take(&mut logits));
        }
        if opts.stop_ids.contains(&tok) {
            stats.finish_reason = "stop".into();
            break;
        }
        if out.tokens.len() >= opts.max_new {
            break;
        }
        logits = model.forward(state, &[tok], LogitRows::Last, None)?;
        state.commit(1);
        stats.passes += 1;
    }
    stats.decode_s = t1.elapsed().as_secs_f64();
    stats.generated_tokens = out.tokens.len();
    let decode_passes = stats.passes - 1;
    #[allow(clippy::cast_precision_loss)]
    if decode_passes > 0 {
        stats.s_per_token = stats.decode_s / decode_passes as f64;
        stats.tokens_per_pass = (out.tokens.len() - 1) as f64 / decode_passes as f64;
    }
    let s1 = model.store_stats();
    stats.expert_requests = s1.requests - store0.requests;
    stats.expert_bytes = s1.bytes_served - store0.bytes_served;
    stats.expert_bytes_read = s1.bytes_read - store0.bytes_read;
    stats.state_bytes = state.byte_len();
    out.stats = stats;
    Ok(out)
}
