//! Flags that decide how a model is placed in memory, shared by `sluice run` and `sluice serve`
//! so both open a model the same way (through [`crate::open`]) and print the same plan. Every
//! value is typed by clap (`ValueEnum`s, [`crate::values`] parsers), so a bad one is refused
//! before anything is read.

use crate::values;
use clap::{Args, ValueEnum};
use sluice_engine::load::{ExpertMode, LoadOptions};
use sluice_engine::plan::SpineMode;
use sluice_engine::Spine;
use sluice_store::IoBackend;

/// `--experts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExpertsArg {
    /// Mapped if everything fits the budget, else streamed.
    Auto,
    /// Mapped in place from the shards.
    Mapped,
    /// Read from the shards into a slot cache sized by the budget.
    Stream,
}

/// `--io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoArg {
    /// io_uring where the kernel allows it, else the pread thread pool.
    Auto,
    /// io_uring (an error where the kernel refuses it).
    #[value(alias = "io_uring")]
    Uring,
    /// The pread thread pool.
    Pread,
}

/// `--spine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SpineArg {
    /// As published (exact).
    Bf16,
    /// The lossy row-int8 conversion (`sluice convert --spine int8`).
    Int8,
}

/// Flags that decide how a model is placed in memory (shared by run and serve).
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Memory budget (e.g. 24G, 6G, 512M). Default: 85% of physical memory or the cgroup limit,
    /// minus 512 MiB.
    #[arg(long, value_parser = values::size, allow_hyphen_values = true)]
    pub(crate) memory: Option<u64>,
    /// Where routed experts come from.
    #[arg(long, value_enum, default_value_t = ExpertsArg::Auto)]
    pub(crate) experts: ExpertsArg,
    /// Do not prefetch the next layer's experts.
    #[arg(long)]
    pub(crate) no_prefetch: bool,
    /// Read next-layer guesses only while their measured precision is at least this (0 to 1;
    /// 0: always).
    #[arg(long, value_parser = values::fraction, allow_negative_numbers = true,
          default_value_t = sluice_store::streaming::DEFAULT_MIN_PRECISION)]
    pub(crate) prefetch_min_precision: f64,
    /// Reads in flight when streaming experts (at least 1).
    #[arg(long, value_parser = values::positive, allow_negative_numbers = true,
          default_value_t = 16)]
    pub(crate) readers: usize,
    /// Expert read backend.
    #[arg(long, value_enum, default_value_t = IoArg::Auto)]
    pub(crate) io: IoArg,
    /// Use the page cache for expert reads instead of O_DIRECT.
    #[arg(long)]
    pub(crate) buffered_io: bool,
    /// Neither read the saved hot set into the expert cache at start nor save it at exit
    /// (warm starts; see docs/CLI.md).
    #[arg(long)]
    pub(crate) no_warm_start: bool,
    /// Exactly this many expert-cache slots (for tests and benchmarks).
    #[arg(long, value_parser = values::positive, allow_negative_numbers = true)]
    pub(crate) cache_slots: Option<usize>,
    /// Most prompt + generated tokens, which the sequence state is planned for (default: for
    /// `run` the prompt plus --max-new, at least 4096; for `serve` the checkpoint's
    /// max_position_embeddings, at most 32768; never above max_position_embeddings).
    #[arg(long, value_parser = values::positive, allow_negative_numbers = true)]
    pub(crate) context: Option<usize>,
    /// Spine precision: bf16 (as published) or int8 (the lossy `sluice convert` output: the
    /// directory itself if converted, else its sibling DIR-int8).
    #[arg(long, value_enum, default_value_t = SpineArg::Bf16)]
    pub(crate) spine: SpineArg,
    /// Spine placement: auto (largest resident prefix that fits, the rest streamed), mapped,
    /// resident, stream, or a number of resident layers.
    #[arg(long, value_parser = spine_placement, allow_negative_numbers = true,
          default_value = "auto")]
    pub(crate) spine_placement: SpineMode,
    /// Stream installs: most disk space for routed experts fetched from the hub (e.g. 200G).
    /// Default: what is cached plus the volume's free space less 2% + 1 GiB.
    #[arg(long, value_parser = values::size, allow_hyphen_values = true)]
    pub(crate) disk_cache: Option<u64>,
}

/// Parses `--spine-placement`.
fn spine_placement(s: &str) -> Result<SpineMode, String> {
    Ok(match s {
        "auto" => SpineMode::Auto,
        "mapped" => SpineMode::Mapped,
        "resident" => SpineMode::Layers(usize::MAX),
        "stream" => SpineMode::Layers(0),
        n => SpineMode::Layers(values::count(n).map_err(|e| {
            format!("{e}: expected auto, mapped, resident, stream or a layer count")
        })?),
    })
}

impl LoadArgs {
    /// The load options for a sequence state of `context` tokens. A `--memory` above what this
    /// machine has is allowed (the budget is the user's to give) but warned about here, before
    /// anything is loaded.
    pub fn options(&self, context: usize) -> LoadOptions {
        if let (Some(m), Some(have)) = (self.memory, sluice_engine::plan::available_memory()) {
            if m > have {
                eprintln!(
                    "sluice: warning: --memory {} is more than this machine has ({}, physical \
                     memory or the cgroup limit); the plan will count on memory that is not \
                     there, and the system may kill sluice when it runs out",
                    human(m),
                    human(have)
                );
            }
        }
        LoadOptions {
            memory: self.memory,
            experts: match self.experts {
                ExpertsArg::Auto => ExpertMode::Auto,
                ExpertsArg::Mapped => ExpertMode::Mapped,
                ExpertsArg::Stream => ExpertMode::Stream,
            },
            prefetch: !self.no_prefetch,
            prefetch_min_precision: self.prefetch_min_precision,
            context,
            readers: self.readers,
            direct_io: !self.buffered_io,
            io_backend: match self.io {
                IoArg::Auto => IoBackend::Auto,
                IoArg::Uring => IoBackend::Uring,
                IoArg::Pread => IoBackend::Pread,
            },
            slots: self.cache_slots,
            session_memory: 0,
            state_cache: false,
            spine: self.spine(),
            spine_placement: self.spine_placement,
            disk_cache: self.disk_cache,
            draft_bytes: 0,
            prefill_chunk: 0,
            largest_pass: 0,
            serving: false,
            checkpoint_every: 0,
        }
    }

    /// The spine precision asked for.
    pub fn spine(&self) -> Spine {
        match self.spine {
            SpineArg::Bf16 => Spine::Bf16,
            SpineArg::Int8 => Spine::Int8,
        }
    }
}

/// `bytes` in GiB (TiB from 1 TiB), labelled.
fn human(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    if g >= 1024.0 {
        format!("{:.2} TiB", g / 1024.0)
    } else {
        format!("{g:.2} GiB")
    }
}
