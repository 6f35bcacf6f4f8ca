//! The Messages API's answers: the handler of `POST /v1/messages`, the message body, the SSE
//! event sequence (`message_start`, `ping`, `content_block_start` / `content_block_delta` /
//! `content_block_stop` per block with `thinking_delta`, `text_delta` and `input_json_delta`,
//! `message_delta`, `message_stop`), and errors in the API's shape
//! `{"type": "error", "error": {"type", "message"}}` with the same statuses as the OpenAI routes.

use crate::anthropic::parse_messages;
use crate::api::{budget, read_json, render_chat, submit, App};
use crate::error::{ApiError, RETRY_AFTER_S};
use crate::follow_up::ToolIds;
use crate::output::{Delta, OutputKind};
use crate::response::{collect, failure};
use crate::scheduler::JobHandle;
use crate::worker::{Event, Summary};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sluice_tokenizer::ChatToolCall as ParsedToolCall;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// An [`ApiError`] answered in the Messages API's shape.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl AnthropicError {
    /// The API's error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.0.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            StatusCode::INTERNAL_SERVER_ERROR => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// `{"type": "error", "error": {"type", "message"}}`; the message names the field.
    pub fn body(&self) -> Value {
        let mut message = self.0.to_string();
        if let ApiError::Invalid { param: Some(p), .. } = &self.0 {
            if !message.starts_with(p.as_str()) {
                message = format!("{p}: {message}");
            }
        }
        json!({"type": "error", "error": {"type": self.kind(), "message": message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status(), Json(self.body())).into_response();
        match self.0 {
            ApiError::QueueFull { .. } => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            }
            ApiError::Unauthorized => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}

/// What every body and event of one response repeats.
#[derive(Debug, Clone)]
struct Meta {
    id: String,
    model: String,
    input_tokens: usize,
}

/// `POST /v1/messages`.
pub async fn messages(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AnthropicError> {
    let v = read_json(&app, &headers, body).await?;
    let req = parse_messages(&v, &app.limits)?;
    drop(v);
    let reservation = app.sched.reserve()?;
    let chat = render_chat(&app, req.messages, req.options.clone(), req.constraint.clone()).await?;
    let input_tokens = chat.prompt.ids.len();
    let max_new = budget(&app.limits, input_tokens, Some(req.max_tokens), "max_tokens")?;
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let mix = (app.started ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17);
    let meta = Meta {
        id: format!("msg_{mix:016x}{n:08x}"),
        model: app.limits.model_id.clone(),
        input_tokens,
    };
    let output = OutputKind::Chat { reasoning_open: chat.reasoning_open, tools: req.parse_tools };
    let (prompt, constraint) = chat.into_prompt(ToolIds::Anthropic { message: meta.id.clone() });
    let (mut rx, handle) = submit(
        &app,
        reservation,
        prompt,
        req.sampling,
        req.stop,
        max_new,
        None,
        output,
        constraint,
    );
    if req.stream {
        return Ok(stream(meta, rx, handle).into_response());
    }
    let collected = collect(&mut rx).await?;
    drop(handle);
    Ok((StatusCode::OK, Json(message_body(&meta, &collected.delta, &collected.summary)))
        .into_response())
}

/// The API's `stop_reason` for how generation ended.
fn stop_reason(s: &Summary) -> &'static str {
    match s.finish_reason.as_str() {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        _ if s.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

fn usage(s: &Summary) -> Value {
    json!({
        "input_tokens": s.stats.prompt_tokens - s.stats.cached_tokens,
        "cache_read_input_tokens": s.stats.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": s.generated_ids.len(),
    })
}

/// The id of tool call `c` in message `message` (`msg_…`).
pub(crate) fn tool_id(message: &str, c: &ParsedToolCall) -> String {
    format!("toolu_{}_{}", message.trim_start_matches("msg_"), c.index)
}

/// A call's arguments as the `input` object; text that is not a JSON object is kept whole under
/// `_raw` (the model wrote it; unconstrained output can be malformed).
pub(crate) fn input_of(c: &ParsedToolCall) -> Value {
    match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_raw": c.arguments}),
    }
}

/// The sluice extension: generated ids, reuse and timing, and the engine's own finish reason.
fn extension(s: &Summary) -> Value {
    let mut e = crate::response::extension(s);
    e["finish_reason"] = json!(s.finish_reason);
    e
}

/// The non-streaming message.
fn message_body(meta: &Meta, d: &Delta, s: &Summary) -> Value {
    let mut content = Vec::new();
    if !d.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": d.reasoning, "signature": ""}));
    }
    if !d.content.is_empty() {
        content.push(json!({"type": "text", "text": d.content}));
    }
    for c in &d.tool_calls {
        content.push(
            json!({"type": "tool_use", "id": tool_id(&meta.id, c), "name": c.name, "input": input_of(c)}),
        );
    }
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop_reason(s),
        "stop_sequence": s.stop_sequence,
        "usage": usage(s),
        "sluice": extension(s),
    })
}

