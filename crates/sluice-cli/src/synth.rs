//! `sluice synth`: write a synthetic checkpoint of a real architecture in its published layout,
//! deterministic from a seed, with a progress bar. It says how much it will write before it
//! starts (the default k3-slice is gigabytes), marks its output directory as its own first, and
//! rewrites a directory so marked when run again, so an interrupted run is finished by running
//! the same command; the temporary files an interrupted run left there are removed.

use crate::inspect::human;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_models::deepseek_v3::synth::Slice as DsSlice;
use sluice_models::kimi_k3::synth::{
    checkpoint_bytes, k3_slice_text_config, release_config, write_checkpoint,
};
use std::path::{Path, PathBuf};

/// Written into the output directory before anything else: the directory is synth's own, and a
/// later run may empty and rewrite it.
const MARKER: &str = ".sluice-synth";

/// Which configuration to write.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Preset {
    /// Kimi K3's real per-layer dimensions with fewer layers, experts and vocabulary rows.
    K3Slice,
    /// The random-weight demo model's toy configuration (tests use it).
    Demo,
    /// The demo model's layout with --experts routed experts of latent 128 × 1024 (≈ 208 KB
    /// each) in --layers MoE layers: a small model whose size is almost all routed experts,
    /// for streaming tests that must run in seconds.
    ManyExperts,
    /// Qwen3-235B-A22B's real per-layer dimensions (hidden 4096, 128 experts of width 1536,
    /// top-8, 64 / 4 heads of 128) with --layers MoE layers and --ranks vocabulary rows; bf16
    /// per-expert tensors as published; no tokenizer (run it with --prompt-ids).
    Qwen3MoeSlice,
    /// Qwen3-30B-A3B's real per-layer dimensions (hidden 2048, 128 experts of width 768, top-8,
    /// 32 / 4 heads of 128) with --layers MoE layers and --ranks vocabulary rows (48 layers are
    /// the published model but for its vocabulary rows); bf16 per-expert tensors as published;
    /// no tokenizer (run it with --prompt-ids).
    #[value(name = "qwen3-30b-slice")]
    Qwen3_30bSlice,
    /// gpt-oss-120b's real per-layer dimensions (hidden 2880, 128 MXFP4 experts of width 2880,
    /// top-4, 64 / 8 heads of 64) with --layers layers, --experts experts (24 layers of 32 are
    /// gpt-oss-20b) and --ranks vocabulary rows; stacked
    /// `*_blocks` / `*_scales` experts as published; no tokenizer (run it with --prompt-ids).
    GptOssSlice,
    /// DeepSeek V3 / R1's real per-layer dimensions (hidden 7168, MLA with 128 heads, q LoRA
    /// 1536, kv LoRA 512; 256 FP8 experts of width 2048, top-8, 8 groups of which 4 are kept)
    /// with one dense and --layers MoE layers, --experts experts (default 256) and --ranks
    /// tokenizer ranks (+ 256 specials); FP8 with 128×128 block scales as published.
    DeepseekV3Slice,
    /// Kimi K2 Thinking's real per-layer dimensions (DeepSeek V3's widths, 64 heads, 384
    /// experts in one group) with one dense and --layers MoE layers, --experts experts
    /// (default 384) and --ranks tokenizer ranks (+ 256 specials); INT4 pack-quantized experts
    /// (group 32) and a bf16 spine as published.
    KimiK2Slice,
}

