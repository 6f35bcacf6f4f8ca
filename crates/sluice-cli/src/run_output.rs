//! What `sluice run` prints: the streamed text (or ids), the `--json` object and the `--stats`
//! lines.
//!
//! Streamed text goes through the tokenizer's incremental UTF-8 decoder
//! ([`sluice_tokenizer::StreamDecoder`]) for Kimi K3, and for a `tokenizer.json` checkpoint
//! through its decoder over the ids so far, holding back a trailing incomplete character; either
//! way a character split across tokens is written once it is complete and the streamed bytes
//! equal the `--json` text. stdout is flushed after every
//! token: at seconds per token on a streamed model, buffering would hide the output for minutes.

use crate::open::{Opened, Target};
use anyhow::Result;
use serde_json::{json, Value};
use sluice_engine::{layer_stats, Generation};
use sluice_kernels::pool::PoolCounters;
use sluice_store::Telemetry;
use sluice_tokenizer::{ParsedOutput, PromptFormat, StreamDecoder};
use std::io::{StdoutLock, Write};

/// Generated tokens written to stdout as they are committed: text through the incremental
/// decoder, or comma-separated ids when the checkpoint has no tokenizer.
pub struct Sink<'t> {
    decoder: Option<Decoder<'t>>,
    /// Ids written so far (for the separator in id mode).
    written: usize,
    out: StdoutLock<'static>,
    error: Option<std::io::Error>,
}

impl<'t> Sink<'t> {
    /// A sink on stdout; text when `fmt` is given, else ids.
    pub fn stdout(fmt: Option<&'t PromptFormat>) -> Self {
        Self {
            decoder: fmt.map(Decoder::new),
            written: 0,
            out: std::io::stdout().lock(),
            error: None,
        }
    }

    /// Writes what token `id` completes; returns false (stopping generation) once stdout
    /// fails, e.g. a closed pipe.
    pub fn push(&mut self, id: u32) -> bool {
        let text = match &mut self.decoder {
            Some(d) => d.push(id),
            None if self.written == 0 => id.to_string(),
            None => format!(",{id}"),
        };
        self.written += 1;
        if let Err(e) = self.out.write_all(text.as_bytes()).and_then(|()| self.out.flush()) {
            self.error = Some(e);
        }
        self.error.is_none()
    }

    /// Writes what is still buffered and ends the line; the first write error, if any.
    pub fn finish(mut self) -> std::io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let tail = self.decoder.take().map(Decoder::finish).unwrap_or_default();
        writeln!(self.out, "{tail}")?;
        self.out.flush()
    }
}

/// Adds `id` to `d`, rendering an id the tokenizer does not know (a padding row of the
/// vocabulary) as U+FFFD rather than failing the run after its output.
fn push_lossy(d: &mut StreamDecoder<'_>, id: u32) -> String {
    d.push(id).unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.to_string())
}

