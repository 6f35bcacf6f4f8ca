//! sluice's OpenAI-compatible HTTP server (axum on tokio).
//!
//! - [`api`]: routes, body limits, auth, request counting.
//! - [`request`], [`chat_request`], [`fields`]: request bodies parsed into validated types;
//!   every unknown or unsupported field is refused with a 400 naming it.
//! - [`scheduler`]: admission (429 when full), the FIFO queue, cancellation handles.
//! - [`worker`] and [`output`]: the engine thread — model passes, state reuse, detokenization,
//!   the chat format's reasoning/tool-call parser (sluice-tokenizer's), stop strings and logprobs, all off the async runtime.
//! - [`response`]: OpenAI-shaped bodies and SSE chunks.
//! - [`anthropic`] and [`anthropic_response`]: `POST /v1/messages`, the Anthropic Messages API.
//! - [`constrain`]: JSON and required-tool output enforced by a grammar over the logits.
//! - [`error`]: the one mapping from errors to HTTP status and body.
//! - [`metrics`]: `GET /metrics` in the Prometheus text format.
//!
//! The API, every accepted field and every refusal are documented in docs/SERVER.md.

pub mod anthropic;
pub mod anthropic_response;
pub mod api;
pub mod chat_request;
pub mod constrain;
mod deadline;
pub mod error;
pub mod fields;
mod follow_up;
pub mod machine_metrics;
pub mod metrics;
pub mod output;
pub mod request;
pub mod response;
pub mod scheduler;
pub mod worker;

use crate::api::{router, unix_now, App};
use crate::metrics::Metrics;
use crate::request::Limits;
use crate::scheduler::Scheduler;
use crate::worker::{EngineSettings, Worker};
use sluice_engine::session::{SessionCache, SessionConfig};
use sluice_engine::state_cache::StateCache;
use sluice_engine::{Drafter, Spine};
use sluice_models::Model;
use sluice_tokenizer::PromptFormat;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Everything `sluice serve` configures.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (default 127.0.0.1).
    pub host: String,
    /// Port (0 picks a free one; the ready callback gets the real address).
    pub port: u16,
    /// Bearer token required on every route but `/health`.
    pub api_key: Option<String>,
    /// Requests that may wait behind the running one.
    pub queue: usize,
    /// Most tokens one request may generate (and the default for chat).
    pub max_tokens: usize,
    /// Most prompt + generated tokens.
    pub context_len: usize,
    /// Largest request body in bytes.
    pub max_request_bytes: usize,
    /// Longest wait for a request body.
    pub body_timeout: Duration,
    /// The model id clients name.
    pub model_id: String,
    /// Drafting width and per-request statistics.
    pub engine: EngineSettings,
    /// The spine precision the model was opened with (shown in `/v1/models`).
    pub spine: Spine,
    /// The drafter's name (`none`, `ngram`, `model:DIR`; shown in `/v1/models`).
    pub drafter: String,
    /// State reuse.
    pub session: SessionConfig,
    /// The model's directory (its disk and shards are watched for `/metrics`), if on disk.
    pub model_dir: Option<std::path::PathBuf>,
    /// The `--memory` budget, reported beside peak RSS.
    pub budget: Option<u64>,
    /// The on-disk prompt-state cache (`--state-cache`), when configured.
    pub state_cache: Option<Arc<StateCache>>,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The runtime, the engine thread or the listener failed.
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The checkpoint declares no token that ends a reply.
    #[error("the checkpoint declares no stop token (eos_token, eos_token_id); the server could not end replies")]
    NoStopToken,
}

/// How long a stopping server waits for open connections, and then for the engine's pass.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `model` until interrupted (Ctrl-C or SIGTERM), speculating with `drafter` when there
/// is one. `on_ready` gets the bound address. On the signal, the running generation is cancelled
/// at its next pass boundary (its client gets what was generated, `finish_reason`
/// `cancelled`), queued requests are answered 503, and the call returns once the responses in
/// flight are sent, or after [`SHUTDOWN_GRACE`] for connections and again for the engine.
pub fn serve(
    cfg: ServerConfig,
    model: Model,
    fmt: Arc<PromptFormat>,
    drafter: Option<Box<dyn Drafter>>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    if fmt.stop_ids().is_empty() {
        return Err(ServerError::NoStopToken);
    }
    let metrics = Arc::new(Metrics::default());
    metrics.watch_machine(cfg.model_dir.as_deref(), cfg.budget);
    if let Some(c) = &cfg.state_cache {
        metrics.set_state_cache(Arc::clone(c));
    }
    let sched = Scheduler::new(cfg.queue, Arc::clone(&metrics));
    let app = Arc::new(App {
        limits: Limits {
            model_id: cfg.model_id.clone(),
            max_tokens: cfg.max_tokens,
            context_len: cfg.context_len,
        },
        vocab: model.vocab_size(),
        spine: cfg.spine,
        drafter: cfg.drafter.clone(),
        fmt: Arc::clone(&fmt),
        sched: Arc::clone(&sched),
        metrics: Arc::clone(&metrics),
        api_key: cfg.api_key.clone(),
        max_request_bytes: cfg.max_request_bytes,
        body_timeout: cfg.body_timeout,
        started: unix_now(),
        next_id: AtomicU64::new(1),
        grammars: crate::constrain::Grammars::default(),
    });
    let worker = Worker::new(
        model,
        fmt,
        SessionCache::new(cfg.session).with_disk(cfg.state_cache.clone()),
        drafter,
        cfg.engine,
        Arc::clone(&sched),
        metrics,
    );
    let (engine_done_tx, engine_done) = std::sync::mpsc::channel::<()>();
    let engine = worker.spawn(engine_done_tx)?;
    // Two async workers are plenty: handlers only parse, queue and forward events. Prompt
    // rendering and tokenization go to a small blocking pool.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()?;
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let res = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind { addr: addr.clone(), source })?;
        on_ready(listener.local_addr()?);
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let stopping = Arc::clone(&sched);
        let on_signal = async move {
            let name = shutdown_signal().await;
            eprintln!(
                "sluice: {name} received: stopping (the running generation ends at its next \
                 pass; queued requests are answered 503)"
            );
            stopping.shutdown();
            let _ = stop_tx.send(true);
        };
        let listener = deadline::HeaderDeadline::new(listener, cfg.body_timeout);
        let server = axum::serve(listener, router(app)).with_graceful_shutdown(on_signal);
        // Responses in flight end once the engine has cancelled their job; a connection that
        // is still open after the grace period (a client still sending its body) is closed.
        let grace = async {
            let _ = stop_rx.wait_for(|stopped| *stopped).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            r = server.into_future() => r?,
            () = grace => eprintln!(
                "sluice: connections still open {}s after the signal; closing them",
                SHUTDOWN_GRACE.as_secs()
            ),
        }
        Ok::<_, ServerError>(())
    });
    sched.close();
    // The engine ends at its next pass boundary; a pass of a streamed model can take long, so
    // the wait is bounded (exiting mid-pass loses nothing: every job has been answered).
    // Nothing is ever sent: the channel disconnects when the engine thread ends.
    if engine_done.recv_timeout(SHUTDOWN_GRACE) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
        let _ = engine.join();
    } else {
        eprintln!(
            "sluice: the engine is still in a pass {}s after the signal; exiting without it",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    // States queued for the disk are written before the process ends (a restart finds them).
    if let Some(c) = &cfg.state_cache {
        c.flush();
    }
    res
}

/// Resolves on Ctrl-C or SIGTERM, with the signal's name.
async fn shutdown_signal() -> &'static str {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => "SIGINT",
        () = term => "SIGTERM",
    }
}