/// Flags of `sluice synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output directory: new, empty, or an earlier `sluice synth` output (finished or
    /// interrupted), which is rewritten.
    #[arg(long)]
    out: PathBuf,
    /// Configuration preset.
    #[arg(long, value_enum, default_value = "k3-slice")]
    preset: Preset,
    /// MoE layers (k3-slice, qwen3-moe-slice, qwen3-30b-slice, gpt-oss-slice, deepseek-v3-slice, kimi-k2-slice).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Routed experts per layer (k3-slice: default 128; gpt-oss-slice: default gpt-oss-120b's
    /// 128, and 32 with --layers 24 is gpt-oss-20b; deepseek-v3-slice / kimi-k2-slice: default
    /// the published 256 / 384).
    #[arg(long)]
    experts: Option<usize>,
    /// Tokenizer ranks; the vocabulary adds K3's 256 reserved specials (k3-slice); the
    /// vocabulary rows of qwen3-moe-slice, qwen3-30b-slice and gpt-oss-slice.
    #[arg(long, default_value_t = 32768)]
    ranks: usize,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// k3-slice: skew the routing like a trained model's (a benchmark knob, not a model
    /// property): router biases fitted so expert popularity follows the curve measured on the
    /// built-in mini-K3, so that caches and warm starts have something to gain.
    #[arg(long)]
    route_skew: bool,
    /// k3-slice, deepseek-v3-slice, kimi-k2-slice: which tokenizer ranks to write. `synthetic`
    /// (512 merges learned over a short text, then fillers) or `trained` (the built-in
    /// mini-K3's 8,192 ranks trained on 64 MB of docs and code, then fillers), with which
    /// text tokenizes as the workload suite's prompts are sized ("8k mini-K3 tokens").
    #[arg(long, value_enum, default_value = "synthetic")]
    tokenizer: SynthTokenizer,
}

/// The tokenizer ranks `sluice synth` writes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SynthTokenizer {
    /// 512 merges learned over a short built-in text, then filler tokens.
    Synthetic,
    /// mini-K3's 8,192 trained ranks, then filler tokens.
    Trained,
}

/// Writes the tokenizer `a.tokenizer` names, `ranks` ranks and K3's 256 specials, into `a.out`.
fn write_tokenizer(a: &SynthArgs, ranks: usize) -> Result<()> {
    match a.tokenizer {
        SynthTokenizer::Synthetic => sluice_engine::demo::write_tokenizer_files(&a.out, ranks),
        SynthTokenizer::Trained => {
            sluice_engine::demo::write_trained_tokenizer_files(&a.out, ranks)
        }
    }
    .with_context(|| format!("writing the tokenizer of {}", a.out.display()))
}

