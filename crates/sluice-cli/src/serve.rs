//! `sluice serve`: flags parsed into a validated [`ServerConfig`], the model opened through the
//! path `sluice run` uses ([`crate::open::Target`], with the stored conversation states charged
//! to the same budget and shown in the same plan), and the OpenAI-compatible server run until
//! Ctrl-C or SIGTERM, which cancel the running generation at its next pass, answer queued
//! requests 503 and stop within seconds. Everything else lives in the `sluice-server` crate.

use crate::load_args::LoadArgs;
use crate::open::{self, DraftArg, Target};
use crate::state_cache_args::StateCacheArgs;
use crate::values;
use crate::warm_start;
use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_engine::load;
use sluice_engine::session::SessionConfig;
use sluice_engine::{Drafter, ModelDrafter, NgramDrafter};
use sluice_server::worker::EngineSettings;
use sluice_server::ServerConfig;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default context when the checkpoint allows more (the planned sequence state grows with it).
const DEFAULT_CONTEXT: usize = 32_768;

/// Flags of `sluice serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Checkpoint directory; omit to serve the built-in model (mini-K3).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on. Anything but loopback exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, value_parser = values::port, allow_negative_numbers = true, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health (default: the
    /// SLUICE_API_KEY environment variable, which keeps the key out of `ps`).
    #[arg(long)]
    api_key: Option<String>,
    /// Requests that may wait behind the running generation; more get 429.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 4)]
    queue: usize,
    /// Most tokens one request may generate (also the chat default).
    #[arg(long, value_parser = values::positive, allow_negative_numbers = true,
          default_value_t = 4096)]
    max_tokens: usize,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, value_parser = values::positive, allow_negative_numbers = true,
          default_value_t = 4 << 20)]
    max_request_bytes: usize,
    /// Seconds a client may take to send its request body; slower ones get 408.
    #[arg(long, value_parser = values::seconds, allow_negative_numbers = true,
          default_value_t = 30)]
    body_timeout_s: u64,
    /// Speculative drafts: `auto` (the measured default: none today), `none`, `ngram` (prompt
    /// lookup), `builtin` (the built-in mini-draft), or the directory of a Qwen3 draft model
    /// (charged to --memory). Output is identical either way.
    #[arg(long, value_parser = open::draft_arg, default_value = "auto")]
    draft: DraftArg,
    /// Most draft tokens verified per pass.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 8)]
    draft_max: usize,
    /// The model id clients send (default: the checkpoint directory's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Snapshot the sequence state every N prompt tokens for reuse by later requests that share
    /// a prefix (0: only at the end of each prompt and generation).
    #[arg(long, value_parser = values::count, allow_negative_numbers = true,
          default_value_t = 512)]
    checkpoint_every: usize,
    /// Memory for stored conversation state (e.g. 1G, 512M; 0 disables reuse), charged to
    /// the --memory budget.
    #[arg(long, value_parser = values::size_or_zero, allow_hyphen_values = true,
          default_value = "1G")]
    session_memory: u64,
    /// Most conversations whose state is kept.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true,
          default_value_t = 16)]
    max_sessions: usize,
    /// Print one statistics line per request on stderr (reuse, prefill, snapshots, experts).
    #[arg(long)]
    stats: bool,
    /// How the model is placed in memory; `--context` is also the most prompt + generated tokens
    /// of one request.
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    state_cache: StateCacheArgs,
}

