//! `sluice pull`: install a model from a Hugging Face–compatible hub (full or stream mode),
//! resumable and verified. All logic is in `sluice-hub`; this maps flags onto it.

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_hub::{
    Bars, HubClient, ModeRequest, PlanOptions, PullOptions, RoutedTensors, StatvfsFreeSpace,
};
use std::path::PathBuf;

/// Flags of `sluice pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// Repository on the hub, `ORG/NAME`.
    repo: String,
    /// Branch, tag or commit (resolved once to a commit and pinned in the install).
    #[arg(long)]
    revision: Option<String>,
    /// Install location (default: the Hugging Face cache, shared with other tools).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Every file; refuse if it does not fit.
    #[arg(long, conflicts_with = "stream")]
    full: bool,
    /// Everything but the routed experts, which are fetched on first use.
    #[arg(long)]
    stream: bool,
    /// Print the plan and stop.
    #[arg(long)]
    dry_run: bool,
    /// Parallel downloads.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// SHA-256 every reused file, not only downloaded ones.
    #[arg(long)]
    deep: bool,
}

/// Runs the command.
pub fn run(a: &PullArgs) -> Result<()> {
    if a.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let mode = match (a.full, a.stream) {
        (true, _) => ModeRequest::Full,
        (_, true) => ModeRequest::Stream,
        _ => ModeRequest::Auto,
    };
    let client = HubClient::from_env()?;
    let info = client.resolve(&a.repo, a.revision.as_deref().unwrap_or("main"))?;
    // Which tensors are routed experts is the model family's knowledge (from `config.json`);
    // a full install needs no answer, an automatic one falls back to full without it.
    let routed = match mode {
        ModeRequest::Full => RoutedTensors::none(),
        ModeRequest::Stream => sluice_engine::install::routed_tensors_remote(&client, &info)
            .context("finding the routed experts to leave out of a stream install")?,
        ModeRequest::Auto => match sluice_engine::install::routed_tensors_remote(&client, &info) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("note: no stream install possible ({e}); planning a full one");
                RoutedTensors::none()
            }
        },
    };
    if mode == ModeRequest::Stream && routed.is_empty() {
        bail!(
            "{}: its family has no routed experts to stream (or no expert layout yet); \
             use `sluice pull {} --full`",
            a.repo,
            a.repo
        );
    }
    let opts = PlanOptions {
        mode,
        dir: a.dir.clone(),
        workers: a.workers,
        routed,
        ..PlanOptions::default()
    };
    let plan = client.plan(&info, &opts, &StatvfsFreeSpace)?;
    eprintln!("{plan}");
    if a.dry_run {
        return Ok(());
    }
    let report = client.pull(
        &plan,
        &PullOptions { workers: a.workers, deep_verify: a.deep, ..PullOptions::default() },
        &Bars::new(),
    )?;
    println!("{report}");
    Ok(())
}