/// Runs the command.
pub fn run(a: &SynthArgs) -> Result<()> {
    if a.route_skew && !matches!(a.preset, Preset::K3Slice) {
        bail!("--route-skew applies to --preset k3-slice only");
    }
    if matches!(a.tokenizer, SynthTokenizer::Trained)
        && matches!(a.preset, Preset::Qwen3MoeSlice | Preset::Qwen3_30bSlice | Preset::GptOssSlice)
    {
        bail!(
            "--tokenizer applies to the presets that write a tokenizer; {} writes none",
            a.preset.name()
        );
    }
    let reuse = a.out.join(MARKER).is_file();
    if !reuse && a.out.exists() && a.out.read_dir().map(|mut d| d.next().is_some()).unwrap_or(true)
    {
        bail!(
            "{} exists, is not empty and is not the output of an earlier `sluice synth`; choose \
             a new directory",
            a.out.display()
        );
    }
    let (text, ranks) = match a.preset {
        Preset::K3Slice => {
            let experts = a.experts.unwrap_or(128);
            if a.layers == 0 || experts < 16 || a.ranks < 256 {
                bail!("k3-slice needs --layers ≥ 1, --experts ≥ 16 and --ranks ≥ 256");
            }
            (k3_slice_text_config(a.layers, experts, a.ranks + 256), a.ranks)
        }
        Preset::Demo => (sluice_engine::demo::demo_text_config(512 + 256), 512),
        Preset::Qwen3MoeSlice
        | Preset::Qwen3_30bSlice
        | Preset::GptOssSlice
        | Preset::DeepseekV3Slice
        | Preset::KimiK2Slice => return family_slice(a, reuse),
        Preset::ManyExperts => {
            let experts = a.experts.unwrap_or(128);
            if a.layers == 0 || experts < 4 {
                bail!("many-experts needs --layers ≥ 1 and --experts ≥ 4");
            }
            let mut t = sluice_engine::demo::demo_text_config(512 + 256);
            // One dense layer first (as in the demo), then `layers` MoE layers alternating
            // KDA and MLA attention like K3.
            let n = a.layers + 1;
            let kda: Vec<usize> = (1..=n).filter(|i| i % 2 == 0).collect();
            let full: Vec<usize> = (1..=n).filter(|i| i % 2 == 1).collect();
            t["num_hidden_layers"] = n.into();
            t["linear_attn_config"]["kda_layers"] = kda.into();
            t["linear_attn_config"]["full_attn_layers"] = full.into();
            t["num_experts"] = experts.into();
            t["moe_intermediate_size"] = 1024.into();
            t["routed_expert_hidden_size"] = 128.into();
            (t, 512)
        }
    };
    let config = release_config(&text, ranks as u64);
    let bytes = checkpoint_bytes(&text).context("sizing the checkpoint")?;
    eprintln!(
        "sluice synth: writing {} of tensors ({bytes} bytes, preset {}, seed {}) into {}",
        human(bytes),
        a.preset.name(),
        a.seed,
        a.out.display()
    );
    prepare_dir(a, reuse)?;
    let bar = progress_bar()?;
    let total = write_checkpoint(&a.out, &config, &text, a.seed, ranks, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing {}", a.out.display()))?;
    bar.finish_and_clear();
    if a.route_skew {
        let experts = a.experts.unwrap_or(128);
        let top = crate::synth_skew::apply(&a.out, experts, 16.min(experts), a.seed)
            .with_context(|| format!("skewing the routing of {}", a.out.display()))?;
        eprintln!(
            "sluice synth: routing skewed like mini-K3's (benchmark knob): the most used quarter \
             of each layer's experts is fitted to take {:.0}% of the choices",
            100.0 * top
        );
    }
    write_tokenizer(a, ranks)?;
    println!(
        "wrote {} ({} of tensors, {total} bytes, seed {})",
        a.out.display(),
        human(total),
        a.seed
    );
    Ok(())
}

/// A slice of a family whose synthetic writer is [`sluice_models::synth`] (Qwen3-MoE, GPT-OSS,
/// DeepSeek-V3).
fn family_slice(a: &SynthArgs, reuse: bool) -> Result<()> {
    if a.layers == 0 || a.ranks < 16 {
        bail!("{} needs --layers ≥ 1 and --ranks ≥ 16", a.preset.name());
    }
    let deepseek = match a.preset {
        Preset::DeepseekV3Slice => Some((DsSlice::DeepseekV3, 256, 8)),
        Preset::KimiK2Slice => Some((DsSlice::KimiK2, 384, 1)),
        _ => None,
    };
    let (config, shards) = match (a.preset, deepseek) {
        (_, Some((kind, published, groups))) => {
            let experts = a.experts.unwrap_or(published);
            if experts < 8 || !experts.is_multiple_of(groups) {
                bail!(
                    "{} needs --experts ≥ 8 (top-8 routing), a multiple of its {groups} expert                      groups",
                    a.preset.name()
                );
            }
            // The tokenizer's ranks plus the 256 reserved specials, as k3-slice.
            let c = sluice_models::deepseek_v3::synth::slice_config(
                kind,
                a.layers,
                experts,
                a.ranks + 256,
            );
            let t = sluice_models::deepseek_v3::synth::tensors(&c);
            (c, t)
        }
        (Preset::GptOssSlice, _) => {
            let experts = a.experts.unwrap_or(128);
            if experts < 4 {
                bail!("gpt-oss-slice needs --experts ≥ 4 (top-4 routing)");
            }
            let c = sluice_models::gpt_oss::synth::slice_config(a.layers, experts, a.ranks);
            let t = sluice_models::gpt_oss::synth::tensors(&c);
            (c, t)
        }
        (Preset::Qwen3_30bSlice, _) => {
            let c = sluice_models::qwen3_moe::synth::slice_config_30b(a.layers, a.ranks);
            let t = sluice_models::qwen3_moe::synth::tensors(&c);
            (c, t)
        }
        _ => {
            let c = sluice_models::qwen3_moe::synth::slice_config(a.layers, a.ranks);
            let t = sluice_models::qwen3_moe::synth::tensors(&c);
            (c, t)
        }
    };
    let shards = shards.context("listing the slice's tensors")?;
    let bytes = sluice_models::synth::total_bytes(&shards);
    eprintln!(
        "sluice synth: writing {} of tensors ({bytes} bytes, preset {}, seed {}) into {}",
        human(bytes),
        a.preset.name(),
        a.seed,
        a.out.display()
    );
    prepare_dir(a, reuse)?;
    let bar = progress_bar()?;
    let total =
        sluice_models::synth::write(&a.out, &config, &shards, a.seed, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .with_context(|| format!("writing {}", a.out.display()))?;
    bar.finish_and_clear();
    if deepseek.is_some() {
        write_tokenizer(a, a.ranks)?;
        println!(
            "wrote {} ({} of tensors, {total} bytes, seed {})",
            a.out.display(),
            human(total),
            a.seed
        );
        return Ok(());
    }
    println!(
        "wrote {} ({} of tensors, {total} bytes, seed {}; no tokenizer: run it with --prompt-ids)",
        a.out.display(),
        human(total),
        a.seed
    );
    Ok(())
}

/// Empties an earlier synth output (`reuse`) and marks the directory as synth's own.
fn prepare_dir(a: &SynthArgs, reuse: bool) -> Result<()> {
    if reuse {
        let freed = empty_own_dir(&a.out)?;
        eprintln!(
            "sluice synth: {} is an earlier synth output: removed its {} and rewriting it",
            a.out.display(),
            human(freed)
        );
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(
        a.out.join(MARKER),
        b"written by sluice synth; rerunning it rewrites this directory\n",
    )
    .with_context(|| format!("marking {} as synth output", a.out.display()))?;
    Ok(())
}

/// The byte progress bar of a write.
fn progress_bar() -> Result<ProgressBar> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec} eta {eta}",
        )
        .context("progress template")?,
    );
    Ok(bar)
}

