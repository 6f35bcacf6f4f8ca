//! `sluice serve`: flags parsed into a validated [`ServerConfig`], the model opened exactly as
//! `sluice run` opens it (the shared [`LoadArgs`] through `sluice_engine::load::open`, with the
//! stored conversation states charged to the same budget and shown in the same plan), and the
//! OpenAI-compatible server run until Ctrl-C or SIGTERM. Everything else lives in the
//! `sluice-server` crate.

use crate::load_args::LoadArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_checkpoint::CheckpointConfig;
use sluice_engine::demo::{cache_dir, ensure_demo_model};
use sluice_engine::load;
use sluice_engine::plan::parse_size;
use sluice_engine::session::SessionConfig;
use sluice_engine::{DraftModel, Drafter, ModelDrafter, NgramDrafter};
use sluice_server::worker::EngineSettings;
use sluice_server::ServerConfig;
use sluice_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Default context when the checkpoint allows more (the planned sequence state grows with it).
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
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_request_bytes: usize,
    /// Seconds a client may take to send its request body; slower ones get 408.
    #[arg(long, default_value_t = 30)]
    body_timeout_s: u64,
    /// Speculative drafts: `none`, `ngram` (prompt lookup), or the directory of a Qwen3 draft
    /// model (charged to --memory). Output is identical either way.
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
    /// Memory for stored conversation state (e.g. 1G, 512M; 0 disables reuse), charged to
    /// the --memory budget.
    #[arg(long, default_value = "1G")]
    session_memory: String,
    /// Most conversations whose state is kept.
    #[arg(long, default_value_t = 16)]
    max_sessions: usize,
    /// Print one statistics line per request on stderr (reuse, prefill, snapshots, experts).
    #[arg(long)]
    stats: bool,
    /// How the model is placed in memory; `--context` is also the most prompt + generated tokens
    /// of one request.
    #[command(flatten)]
    load: LoadArgs,
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
    let config_context = CheckpointConfig::load(&dir)
        .with_context(|| format!("opening {}", dir.display()))?
        .text_config()
        .get("max_position_embeddings")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    let context_len = a
        .load
        .context
        .unwrap_or_else(|| config_context.map_or(DEFAULT_CONTEXT, |c| c.min(DEFAULT_CONTEXT)));
    if let Some(c) = config_context.filter(|&c| context_len > c) {
        bail!("--context {context_len} is above the checkpoint's max_position_embeddings {c}");
    }
    if context_len < 2 || a.max_tokens == 0 {
        bail!("--context must be at least 2 and --max-tokens at least 1");
    }
    let session_bytes = parse_size_or_zero(&a.session_memory)?;
    let draft_model = match a.draft.as_str() {
        "none" | "ngram" => None,
        path => Some(DraftModel::open(Path::new(path))?),
    };
    let mut opts = a.load.options()?;
    opts.context = context_len;
    opts.session_memory = session_bytes;
    // The draft model's weights, KV cache for the whole context and scratch come out of the
    // same budget, before the target is planned.
    opts.draft_bytes = draft_model.as_ref().map_or(0, |d| d.memory_needs(context_len));
    // The directory the spine choice reads (the int8 conversion for --spine int8).
    // The model id stays the directory given (`K3` whether its bf16 or its int8 spine serves).
    let read_dir = sluice_engine::spine::resolve(&dir, opts.spine)?;
    let loaded =
        load::open(&read_dir, &opts).with_context(|| format!("loading {}", read_dir.display()))?;
    let spine = opts.spine;
    let reads = loaded.io_backend().map(|b| format!(", read with {b}")).unwrap_or_default();
    match &loaded.plan {
        Some(p) => {
            eprintln!("sluice: spine {}; {p}; experts {}{reads}", spine.label(), loaded.mode)
        }
        None => eprintln!("sluice: spine {}; experts {}{reads}", spine.label(), loaded.mode),
    }
    // Passes take no more rows than the plan charged working memory for.
    let prefill_chunk =
        loaded.plan.as_ref().map_or(0, |p| usize::try_from(p.chunk).unwrap_or(usize::MAX));
    // The budget charges (spine, state, conversation states) and the expert store live as long
    // as the server.
    let load::Loaded { model, budget: _budget, charges: _charges, streaming: _streaming, .. } =
        loaded;
    let tok = Arc::new(
        Tokenizer::from_dir(&read_dir)
            .with_context(|| format!("loading the tokenizer of {}", read_dir.display()))?,
    );
    let drafter: Option<Box<dyn Drafter>> = match draft_model {
        Some(d) => Some(Box::new(ModelDrafter::new(d, tok.clone(), context_len))),
        None if a.draft == "ngram" => Some(Box::new(NgramDrafter::default())),
        None => None,
    };
    let drafter_name = drafter.as_ref().map_or_else(|| "none".to_owned(), |d| d.name());
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
        engine: EngineSettings { draft_max: a.draft_max, stats: a.stats, prefill_chunk },
        spine,
        drafter: drafter_name,
        session: SessionConfig {
            checkpoint_every: a.checkpoint_every,
            max_bytes: usize::try_from(session_bytes).unwrap_or(usize::MAX),
            max_entries: if session_bytes == 0 { 0 } else { a.max_sessions },
        },
    };
    if !is_loopback(&a.host) {
        eprintln!("sluice: listening on {} exposes the server beyond this machine", a.host);
    }
    sluice_server::serve(cfg, model, tok, drafter, |addr| {
        eprintln!(
            "sluice: serving {model_id} (context {context_len}, queue {}) on http://{addr}",
            a.queue
        );
    })?;
    Ok(())
}

/// `0` or a size such as `1G`.
fn parse_size_or_zero(s: &str) -> Result<u64> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_size(s).map_err(anyhow::Error::msg).context("--session-memory")
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
