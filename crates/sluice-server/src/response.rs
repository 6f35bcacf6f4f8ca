//! Response bodies and SSE chunks in the OpenAI shapes, plus the `sluice` extension object that
//! carries the generated token ids and the engine's timings (documented in docs/SERVER.md).

use crate::error::ApiError;
use crate::output::{Delta, TokenLogprob};
use crate::scheduler::JobHandle;
use crate::worker::{Event, Summary};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{json, Value};
use sluice_tokenizer::ChatToolCall as ParsedToolCall;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What every body and chunk of one response repeats.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// `chatcmpl-…` / `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// Whether logprobs were asked for.
    pub logprobs: bool,
}

/// Everything a finished job produced.
#[derive(Debug, Clone)]
pub struct Collected {
    /// All output.
    pub delta: Delta,
    /// The end.
    pub summary: Summary,
}

/// Waits for a job's end, accumulating its output.
pub async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut delta = Delta::default();
    loop {
        match rx.recv().await {
            Some(Event::Delta(d)) => delta.extend(d),
            Some(Event::Done(summary)) => return Ok(Collected { delta, summary: *summary }),
            other => return Err(failure(other)),
        }
    }
}

/// The error a job that ended with `event` (neither output nor a normal end) answers with;
/// `None`: the engine dropped the job's channel.
pub(crate) fn failure(event: Option<Event>) -> ApiError {
    match event {
        Some(Event::Failed(m)) => ApiError::Internal(m),
        Some(Event::GrammarFailed { cause, generated }) => {
            ApiError::GrammarFailed { cause, generated }
        }
        Some(Event::ShuttingDown) => ApiError::ShuttingDown,
        Some(Event::Delta(_) | Event::Done(_)) | None => {
            ApiError::Internal("the engine dropped the request".into())
        }
    }
}

/// `usage`, with cached prompt tokens and reasoning tokens.
pub fn usage(s: &Summary) -> Value {
    let completion = s.generated_ids.len();
    json!({
        "prompt_tokens": s.stats.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": s.stats.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": s.stats.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
    })
}

/// The `sluice` extension: generated ids, reuse, timing and the speculative width policy.
pub fn extension(s: &Summary) -> Value {
    json!({
        "generated_ids": s.generated_ids,
        "prompt_tokens": s.stats.prompt_tokens,
        "cached_tokens": s.stats.cached_tokens,
        "prefill_tokens": s.stats.prefill_tokens,
        "prefill_passes": s.stats.prefill_passes,
        "prefill_captures": s.stats.prefill_captures,
        "capture_cuts": s.stats.capture_cuts,
        "decode_passes": s.stats.decode_passes,
        "drafted": s.stats.drafted,
        "accepted": s.stats.accepted,
        "policy": s.stats.policy,
        "snapshots": s.stats.snapshots,
        "snapshot_bytes": s.stats.snapshot_bytes,
        "state_cache_tokens_restored": s.stats.state_cache_tokens_restored,
        "state_cache_bytes_restored": s.stats.state_cache_bytes_restored,
        "state_cache_bytes_written": s.stats.state_cache_bytes_written,
        "expert_bytes_read": s.stats.expert_bytes_read,
        "queue_s": s.queue_s,
        "ttft_s": s.stats.ttft_s,
        "total_s": s.total_s,
    })
}

/// The id of call `index` of response `response` (`chatcmpl-…`).
pub(crate) fn tool_call_id(response: &str, index: usize) -> String {
    format!("call_{}_{}", response.rsplit('-').next().unwrap_or_default(), index)
}

fn tool_calls(meta: &Meta, calls: &[ParsedToolCall], with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                let mut v = json!({
                    "id": tool_call_id(&meta.id, c.index),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if with_index {
                    v["index"] = json!(c.index);
                }
                v
            })
            .collect(),
    )
}

fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let entry = |t: &str, b: &[u8], l: f32| json!({"token": t, "logprob": l, "bytes": b});
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(&lp.token, &lp.bytes, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|(t, b, l)| entry(t, b, *l)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

fn completion_logprobs(lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(lps.len());
    for lp in lps {
        text_offset.push(offset);
        offset += lp.token.len();
    }
    json!({
        "tokens": lps.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| {
            let m: serde_json::Map<String, Value> = l.top.iter().map(|(t, _, p)| (t.clone(), json!(p))).collect();
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

fn logprobs_value(meta: &Meta, lps: &[TokenLogprob], offset: usize) -> Value {
    match (meta.logprobs, meta.endpoint) {
        (false, _) => Value::Null,
        (true, Endpoint::Chat) => chat_logprobs(lps),
        (true, Endpoint::Completion) => completion_logprobs(lps, offset),
    }
}

fn nonempty(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        json!(s)
    }
}

/// The non-streaming body.
pub fn body(meta: &Meta, c: &Collected) -> Value {
    let d = &c.delta;
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let mut message = json!({
                "role": "assistant",
                "content": if d.content.is_empty() && !d.tool_calls.is_empty() { Value::Null } else { json!(d.content) },
                "reasoning_content": nonempty(&d.reasoning),
            });
            if !d.tool_calls.is_empty() {
                message["tool_calls"] = tool_calls(meta, &d.tool_calls, false);
            }
            json!({"index": 0, "message": message, "logprobs": logprobs_value(meta, &d.logprobs, 0),
                   "finish_reason": c.summary.finish_reason})
        }
        Endpoint::Completion => json!({"index": 0, "text": d.content,
            "logprobs": logprobs_value(meta, &d.logprobs, 0), "finish_reason": c.summary.finish_reason}),
    };
    json!({
        "id": meta.id,
        "object": if meta.endpoint == Endpoint::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage(&c.summary),
        "sluice": extension(&c.summary),
    })
}

/// One SSE chunk; `choice` is the choice object without `index`, or `None` for the usage chunk.
fn chunk(meta: &Meta, choice: Option<Value>, include_usage: bool) -> Value {
    let object = match meta.endpoint {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completion => "text_completion",
    };
    let choices = match choice {
        Some(mut c) => {
            c["index"] = json!(0);
            vec![c]
        }
        None => Vec::new(),
    };
    let mut v = json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": choices});
    if include_usage {
        v["usage"] = Value::Null;
    }
    v
}

/// SSE state of one streamed response.
struct Streamer {
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    /// `data:` payloads ready to send.
    out: VecDeque<String>,
    text_offset: usize,
    done: bool,
    /// Held so that dropping the stream (client gone) cancels the job.
    _handle: JobHandle,
}

impl Streamer {
    fn push(&mut self, choice: Option<Value>) {
        let c = chunk(&self.meta, choice, self.include_usage);
        self.out.push_back(c.to_string());
    }

    fn delta(&mut self, d: &Delta) {
        let logprobs = logprobs_value(&self.meta, &d.logprobs, self.text_offset);
        self.text_offset += d.logprobs.iter().map(|l| l.token.len()).sum::<usize>();
        let choice = match self.meta.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({});
                if !d.reasoning.is_empty() {
                    delta["reasoning_content"] = json!(d.reasoning);
                }
                if !d.content.is_empty() {
                    delta["content"] = json!(d.content);
                }
                if !d.tool_calls.is_empty() {
                    delta["tool_calls"] = tool_calls(&self.meta, &d.tool_calls, true);
                }
                json!({"delta": delta, "logprobs": logprobs, "finish_reason": null})
            }
            Endpoint::Completion => {
                json!({"text": d.content, "logprobs": logprobs, "finish_reason": null})
            }
        };
        self.push(Some(choice));
    }

    fn finish(&mut self, s: &Summary) {
        let mut last = match self.meta.endpoint {
            Endpoint::Chat => {
                json!({"delta": {}, "logprobs": null, "finish_reason": s.finish_reason})
            }
            Endpoint::Completion => {
                json!({"text": "", "logprobs": null, "finish_reason": s.finish_reason})
            }
        };
        last["sluice"] = extension(s);
        self.push(Some(last));
        if self.include_usage {
            let mut u = chunk(&self.meta, None, false);
            u["usage"] = usage(s);
            self.out.push_back(u.to_string());
        }
    }

    async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(data) = self.out.pop_front() {
                return Some(SseEvent::default().data(data));
            }
            if self.done {
                return None;
            }
            match self.rx.recv().await {
                Some(Event::Delta(d)) => self.delta(&d),
                Some(Event::Done(s)) => {
                    self.finish(&s);
                    self.done = true;
                    self.out.push_back("[DONE]".into());
                }
                other => {
                    self.out.push_back(failure(other).body().to_string());
                    self.out.push_back("[DONE]".into());
                    self.done = true;
                }
            }
        }
    }
}

/// The SSE response for a submitted job.
pub fn stream(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    handle: JobHandle,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut st = Streamer {
        meta,
        rx,
        include_usage,
        out: VecDeque::new(),
        text_offset: 0,
        done: false,
        _handle: handle,
    };
    if st.meta.endpoint == Endpoint::Chat {
        st.push(Some(json!({"delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})));
    }
    let s = futures_util::stream::unfold(st, |mut st| async move {
        let ev = st.next_event().await?;
        Some((Ok(ev), st))
    });
    // Comments every few seconds keep proxies from timing out during a long prefill and let a
    // write reveal a client that went away.
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}
