//! `sluice probe`: what this machine delivers, measured now — storage read bandwidth at the
//! expert store's block size and queue depth (O_DIRECT, scattered reads over the model's
//! shards or a file), and the ISA tier the kernels run on.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use sluice_checkpoint::Checkpoint;
use sluice_engine::plan::parse_size;
use std::path::PathBuf;

/// Flags of `sluice probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Read the shards of this checkpoint.
    #[arg(long, conflicts_with = "file")]
    model: Option<PathBuf>,
    /// Read this file instead.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Block size of each read (default: one Kimi K3 expert, 17,547,264 bytes rounded to 4 KiB).
    #[arg(long, default_value = "17551360")]
    block: String,
    /// Reads in flight.
    #[arg(long, default_value_t = 16)]
    readers: usize,
    /// Most bytes to read.
    #[arg(long, default_value = "4G")]
    bytes: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(a: &ProbeArgs) -> Result<()> {
    let paths: Vec<PathBuf> = match (&a.model, &a.file) {
        (Some(d), _) => Checkpoint::open(d)
            .with_context(|| format!("opening {}", d.display()))?
            .shard_paths()
            .to_vec(),
        (None, Some(f)) => vec![f.clone()],
        (None, None) => bail!("give --model DIR or --file PATH to read from"),
    };
    let block = usize::try_from(parse_size(&a.block).map_err(anyhow::Error::msg)?)?;
    let max = parse_size(&a.bytes).map_err(anyhow::Error::msg)?;
    let s = sluice_store::probe::storage_read(&paths, block, a.readers, max)
        .context("reading for the storage probe")?;
    let isa = sluice_kernels::isa::isa().name();
    if a.json {
        println!(
            "{}",
            json!({"storage_read_gbps": s.gbps, "storage": s, "isa": isa, "threads": rayon_threads()})
        );
    } else {
        println!(
            "storage read {:.3} GB/s ({} bytes in {:.2}s, {} KiB blocks, {} in flight, {}); kernels ISA {isa}, {} threads",
            s.gbps,
            s.bytes,
            s.secs,
            s.block / 1024,
            s.readers,
            if s.direct { "O_DIRECT" } else { "page cache" },
            rayon_threads()
        );
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
