//! The `sluice` binary: raw flags are parsed here into validated options for the library
//! crates, which own all the logic. Errors are reported with their full cause chain.

mod inspect;
mod load_args;
mod npy;
mod probe;
mod pull;
mod run;
mod serve;
mod synth;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Run mixture-of-experts models far larger than memory, exactly.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Generate from a prompt (greedy). Without --model, uses the built-in random-weight demo model.
    Run(run::RunArgs),
    /// Serve the OpenAI-compatible HTTP API (chat, completions, SSE) on 127.0.0.1.
    Serve(serve::ServeArgs),
    /// Write a synthetic checkpoint of a real architecture in its published layout.
    Synth(synth::SynthArgs),
    /// Install a model from a Hugging Face–compatible hub (HF_ENDPOINT, HF_TOKEN), full or stream.
    Pull(pull::PullArgs),
    /// Measure storage read bandwidth at the expert store's block size and queue depth.
    Probe(probe::ProbeArgs),
    /// Summarise a checkpoint: config, tensors and bytes by kind, expert size, memory needs.
    Inspect {
        /// Checkpoint directory (config.json + safetensors shards).
        dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let res: Result<()> = match cli.cmd {
        Cmd::Run(a) => run::run(&a),
        Cmd::Probe(a) => probe::run(&a),
        Cmd::Serve(a) => serve::run(&a),
        Cmd::Pull(a) => pull::run(&a),
        Cmd::Synth(a) => synth::run(&a),
        Cmd::Inspect { dir, json } => inspect::run(&dir, json),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