/// Runs the command.
pub fn run(a: &ServeArgs) -> Result<()> {
    if a.model_name.as_deref() == Some("") {
        bail!("--model-name must not be empty");
    }
    let mut target = Target::find(a.model.as_deref(), a.load.spine(), "serving")?;
    let context_len = a
        .load
        .context
        .unwrap_or_else(|| target.max_context.map_or(DEFAULT_CONTEXT, |c| c.min(DEFAULT_CONTEXT)));
    target.check_context(context_len)?;
    if context_len < 2 {
        bail!("--context must be at least 2 (one prompt token and one generated)");
    }
    // The checkpoint's tokenizer and chat format: prompts are rendered and replies parsed
    // through it, for every family.
    target.format("the server needs them to read prompts")?;
    let fmt = Arc::new(target.fmt.take().context("the checkpoint's tokenizer")?);
    let mut opts = a.load.options(context_len);
    opts.session_memory = a.session_memory;
    // The serve rule (`Plan::compute`): a pass ends at the checkpoint past the last state it
    // can capture, so the chunk is planned for no more rows than that; a server that keeps no
    // conversation states takes no checkpoints, and its passes are planned as a run's.
    opts.serving = true;
    opts.checkpoint_every = if a.session_memory > 0 { a.checkpoint_every } else { 0 };
    opts.state_cache = a.state_cache.enabled();
    let draft = target.resolve_draft(&a.draft)?;
    if matches!(draft, DraftArg::Model(_)) {
        target.tokenizer("--draft DIR needs them to re-encode draft text")?;
    }
    let opened = target.load(opts, &draft)?;
    let spine = opened.spine;
    let state_cache = a.state_cache.open(&target, &opened.loaded.model, spine)?;
    // Passes take no more rows than the plan charged working memory for.
    let prefill_chunk =
        opened.loaded.plan.as_ref().map_or(0, |p| usize::try_from(p.chunk).unwrap_or(usize::MAX));
    // The budget charges (spine, state, conversation states) and the expert store live as long
    // as the server.
    let plan_budget = opened.loaded.plan.as_ref().map(|p| p.budget);
    // The plan may give the conversation states more than --session-memory (the serve rule).
    let session_bytes = opened.loaded.plan.as_ref().map_or(a.session_memory, |p| p.sessions);
    let warm = warm_start::begin(
        &target.read_dir,
        opened.loaded.streaming.as_ref(),
        !a.load.no_warm_start,
    )
    .map(Arc::new);
    if let Some(w) = &warm {
        // Saved every few minutes as well as at exit, so a crash or a kill loses little.
        let w = Arc::clone(w);
        let _ = std::thread::Builder::new().name("sluice-hotset".into()).spawn(move || loop {
            std::thread::sleep(HOT_SET_PERIOD);
            w.save();
        });
    }
    let load::Loaded { model, budget: _budget, charges: _charges, streaming: _streaming, .. } =
        opened.loaded;
    let drafter: Option<Box<dyn Drafter>> =
        match (opened.draft_model.zip(target.tok.clone()), &draft) {
            (Some((d, tok)), _) => Some(Box::new(ModelDrafter::new(d, tok, context_len))),
            (None, DraftArg::Ngram) => Some(Box::new(NgramDrafter::default())),
            (None, _) => None,
        };
    let drafter_name = drafter.as_ref().map_or_else(|| "none".to_owned(), |d| d.name());
    let model_id = match &a.model_name {
        Some(n) => n.clone(),
        None if target.demo => sluice_engine::builtin::BUILTIN_NAME.into(),
        None => target
            .dir
            .canonicalize()
            .unwrap_or_else(|_| target.dir.clone())
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
        body_timeout: Duration::from_secs(a.body_timeout_s),
        model_id: model_id.clone(),
        engine: EngineSettings { draft_max: a.draft_max, stats: a.stats, prefill_chunk },
        spine,
        drafter: drafter_name,
        session: SessionConfig {
            checkpoint_every: a.checkpoint_every,
            max_bytes: usize::try_from(session_bytes).unwrap_or(usize::MAX),
            max_entries: if a.session_memory == 0 { 0 } else { a.max_sessions },
        },
        model_dir: Some(target.read_dir.clone()),
        budget: plan_budget,
        state_cache,
    };
    if !is_loopback(&a.host) {
        eprintln!("sluice: listening on {} exposes the server beyond this machine", a.host);
    }
    sluice_server::serve(cfg, model, fmt, drafter, |addr| {
        eprintln!(
            "sluice: serving {model_id} (context {context_len}, queue {}) on http://{addr}",
            a.queue
        );
    })?;
    if let Some(w) = &warm {
        w.save();
    }
    Ok(())
}

/// How often a running server saves its hot set.
const HOT_SET_PERIOD: Duration = Duration::from_secs(300);

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
