//! `sluice convert --spine int8 SRC [--out DST] [--embeddings]`: write the row-int8 spine of a
//! checkpoint (docs/INT8.md) with a progress bar, and `sluice accuracy`: measure it against
//! the published checkpoint.

use crate::inspect::human;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_checkpoint::convert::{convert_spine_int8, default_output, ConvertOptions};
use sluice_checkpoint::Checkpoint;
use sluice_engine::accuracy::{compare, AccuracyOptions};
use sluice_engine::spine::{self, Spine};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Flags of `sluice convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Target spine format; `int8` (row-wise absmax/127 with f16 scales) is the one there is.
    #[arg(long)]
    spine: String,
    /// Source checkpoint directory (Kimi K3 or Qwen3, as published).
    src: PathBuf,
    /// Output directory. Default: the sibling `SRC-int8`. An unfinished conversion there is
    /// resumed.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also quantize the token embedding table (kept as published by default).
    #[arg(long)]
    embeddings: bool,
}

fn bar(template: &str) -> Result<ProgressBar> {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(template).context("progress template")?);
    Ok(bar)
}

/// Runs `sluice convert`.
pub fn run(a: &ConvertArgs) -> Result<()> {
    if a.spine != "int8" {
        bail!("--spine {:?}: the only conversion is --spine int8", a.spine);
    }
    // A source `sluice run` would refuse (a missing tensor, a wrong dtype or shape, a config
    // contradicting its tensors) would only give an output that fails the same way, after
    // minutes or hours of writing: refuse it first, with the cause.
    let src = Checkpoint::open(&a.src)
        .with_context(|| format!("opening the source checkpoint {}", a.src.display()))?;
    sluice_models::check(&src).with_context(|| {
        format!("{} would not load for `sluice run`; refusing to convert it", a.src.display())
    })?;
    drop(src);
    let dst = a.out.clone().unwrap_or_else(|| default_output(&a.src));
    let opts = ConvertOptions { embeddings: a.embeddings };
    let bar = bar("{spinner} {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec} eta {eta}")?;
    let t = std::time::Instant::now();
    let report = convert_spine_int8(&a.src, &dst, &opts, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report =
        report.with_context(|| format!("converting {} into {}", a.src.display(), dst.display()))?;
    #[allow(clippy::cast_precision_loss)]
    let ratio = report.output_bytes as f64 / report.source_bytes.max(1) as f64;
    println!(
        "converted {} → {} in {:.1}s",
        a.src.display(),
        dst.display(),
        t.elapsed().as_secs_f64()
    );
    println!(
        "  tensors  {} row-int8 (+ one f16 scale each), {} kept as published{}",
        report.tensors_quantized,
        report.tensors_kept,
        if a.embeddings { " (embeddings quantized)" } else { " (embeddings kept)" }
    );
    println!(
        "  files    {} written, {} reused from an earlier run",
        report.files_written, report.files_reused
    );
    println!(
        "  bytes    {} → {} ({:.1}% of the source)",
        human(report.source_bytes),
        human(report.output_bytes),
        100.0 * ratio
    );
    println!("  manifest {}", report.manifest.display());
    println!(
        "the int8 spine is LOSSY (docs/INT8.md); run it with `sluice run --model {} --spine int8`",
        a.src.display()
    );
    Ok(())
}

/// Flags of `sluice accuracy`.
#[derive(Debug, Args)]
pub struct AccuracyArgs {
    /// The published checkpoint (the reference).
    dir: PathBuf,
    /// Its int8 conversion. Default: DIR itself if converted, else its sibling `DIR-int8`.
    #[arg(long)]
    int8: Option<PathBuf>,
    /// Prompts (seeded random token ids).
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Tokens per prompt.
    #[arg(long, default_value_t = 16)]
    prompt_len: usize,
    /// Greedy steps compared per prompt.
    #[arg(long, default_value_t = 32)]
    max_new: usize,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object (with per-prompt detail) instead of text.
    #[arg(long)]
    json: bool,
}

fn open(dir: &Path, want: Spine) -> Result<sluice_models::Model> {
    let ckpt = Checkpoint::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    spine::check(&ckpt, want)?;
    sluice_models::load(Arc::new(ckpt)).with_context(|| format!("loading {}", dir.display()))
}

/// Runs `sluice accuracy`.
pub fn accuracy(a: &AccuracyArgs) -> Result<()> {
    if a.prompts == 0 || a.prompt_len == 0 || a.max_new == 0 {
        bail!("--prompts, --prompt-len and --max-new must be at least 1");
    }
    let int8_dir = match &a.int8 {
        Some(d) => spine::resolve(d, Spine::Int8)?,
        None => spine::resolve(&a.dir, Spine::Int8)?,
    };
    let reference = open(&spine::resolve(&a.dir, Spine::Bf16)?, Spine::Bf16)?;
    let candidate = open(&int8_dir, Spine::Int8)?;
    let opts = AccuracyOptions {
        prompts: a.prompts,
        prompt_len: a.prompt_len,
        max_new: a.max_new,
        seed: a.seed,
    };
    let bar = bar("{spinner} prompt {pos}/{len} {wide_bar} eta {eta}")?;
    let t = std::time::Instant::now();
    let res = compare(&reference, &candidate, &opts, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let acc = res.context("comparing the int8 spine with the published checkpoint")?;
    if a.json {
        let v = serde_json::json!({
            "reference": a.dir.display().to_string(),
            "int8": int8_dir.display().to_string(),
            "spine": "int8",
            "prompt_len": a.prompt_len,
            "max_new": a.max_new,
            "seed": a.seed,
            "seconds": t.elapsed().as_secs_f64(),
            "accuracy": serde_json::to_value(&acc)?,
        });
        println!("{v}");
        return Ok(());
    }
    println!("int8 spine {} vs published {}", int8_dir.display(), a.dir.display());
    println!(
        "  {} prompts × {} greedy steps (prompt length {}, seed {}) in {:.1}s",
        acc.prompts,
        a.max_new,
        a.prompt_len,
        a.seed,
        t.elapsed().as_secs_f64()
    );
    println!(
        "  top-1 agreement   {:.4} ({} of {} positions)",
        acc.top1_agreement, acc.top1_agree, acc.positions
    );
    println!("  KL(bf16 ‖ int8)   mean {:.3e}, max {:.3e} nats", acc.kl_mean, acc.kl_max);
    println!("  max |logit diff|  {:.4e}", acc.max_abs_logit_diff);
    if acc.routes > 0 {
        println!(
            "  same experts      {:.4} of {} (position, MoE layer) routes",
            acc.route_agreement, acc.routes
        );
    }
    println!(
        "  greedy identical  {} of {} prompts; first divergence at steps {:?}",
        acc.greedy_identical,
        acc.prompts,
        acc.per_prompt.iter().filter_map(|p| p.first_divergence).collect::<Vec<_>>()
    );
    Ok(())
}