impl Preset {
    /// The name `--preset` takes.
    fn name(self) -> &'static str {
        match self {
            Self::K3Slice => "k3-slice",
            Self::Demo => "demo",
            Self::ManyExperts => "many-experts",
            Self::Qwen3MoeSlice => "qwen3-moe-slice",
            Self::Qwen3_30bSlice => "qwen3-30b-slice",
            Self::GptOssSlice => "gpt-oss-slice",
            Self::DeepseekV3Slice => "deepseek-v3-slice",
            Self::KimiK2Slice => "kimi-k2-slice",
        }
    }
}

/// Removes every file of an earlier synth output in `dir` (finished shards, an interrupted
/// run's temporary files, the marker), so that nothing of a run with other flags survives the
/// rewrite. Returns the bytes freed. Refuses a directory with subdirectories: synth never makes
/// one, so someone else's files are there.
fn empty_own_dir(dir: &Path) -> Result<u64> {
    let mut freed = 0;
    let entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    if let Some(sub) = entries.iter().find(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
        bail!(
            "{} holds a directory ({}) that sluice synth did not write; choose a new directory",
            dir.display(),
            sub.file_name().to_string_lossy()
        );
    }
    for e in entries {
        let len = e.metadata().map_or(0, |m| m.len());
        std::fs::remove_file(e.path())
            .with_context(|| format!("removing {}", e.path().display()))?;
        freed += len;
    }
    Ok(freed)
}
