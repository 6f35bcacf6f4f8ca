//! Flags that decide how a model is placed in memory, shared by `sluice run` and `sluice serve`
//! so both open a model the same way (through `sluice_engine::load::open`) and print the same
//! plan.

use anyhow::{bail, Result};
use clap::Args;
use sluice_engine::load::{ExpertMode, LoadOptions};
use sluice_engine::plan::{parse_size, SpineMode};
use sluice_engine::Spine;

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
    /// Read next-layer guesses only while their measured precision is at least this (0: always).
    #[arg(long, default_value_t = sluice_store::streaming::DEFAULT_MIN_PRECISION)]
    pub(crate) prefetch_min_precision: f64,
    /// Reads in flight when streaming experts.
    #[arg(long, default_value_t = 16)]
    pub(crate) readers: usize,
    /// Expert read backend: auto (io_uring where the kernel allows it, else the pread thread
    /// pool), uring, or pread.
    #[arg(long, default_value = "auto")]
    pub(crate) io: String,
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
    /// Spine precision: bf16 (as published) or int8 (the lossy `sluice convert` output: the
    /// directory itself if converted, else its sibling DIR-int8).
    #[arg(long, default_value = "bf16")]
    pub(crate) spine: String,
    /// Spine placement: auto (largest resident prefix that fits, the rest streamed), mapped,
    /// resident, stream, or a number of resident layers.
    #[arg(long, default_value = "auto")]
    pub(crate) spine_placement: String,
    /// Stream installs: most disk space for routed experts fetched from the hub (e.g. 200G).
    /// Default: what is cached plus the volume's free space less 2% + 1 GiB.
    #[arg(long)]
    pub(crate) disk_cache: Option<String>,
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
        let Some(spine) = Spine::parse(&self.spine) else {
            bail!("--spine {:?}: expected bf16 or int8", self.spine);
        };
        let disk_cache = self
            .disk_cache
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--disk-cache: {e}"))?;
        let spine_placement = match self.spine_placement.as_str() {
            "auto" => SpineMode::Auto,
            "mapped" => SpineMode::Mapped,
            "resident" => SpineMode::Layers(usize::MAX),
            "stream" => SpineMode::Layers(0),
            n => SpineMode::Layers(n.parse().map_err(|_| {
                anyhow::anyhow!(
                    "--spine-placement {n:?}: expected auto, mapped, resident, stream or a \
                     layer count"
                )
            })?),
        };
        let Some(io_backend) = sluice_store::IoBackend::parse(&self.io) else {
            bail!("--io {:?}: expected auto, uring or pread", self.io);
        };
        if self.readers == 0 {
            bail!("--readers must be at least 1");
        }
        Ok(LoadOptions {
            memory,
            experts,
            prefetch: !self.no_prefetch,
            prefetch_min_precision: self.prefetch_min_precision,
            context: self.context.unwrap_or(4096),
            readers: self.readers,
            direct_io: !self.buffered_io,
            io_backend,
            slots: self.cache_slots,
            session_memory: 0,
            spine,
            spine_placement,
            disk_cache,
            draft_bytes: 0,
            prefill_chunk: 0,
        })
    }
}