/// The kind of the content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// SSE state of one streamed message.
struct Streamer {
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    /// `(event name, data)` ready to send.
    out: VecDeque<(&'static str, Value)>,
    /// The open block and its index.
    open: Option<(Open, usize)>,
    next_index: usize,
    done: bool,
    /// Held so that dropping the stream (client gone) cancels the job.
    _handle: JobHandle,
}

impl Streamer {
    fn emit(&mut self, event: &'static str, data: Value) {
        self.out.push_back((event, data));
    }

    fn close(&mut self) {
        if let Some((_, index)) = self.open.take() {
            self.emit("content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// The index of an open block of `kind`, opening one (and closing another) when needed.
    fn block(&mut self, kind: Open) -> usize {
        if let Some((k, i)) = self.open {
            if k == kind {
                return i;
            }
        }
        self.close();
        let index = self.next_index;
        self.next_index += 1;
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Open::Text => json!({"type": "text", "text": ""}),
        };
        self.emit(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        self.open = Some((kind, index));
        index
    }

    fn delta(&mut self, d: &Delta) {
        if !d.reasoning.is_empty() {
            let index = self.block(Open::Thinking);
            let delta = json!({"type": "thinking_delta", "thinking": d.reasoning});
            self.emit(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        if !d.content.is_empty() {
            let index = self.block(Open::Text);
            let delta = json!({"type": "text_delta", "text": d.content});
            self.emit(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        for c in &d.tool_calls {
            self.close();
            let index = self.next_index;
            self.next_index += 1;
            let id = tool_id(&self.meta.id, c);
            let block = json!({"type": "tool_use", "id": id, "name": c.name, "input": {}});
            self.emit(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            );
            let delta =
                json!({"type": "input_json_delta", "partial_json": input_of(c).to_string()});
            self.emit(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
            self.emit("content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn finish(&mut self, s: &Summary) {
        self.close();
        self.emit(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(s), "stop_sequence": s.stop_sequence},
                   "usage": {"output_tokens": s.generated_ids.len()},
                   "sluice": extension(s)}),
        );
        self.emit("message_stop", json!({"type": "message_stop"}));
    }

    async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some((name, data)) = self.out.pop_front() {
                return Some(SseEvent::default().event(name).data(data.to_string()));
            }
            if self.done {
                return None;
            }
            match self.rx.recv().await {
                Some(Event::Delta(d)) => self.delta(&d),
                Some(Event::Done(s)) => {
                    self.finish(&s);
                    self.done = true;
                }
                other => {
                    self.emit("error", AnthropicError(failure(other)).body());
                    self.done = true;
                }
            }
        }
    }
}

/// The SSE response for a submitted job.
fn stream(meta: Meta, rx: UnboundedReceiver<Event>, handle: JobHandle) -> impl IntoResponse {
    let mut st = Streamer {
        meta,
        rx,
        out: VecDeque::new(),
        open: None,
        next_index: 0,
        done: false,
        _handle: handle,
    };
    let start = json!({"type": "message_start", "message": {
        "id": st.meta.id, "type": "message", "role": "assistant", "model": st.meta.model,
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": st.meta.input_tokens, "output_tokens": 0},
    }});
    st.emit("message_start", start);
    st.emit("ping", json!({"type": "ping"}));
    let s = futures_util::stream::unfold(st, |mut st| async move {
        let ev = st.next_event().await?;
        Some((Ok::<_, std::convert::Infallible>(ev), st))
    });
    // Anthropic's servers send `ping` events; SSE comments serve the same purpose here and are
    // ignored by clients.
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_messages_api_shape() {
        let e = AnthropicError(ApiError::invalid("messages[1].role", "roles must alternate"));
        assert_eq!(
            e.body(),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                   "message": "messages[1].role: roles must alternate"}})
        );
        let r = AnthropicError(ApiError::QueueFull { queued: 0, limit: 0 }).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(AnthropicError(ApiError::ModelNotFound("x".into())).kind(), "not_found_error");
        assert_eq!(AnthropicError(ApiError::Unauthorized).kind(), "authentication_error");
    }
}
