//! The routes: request bodies are read under a size and time limit, parsed into validated types,
//! admitted by the scheduler, tokenized on the blocking pool, checked against the context, and
//! handed to the engine thread; responses are collected or streamed.

use crate::anthropic_response::AnthropicError;
use crate::chat_request::parse_chat;
use crate::constrain::{Grammars, OutputConstraint};
use crate::error::ApiError;
use crate::follow_up::{ChatEcho, ToolIds};
use crate::metrics::Metrics;
use crate::output::OutputKind;
use crate::request::{parse_completion, Common, Limits, PromptInput};
use crate::response::{body, collect, stream, Endpoint, Meta};
use crate::scheduler::{JobHandle, Reservation, Scheduler};
use crate::worker::{Event, Job};
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_engine::constraint::SharedConstraint;
use sluice_tokenizer::{ChatMessage, ChatOptions, PromptFormat};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Shared state of the handlers.
#[derive(Debug)]
pub struct App {
    /// Model id and token limits.
    pub limits: Limits,
    /// Rows of the model's logits (prompt ids must be below it).
    pub vocab: usize,
    /// The spine precision (int8 is lossy).
    pub spine: sluice_engine::Spine,
    /// The drafter's name.
    pub drafter: String,
    /// The checkpoint's tokenizer and chat format (used on the blocking pool).
    pub fmt: Arc<PromptFormat>,
    /// The queue.
    pub sched: Arc<Scheduler>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Required bearer token.
    pub api_key: Option<String>,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// Longest wait for a request body.
    pub body_timeout: Duration,
    /// When the server started (Unix seconds; the model's `created`).
    pub started: u64,
    /// Request counter for ids.
    pub next_id: AtomicU64,
    /// The grammar engine's vocabulary index (constrained output), built on first use.
    pub grammars: Grammars,
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The router with every route, the auth check and request counting.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(crate::anthropic_response::messages))
        .fallback(unknown)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), auth))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count))
        .with_state(app)
}

async fn unknown(uri: Uri) -> ApiError {
    let path: String = uri.path().chars().take(200).collect();
    ApiError::UnknownPath(path)
}

async fn wrong_method(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}

/// Counts every response by route and status.
async fn count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route =
        req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let resp = next.run(req).await;
    app.metrics.request(&route, resp.status().as_u16());
    resp
}

/// With `--api-key`, everything but `/health` needs `Authorization: Bearer <key>` (or
/// `x-api-key: <key>`, as Anthropic clients send it).
async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let path = req.uri().path();
        if path != "/health" && !bearer_matches(req.headers(), key) {
            if path == "/v1/messages" {
                return AnthropicError(ApiError::Unauthorized).into_response();
            }
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

fn bearer_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let Some(token) = bearer.or(x_api_key) else {
        return false;
    };
    // Compare without an early exit so timing does not reveal the matching prefix.
    let (a, b) = (token.as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "model": app.limits.model_id,
        "queue_depth": app.sched.depth(),
        "running": app.sched.running(),
    }))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.metrics.render(app.sched.depth(), app.sched.running());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

fn model_card(app: &App) -> Value {
    json!({
        "id": app.limits.model_id,
        "object": "model",
        "created": app.started,
        "owned_by": "sluice",
        "max_model_len": app.limits.context_len,
        "sluice": {
            "spine": app.spine,
            "lossy": app.spine == sluice_engine::Spine::Int8,
            "drafter": app.drafter,
        },
    })
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&app)]}))
}

async fn model(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id == app.limits.model_id {
        Ok(Json(model_card(&app)))
    } else {
        Err(ApiError::ModelNotFound(id))
    }
}

/// Reads the body within the size and time limits and parses it as JSON.
pub(crate) async fn read_json(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let limit = app.max_request_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let bytes: Bytes =
        match tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, limit)).await {
            Err(_) => return Err(ApiError::BodyTimeout),
            Ok(Err(e)) if is_length_limit(&e) => return Err(ApiError::PayloadTooLarge { limit }),
            Ok(Err(e)) => {
                return Err(ApiError::invalid(
                    "body",
                    format!("could not read the request body: {e}"),
                ))
            }
            Ok(Ok(b)) => b,
        };
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("body", format!("the request body is not valid JSON: {e}")))
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        src = s.source();
    }
    false
}

