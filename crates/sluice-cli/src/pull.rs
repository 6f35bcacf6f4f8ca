//! `sluice pull`: install a model from a Hugging Face–compatible hub (full or stream mode),
//! resumable and verified. All logic is in `sluice-hub`; this maps flags onto it.

use anyhow::{bail, Result};
use clap::Args;
use sluice_hub::{Bars, HubClient, ModeRequest, PlanOptions, PullOptions, StatvfsFreeSpace};
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
    let opts =
        PlanOptions { mode, dir: a.dir.clone(), workers: a.workers, ..PlanOptions::default() };
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
