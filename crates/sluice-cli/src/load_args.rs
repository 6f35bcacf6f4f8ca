//! Flags that decide how a model is placed in memory, shared by `sluice run` and `sluice serve`
//! so both open a model the same way (through `sluice_engine::load::open`) and print the same
//! plan.

use anyhow::{bail, Result};
use clap::Args;
use sluice_engine::load::{ExpertMode, LoadOptions};
use sluice_engine::plan::parse_size;

/// Flags that decide how a model is placed in memory (shared by run, bench and serve).
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Memory budget (e.g. 24G, 6G, 512M). Default: 85% of physical memory or the cgroup limit,
    /// minus 512 MiB.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Where routed experts come from: auto (mapped if everything fits, else streamed),
    /// mapped, or stream.
    #[arg(long, default_value = "auto")]
    pub(crate) experts: String,
    /// Do not prefetch the next layer's experts.
    #[arg(long)]
    pub(crate) no_prefetch: bool,
    /// Reads in flight when streaming experts.
    #[arg(long, default_value_t = 16)]
    pub(crate) readers: usize,
    /// Use the page cache for expert reads instead of O_DIRECT.
    #[arg(long)]
    pub(crate) buffered_io: bool,
    /// Exactly this many expert-cache slots (for tests and benchmarks).
    #[arg(long)]
    pub(crate) cache_slots: Option<usize>,
    /// Context length the sequence state is planned for (default: 4096 for `run`; for `serve`
    /// the checkpoint's max_position_embeddings, at most 32768).
    #[arg(long)]
    pub(crate) context: Option<usize>,
}

impl LoadArgs {
    /// The validated load options.
    pub fn options(&self) -> Result<LoadOptions> {
        let memory =
            self.memory.as_deref().map(parse_size).transpose().map_err(anyhow::Error::msg)?;
        let experts = match self.experts.as_str() {
            "auto" => ExpertMode::Auto,
            "mapped" => ExpertMode::Mapped,
            "stream" => ExpertMode::Stream,
            other => bail!("--experts {other:?}: expected auto, mapped or stream"),
        };
        if self.readers == 0 {
            bail!("--readers must be at least 1");
        }
        Ok(LoadOptions {
            memory,
            experts,
            prefetch: !self.no_prefetch,
            context: self.context.unwrap_or(4096),
            readers: self.readers,
            direct_io: !self.buffered_io,
            slots: self.cache_slots,
            session_memory: 0,
        })
    }
}