/// Runs `f` with the prompt format on the blocking pool (rendering and tokenizing long
/// prompts).
pub(crate) async fn on_blocking<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&PromptFormat) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let tok = Arc::clone(&app.fmt);
    tokio::task::spawn_blocking(move || f(&tok))
        .await
        .map_err(|e| ApiError::Internal(format!("tokenization task failed: {e}")))?
}

/// The number of tokens to generate: `requested`, or as many as the limits allow.
pub(crate) fn budget(
    limits: &Limits,
    prompt: usize,
    requested: Option<usize>,
    param: &str,
) -> Result<usize, ApiError> {
    let room = limits.context_len.saturating_sub(prompt);
    let over = |asked: usize| ApiError::Invalid {
        message: format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens \
             ({prompt} in the {param}, {asked} in the completion).",
            limits.context_len,
            prompt + asked
        ),
        param: Some(param.to_owned()),
        code: Some("context_length_exceeded"),
    };
    match requested {
        // The message counts what was asked: a request naming no limit asks for at least one.
        _ if room == 0 => Err(over(requested.unwrap_or(1))),
        Some(m) if m > room => Err(over(m)),
        Some(m) => Ok(m),
        None => Ok(limits.max_tokens.min(room)),
    }
}

/// Queues a job; its events arrive on the receiver, and dropping the handle cancels it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit(
    app: &App,
    reservation: Reservation,
    prompt: Prompt,
    sampling: sluice_engine::Sampling,
    stop: Vec<String>,
    max_new: usize,
    logprobs: Option<usize>,
    output: OutputKind,
    constraint: Option<SharedConstraint>,
) -> (UnboundedReceiver<Event>, JobHandle) {
    let (tx, rx) = unbounded_channel();
    let job = Job {
        id: app.next_id.fetch_add(1, Ordering::Relaxed),
        prompt: prompt.ids,
        boundaries: prompt.boundaries,
        keep_prompt_end: prompt.keep_end,
        echo: prompt.echo,
        max_new,
        sampling,
        stop,
        logprobs,
        output,
        constraint,
        cancel: Arc::new(AtomicBool::new(false)),
        events: tx,
        enqueued: Instant::now(),
    };
    (rx, reservation.submit(job))
}

/// Queues the job and answers: streamed, or collected into one body.
#[allow(clippy::too_many_arguments)]
async fn run(
    app: &App,
    reservation: Reservation,
    meta: Meta,
    prompt: Prompt,
    common: &Common,
    max_new: usize,
    logprobs: Option<usize>,
    output: OutputKind,
    constraint: Option<SharedConstraint>,
) -> Result<Response, ApiError> {
    let (mut rx, handle) = submit(
        app,
        reservation,
        prompt,
        common.sampling,
        common.stop.clone(),
        max_new,
        logprobs,
        output,
        constraint,
    );
    if common.stream {
        return Ok(stream(meta, rx, handle, common.include_usage).into_response());
    }
    // `handle` lives across the wait: if the client disconnects, this future is dropped with it
    // and the job is cancelled.
    let collected = collect(&mut rx).await?;
    drop(handle);
    Ok((StatusCode::OK, Json(body(&meta, &collected))).into_response())
}

fn meta(app: &App, endpoint: Endpoint, logprobs: bool) -> Meta {
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let mix = (app.started ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17);
    Meta {
        endpoint,
        id: format!("{prefix}-{mix:016x}{n:08x}"),
        created: unix_now(),
        model: app.limits.model_id.clone(),
        logprobs,
    }
}

async fn chat(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let v = read_json(&app, &headers, body).await?;
    let req = parse_chat(&v, &app.limits)?;
    drop(v);
    let reservation = app.sched.reserve()?;
    let chat = render_chat(&app, req.messages, req.options.clone(), req.constraint.clone()).await?;
    let max_new = budget(&app.limits, chat.prompt.ids.len(), req.common.max_tokens, "messages")?;
    let output = OutputKind::Chat { reasoning_open: chat.reasoning_open, tools: req.parse_tools };
    let meta = meta(&app, Endpoint::Chat, req.logprobs.is_some());
    let (prompt, constraint) = chat.into_prompt(ToolIds::OpenAi { response: meta.id.clone() });
    run(&app, reservation, meta, prompt, &req.common, max_new, req.logprobs, output, constraint)
        .await
}

