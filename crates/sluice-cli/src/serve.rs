//! `sluice serve`: flags parsed into a validated [`ServerConfig`], the model and tokenizer loaded,
//! and the OpenAI-compatible server run until Ctrl-C or SIGTERM. Everything else lives in the
//! `sluice-server` crate.

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_checkpoint::Checkpoint;
use sluice_engine::demo::{cache_dir, ensure_demo_model};
use sluice_engine::plan::parse_size;
use sluice_engine::session::SessionConfig;
use sluice_server::worker::EngineSettings;
use sluice_server::ServerConfig;
use sluice_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default context limit when the checkpoint allows more (the sequence state grows with it).
const DEFAULT_CONTEXT: usize = 32_768;

/// Flags of `sluice serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Checkpoint directory; omit to serve the built-in random-weight demo model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on. Anything but loopback exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health (default: the
    /// SLUICE_API_KEY environment variable, which keeps the key out of `ps`).
    #[arg(long)]
    api_key: Option<String>,
    /// Requests that may wait behind the running generation; more get 429.
    #[arg(long, default_value_t = 4)]
    queue: usize,
    /// Most tokens one request may generate (also the chat default).
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Most prompt + generated tokens (default: the checkpoint's max_position_embeddings, at
    /// most 32768).
    #[arg(long)]
    max_context: Option<usize>,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_request_bytes: usize,
    /// Seconds a client may take to send its request body; slower ones get 408.
    #[arg(long, default_value_t = 30)]
    body_timeout_s: u64,
    /// Speculative drafts: `none` or `ngram` (prompt lookup). Output is identical either way.
    #[arg(long, default_value = "none")]
    draft: String,
    /// Most draft tokens verified per pass.
    #[arg(long, default_value_t = 8)]
    draft_max: usize,
    /// The model id clients send (default: the checkpoint directory's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Snapshot the sequence state every N prompt tokens for reuse by later requests that share
    /// a prefix (0: only at the end of each prompt and generation).
    #[arg(long, default_value_t = 512)]
    checkpoint_every: usize,
    /// Memory for stored conversation state (e.g. 1G, 512M; 0 disables reuse).
    #[arg(long, default_value = "1G")]
    session_memory: String,
    /// Most conversations whose state is kept.
    #[arg(long, default_value_t = 16)]
    max_sessions: usize,
}

/// Runs the command.
pub fn run(a: &ServeArgs) -> Result<()> {
    let (dir, demo) = match &a.model {
        Some(d) => (d.clone(), false),
        None => (ensure_demo_model(&cache_dir()).context("writing the built-in demo model")?, true),
    };
    if demo {
        eprintln!(
            "sluice: no --model given; serving the built-in demo model at {} \
             (a tiny Kimi K3 layout with RANDOM weights: its text is meaningless by design)",
            dir.display()
        );
    }
    let ckpt =
        Arc::new(Checkpoint::open(&dir).with_context(|| format!("opening {}", dir.display()))?);
    let config_context = ckpt
        .config()
        .text_config()
        .get("max_position_embeddings")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    let model = sluice_models::load(ckpt).with_context(|| format!("loading {}", dir.display()))?;
    let tok = Tokenizer::from_dir(&dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    let context_len = match (a.max_context, config_context) {
        (Some(n), Some(c)) if n > c => {
            bail!("--max-context {n} is above the checkpoint's max_position_embeddings {c}")
        }
        (Some(n), _) => n,
        (None, Some(c)) => c.min(DEFAULT_CONTEXT),
        (None, None) => DEFAULT_CONTEXT,
    };
    if context_len < 2 || a.max_tokens == 0 {
        bail!("--max-context must be at least 2 and --max-tokens at least 1");
    }
    let ngram = match a.draft.as_str() {
        "none" => false,
        "ngram" => true,
        other => bail!("--draft {other:?}: expected none or ngram"),
    };
    let session_bytes = parse_size_or_zero(&a.session_memory)?;
    let model_id = match &a.model_name {
        Some(n) if n.is_empty() => bail!("--model-name must not be empty"),
        Some(n) => n.clone(),
        None if demo => "sluice-demo".into(),
        None => dir
            .canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned()),
    };
    let cfg = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        api_key: a
            .api_key
            .clone()
            .or_else(|| std::env::var("SLUICE_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        queue: a.queue,
        max_tokens: a.max_tokens,
        context_len,
        max_request_bytes: a.max_request_bytes,
        body_timeout: Duration::from_secs(a.body_timeout_s.max(1)),
        model_id: model_id.clone(),
        engine: EngineSettings { ngram, draft_max: a.draft_max },
        session: SessionConfig {
            checkpoint_every: a.checkpoint_every,
            max_bytes: session_bytes,
            max_entries: if session_bytes == 0 { 0 } else { a.max_sessions },
        },
    };
    if !is_loopback(&a.host) {
        eprintln!("sluice: listening on {} exposes the server beyond this machine", a.host);
    }
    sluice_server::serve(cfg, model, tok, |addr| {
        eprintln!(
            "sluice: serving {model_id} (context {context_len}, queue {}) on http://{addr}",
            a.queue
        );
    })?;
    Ok(())
}

/// `0` or a size such as `1G`.
fn parse_size_or_zero(s: &str) -> Result<usize> {
    if s.trim() == "0" {
        return Ok(0);
    }
    let bytes = parse_size(s).map_err(anyhow::Error::msg).context("--session-memory")?;
    Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