/// Incremental decoding for one run's stream.
enum Decoder<'t> {
    /// Kimi K3's tiktoken decoder, byte-exact and incremental.
    Tiktoken(StreamDecoder<'t>),
    /// A `tokenizer.json` decoder run over every id so far; `sent` bytes of its text are out.
    Whole { fmt: &'t PromptFormat, ids: Vec<u32>, sent: usize },
}

impl<'t> Decoder<'t> {
    fn new(fmt: &'t PromptFormat) -> Self {
        match fmt.tokenizer().tiktoken() {
            Some(t) => Self::Tiktoken(t.stream_decoder()),
            None => Self::Whole { fmt, ids: Vec::new(), sent: 0 },
        }
    }

    /// The text `id` completes.
    fn push(&mut self, id: u32) -> String {
        match self {
            Self::Tiktoken(d) => push_lossy(d, id),
            Self::Whole { fmt, ids, sent } => {
                ids.push(id);
                let text = fmt.decode_lossy(ids).unwrap_or_default();
                // A trailing U+FFFD may be a character whose last bytes are still to come.
                let ready = text.trim_end_matches(char::REPLACEMENT_CHARACTER);
                match ready.get(*sent..) {
                    Some(new) if ready.len() > *sent => {
                        *sent = ready.len();
                        new.to_owned()
                    }
                    _ => String::new(),
                }
            }
        }
    }

    /// What is still held back.
    fn finish(self) -> String {
        match self {
            Self::Tiktoken(d) => d.finish(),
            Self::Whole { fmt, ids, sent } => {
                let text = fmt.decode_lossy(&ids).unwrap_or_default();
                text.get(sent..).unwrap_or_default().to_owned()
            }
        }
    }
}

/// The text of `ids` exactly as [`Sink`] streams it.
pub fn text(fmt: &PromptFormat, ids: &[u32]) -> String {
    let mut d = Decoder::new(fmt);
    let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
    s.push_str(&d.finish());
    s
}

/// The `--json` object. `chat`: the run rendered a chat prompt, and whether it opened the think
/// block; `message` then splits the reply into reasoning, answer and tool calls.
pub fn json(
    target: &Target,
    opened: &Opened,
    prompt_ids: &[u32],
    out: &Generation,
    chat: Option<bool>,
    machine: &Telemetry,
) -> Result<Value> {
    let loaded = &opened.loaded;
    let text = target.fmt.as_ref().map(|f| text(f, &out.tokens));
    let message = match (&target.fmt, chat) {
        (Some(f), Some(reasoning_open)) => Some(message(f, &out.tokens, reasoning_open)?),
        _ => None,
    };
    Ok(json!({
        "model": target.read_dir.display().to_string(),
        "demo_model": target.demo,
        "experts": loaded.mode,
        "io_backend": loaded.io_backend(),
        "isa": sluice_kernels::isa().name(),
        "spine": opened.spine,
        "plan": loaded.plan.as_ref().map(serde_json::to_value).transpose()?,
        "prompt_ids": prompt_ids,
        "generated_ids": out.tokens,
        "text": text,
        "message": message,
        "finish_reason": out.stats.finish_reason,
        "stats": serde_json::to_value(&out.stats)?,
        "load_s": opened.load_s,
        "machine": machine,
        "remote": remote_stats(opened).map(serde_json::to_value).transpose()?,
    }))
}

/// A `run --chat` reply split as the server splits it ([`PromptFormat::parse_reply`]). `run`
/// declares no tools, so tool-call markup in the reply is answer text, never a call.
pub fn message(fmt: &PromptFormat, ids: &[u32], reasoning_open: bool) -> Result<ParsedOutput> {
    Ok(fmt.parse_reply(ids, reasoning_open, false)?)
}

fn remote_stats(opened: &Opened) -> Option<sluice_store::RemoteStats> {
    opened.loaded.streaming.as_ref().and_then(|s| s.disk_cache()).map(|d| d.stats())
}

/// The `--stats` lines on stderr.
pub fn print_stats(opened: &Opened, out: &Generation, machine: &Telemetry) {
    let s = &out.stats;
    eprintln!(
        "stats: load {:.3}s, prompt {} tokens, prefill {:.3}s, prefill passes {} ({} states \
         captured, {} capture cuts), generated {} tokens, {:.4} s/token, \
         {} passes, {:.2} tokens/pass, draft {} ({} drafted, {} accepted, acceptance {:.3}, widths {:?}, \
         {:.3}s drafting), experts {} requests / {} bytes served / {} bytes read ({:.0} served, \
         {:.0} read per token; {} expert reads in {} disk requests), spine {:.0} bytes per token, \
         hit rate {:.3}, prefetch {} issued / {} used / {} bytes wasted (recall {:.3}), \
         io wait {:.3}s, read {:.3}s, \
         spine {} bytes read ({:.0} per pass, wait {:.3}s), state {} bytes, \
         peak rss {} bytes, finish {}",
        opened.load_s,
        s.prompt_tokens,
        s.prefill_s,
        s.prefill_passes,
        s.prefill_captures,
        s.capture_cuts,
        s.generated_tokens,
        s.s_per_token,
        s.passes,
        s.tokens_per_pass,
        s.drafter,
        s.drafted,
        s.accepted,
        s.acceptance,
        s.width_histogram,
        s.draft_s,
        s.expert_requests,
        s.expert_bytes,
        s.expert_bytes_read,
        s.expert_bytes_per_token,
        s.expert_bytes_read_per_token,
        s.expert_reads,
        s.expert_span_reads,
        s.spine_bytes_per_token,
        s.hit_rate,
        s.prefetch_issued,
        s.prefetch_used,
        s.prefetch_wasted_bytes,
        s.prefetch_recall,
        s.io_wait_s,
        s.read_s,
        s.spine_bytes_read,
        s.spine_bytes_per_pass,
        s.spine_io_wait_s,
        s.state_bytes,
        s.peak_rss_bytes,
        s.finish_reason
    );
    eprintln!("{machine}");
    if let Some(b) = opened.loaded.io_backend() {
        eprintln!("stats: expert reads through {b}");
    }
    if s.expert_read_errors > 0 {
        eprintln!(
            "stats: {} expert reads failed with no pass waiting on them (dropped; a pass \
             that needed one of those experts read it again)",
            s.expert_read_errors
        );
    }
    if let Some(p) = &s.policy {
        eprintln!("draft width: {p}");
    }
    eprint!("{}", layer_stats::describe("prefill", &s.prefill_layers));
    eprint!("{}", layer_stats::describe("decode", &s.decode_layers));
    eprint!("{}", describe_pool("prefill", s.prefill_s, &s.prefill_pool));
    eprint!("{}", describe_pool("decode", s.decode_s, &s.decode_pool));
    if let Some(r) = remote_stats(opened) {
        #[allow(clippy::cast_precision_loss)]
        let secs = r.fetch_ns as f64 / 1e9;
        eprintln!(
            "remote: {} requests, {} bytes fetched, {} experts fetched, {} local hits, \
             {secs:.3}s fetching, {} evictions ({} bytes), {} prefetch guesses not local",
            r.requests,
            r.bytes_fetched,
            r.experts_fetched,
            r.local_hits,
            r.evictions,
            r.evicted_bytes,
            r.prefetch_skipped
        );
    }
}

/// One line on where a phase's wall time went between the engine thread working alone and
/// the kernel pool's calls (empty when the phase made no call).
fn describe_pool(phase: &str, wall_s: f64, p: &PoolCounters) -> String {
    if p.calls == 0 || wall_s <= 0.0 {
        return String::new();
    }
    #[allow(clippy::cast_precision_loss)]
    let (busy, tail, mine) = (
        p.busy_ns as f64 / 1e9,
        p.tail_ns as f64 / 1e9,
        p.caller_chunks as f64 / p.chunks.max(1) as f64,
    );
    format!(
        "{phase} pool: {} kernel-pool calls ({} split over the threads, {:.1}% of their chunks \
         on the engine thread, {} woke parked helpers); {:.1}% of the phase inside calls, \
         {:.1}% of it waiting for helpers' last chunks, {:.1}% on the engine thread alone\n",
        p.calls,
        p.split,
        100.0 * mine,
        p.wakes,
        100.0 * busy / wall_s,
        100.0 * tail / wall_s,
        100.0 * (wall_s - busy).max(0.0) / wall_s,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::{describe_pool, message, PoolCounters};
    use sluice_tokenizer::PromptFormat;

    #[test]
    fn pool_line_splits_the_phase_between_calls_and_the_engine_thread() {
        let p = PoolCounters {
            calls: 10,
            split: 8,
            chunks: 64,
            caller_chunks: 16,
            wakes: 1,
            busy_ns: 900_000_000,
            tail_ns: 50_000_000,
        };
        let line = describe_pool("decode", 1.0, &p);
        assert!(line.contains("25.0% of their chunks on the engine thread"), "{line}");
        assert!(line.contains("90.0% of the phase inside calls"), "{line}");
        assert!(line.contains("5.0% of it waiting"), "{line}");
        assert!(line.contains("10.0% on the engine thread alone"), "{line}");
        assert_eq!(describe_pool("prefill", 1.0, &PoolCounters::default()), "");
    }

    #[test]
    fn run_chat_parsed_tool_markup_as_calls_when_no_tools_were_declared() {
        let qwen = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let k2 = "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
                  <|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>";
        let harmony =
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>";
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for (family, text) in
            [("qwen3_moe/tiny-a", qwen), ("deepseek_v3/tiny-b", k2), ("gpt_oss/tiny-a", harmony)]
        {
            let fmt = PromptFormat::from_dir(&fixtures.join(family)).unwrap().unwrap();
            let ids = fmt.tokenizer().encode_rendered(text).unwrap();
            let m = message(&fmt, &ids, false).unwrap();
            assert!(m.tool_calls.is_empty(), "{family}: `run` declares no tools: {m:?}");
            assert!(m.content.contains("{\"a\": 1}"), "{family}: the markup stays text: {m:?}");
        }
    }
}