/// A chat request rendered for the engine.
pub(crate) struct RenderedRequest {
    /// The prompt and its message boundaries.
    pub(crate) prompt: Prompt,
    /// The prompt opened the reasoning the reply starts in.
    pub(crate) reasoning_open: bool,
    /// The compiled output constraint.
    pub(crate) constraint: Option<SharedConstraint>,
    /// The messages and options it was rendered from (for [`RenderedRequest::echo`]).
    pub(crate) conversation: (Vec<ChatMessage>, ChatOptions),
}

impl RenderedRequest {
    /// The prompt, with its follow-up for a response that names tool calls as `ids` do.
    pub(crate) fn into_prompt(self, ids: ToolIds) -> (Prompt, Option<SharedConstraint>) {
        let (messages, options) = self.conversation;
        let prompt = Prompt { echo: Some(ChatEcho { messages, options, ids }), ..self.prompt };
        (prompt, self.constraint)
    }
}

/// Renders a chat request through the checkpoint's chat format on the blocking pool, finds its
/// message boundaries and compiles its constraint (both APIs).
pub(crate) async fn render_chat(
    app: &Arc<App>,
    messages: Vec<ChatMessage>,
    options: ChatOptions,
    constraint: Option<OutputConstraint>,
) -> Result<RenderedRequest, ApiError> {
    let shared = Arc::clone(app);
    on_blocking(app, move |fmt| {
        let rendered = fmt.render_chat(&messages, &options).map_err(render_error)?;
        let (boundaries, keep_end) = message_boundaries(fmt, &messages, &options, &rendered.ids);
        let c = match constraint {
            Some(c) => Some(shared.grammars.compile(fmt, &c, rendered.reasoning)?),
            None => None,
        };
        Ok(RenderedRequest {
            prompt: Prompt { ids: rendered.ids, boundaries, keep_end, echo: None },
            reasoning_open: rendered.reasoning_open,
            constraint: c,
            conversation: (messages, options),
        })
    })
    .await
}

/// A prompt that cannot be rendered: the client's (a bad effort, a template's own
/// `raise_exception` about the conversation), named by the field it came from.
fn render_error(e: sluice_tokenizer::PromptError) -> ApiError {
    use sluice_tokenizer::{Error as K3Error, PromptError as P};
    match e {
        P::K3Chat(K3Error::UnsupportedEffort(_)) => {
            ApiError::invalid("reasoning_effort", e.to_string())
        }
        P::Tokenizer(_) => ApiError::Internal(e.to_string()),
        _ => ApiError::invalid("messages", e.to_string()),
    }
}

/// Where the conversation's messages end inside `prompt`, and whether a later prompt can start
/// with all of it: the positions the state cache writes the state at.
///
/// The cuts are after the leading system messages (the system prompt and tool declarations
/// that conversations of one agent share) and after the last message, before the assistant
/// turn the model completes. Each is rendered through the same chat format without the
/// generation prompt and without what a format writes after the last message for
/// `tool_choice` and `response_format` (a next request writes those after its own messages, so
/// a cut that included them would be a prefix of nothing but this prompt); a cut whose
/// rendering is not a prefix of the prompt (a history turn rendered differently once it is not
/// the last) is left out.
///
/// The prompt's end is kept when a follow-up starts with it: the conversation with a reply
/// and a next user message appended, rendered without the generation prompt, begins with the
/// whole prompt (no trailing `tool_choice` or `response_format` message sits before the
/// reply, and the format renders a history reply after the same header the generation prompt
/// wrote). Then the last message's cut is dropped: every follow-up that starts with it starts
/// with the prompt's end too, and a second state a few tokens shorter would double the bytes
/// written (0.6 GB each for Kimi K3). Otherwise the prompt's end is not written and the last
/// message's cut is where a follow-up resumes.
pub(crate) fn message_boundaries(
    fmt: &PromptFormat,
    messages: &[ChatMessage],
    options: &ChatOptions,
    prompt: &[u32],
) -> (Vec<usize>, bool) {
    let opts = ChatOptions {
        add_generation_prompt: false,
        tool_choice: None,
        response_format: None,
        ..options.clone()
    };
    let mut follow = messages.to_vec();
    follow.push(ChatMessage::new(sluice_tokenizer::Role::Assistant, "Done.".to_owned()));
    follow.push(ChatMessage::new(sluice_tokenizer::Role::User, "Next.".to_owned()));
    let keep_end = fmt.render_chat(&follow, &opts).is_ok_and(|r| r.ids.starts_with(prompt));
    let leading = messages.iter().take_while(|m| m.role == sluice_tokenizer::Role::System).count();
    let last = if keep_end { None } else { Some(messages.len()) };
    let mut out = Vec::new();
    for cut in [Some(leading), last].into_iter().flatten() {
        if cut == 0 {
            continue;
        }
        if let Ok(r) = fmt.render_chat(&messages[..cut], &opts) {
            let ids = r.ids;
            if !ids.is_empty() && ids.len() < prompt.len() && prompt.starts_with(&ids) {
                out.push(ids.len());
            }
        }
    }
    out.dedup();
    (out, keep_end)
}

/// A prompt's ids and its message boundaries ([`Job::boundaries`]).
pub(crate) struct Prompt {
    /// The prompt's token ids.
    pub(crate) ids: Vec<u32>,
    /// Positions that end a message (see [`message_boundaries`]).
    pub(crate) boundaries: Vec<usize>,
    /// Whether the state at the prompt's end is written (see [`message_boundaries`]).
    pub(crate) keep_end: bool,
    /// A chat prompt's conversation, for what a follow-up request starts with ([`Job::echo`]).
    pub(crate) echo: Option<ChatEcho>,
}

async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let v = read_json(&app, &headers, body).await?;
    let req = parse_completion(&v, &app.limits)?;
    drop(v);
    let reservation = app.sched.reserve()?;
    let vocab = app.vocab;
    let input = req.prompt.clone();
    let prompt = on_blocking(&app, move |tok| match input {
        PromptInput::Text(t) => tok.encode_text(&t).map_err(|e| ApiError::Internal(e.to_string())),
        PromptInput::Ids(ids) => match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(ApiError::invalid(
                "prompt",
                format!("token id {id} is out of range: the vocabulary has {vocab} tokens"),
            )),
            None => Ok(ids),
        },
    })
    .await?;
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty (it encodes to no tokens)"));
    }
    let max_new = budget(&app.limits, prompt.len(), req.common.max_tokens.or(Some(16)), "prompt")?;
    let meta = meta(&app, Endpoint::Completion, req.logprobs.is_some());
    let prompt = Prompt { ids: prompt, boundaries: Vec::new(), keep_end: true, echo: None };
    let text = OutputKind::Text;
    run(&app, reservation, meta, prompt, &req.common, max_new, req.logprobs, text, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_respect_the_context_and_the_server_cap() {
        let l = Limits { model_id: "m".into(), max_tokens: 50, context_len: 100 };
        assert_eq!(budget(&l, 10, None, "prompt").ok(), Some(50));
        assert_eq!(budget(&l, 70, None, "prompt").ok(), Some(30));
        assert_eq!(budget(&l, 70, Some(30), "prompt").ok(), Some(30));
        let e = budget(&l, 70, Some(31), "prompt").expect_err("over the context");
        assert_eq!(e.body()["error"]["code"], json!("context_length_exceeded"));
        assert!(budget(&l, 100, None, "messages").is_err());
    }

    #[test]
    fn context_length_exceeded_said_1_completion_token() {
        let l = Limits { model_id: "m".into(), max_tokens: 50, context_len: 100 };
        let e = budget(&l, 100, Some(40), "prompt").expect_err("no room at all");
        let msg = e.body()["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            msg.contains("you requested 140 tokens (100 in the prompt, 40 in the completion)"),
            "{msg}"
        );
    }

    #[test]
    fn bearer_tokens_must_match_exactly() {
        let mut h = HeaderMap::new();
        assert!(!bearer_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap_or_else(|_| panic!("header")));
        assert!(bearer_matches(&h, "k"));
        assert!(!bearer_matches(&h, "kk"));
        h.insert(header::AUTHORIZATION, "Basic k".parse().unwrap_or_else(|_| panic!("header")));
        assert!(!bearer_matches(&h, "k"));
    }
}
