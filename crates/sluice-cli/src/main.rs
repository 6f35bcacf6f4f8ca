//! The `sluice` binary: raw flags are parsed here into validated options for the library
//! crates, which own all the logic. Errors are reported with their full cause chain.

mod bench;
mod bench_report;
mod convert;
mod doctor;
mod inspect;
mod interrupt;
mod load_args;
mod npy;
mod open;
mod prefill_progress;
mod probe;
mod pull;
mod run;
mod run_output;
mod serve;
mod snapshot_io;
mod state_cache_args;
mod synth;
mod synth_skew;
mod values;
mod verify;
mod warm_start;
mod workload;

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
    /// Generate from a prompt (greedy). Without --model, uses the built-in model (mini-K3).
    Run(run::RunArgs),
    /// Serve the OpenAI-compatible HTTP API (chat, completions, SSE) on 127.0.0.1.
    Serve(serve::ServeArgs),
    /// Write a synthetic checkpoint of a real architecture in its published layout.
    Synth(synth::SynthArgs),
    /// Install a model from a Hugging Face–compatible hub (HF_ENDPOINT, HF_TOKEN), full or stream.
    Pull(pull::PullArgs),
    /// Benchmark runs as fresh processes: configurations interleaved, tokens checked against
    /// an oracle, medians with min/max and the ratio to the storage bound.
    Bench(bench::BenchArgs),
    /// Check a checkpoint: SHA-256 against the install manifest, tensor ranges against shards.
    Verify(verify::VerifyArgs),
    /// Check an install (files, sizes, hashes with --deep, expert cache), the kernels and free disk.
    Doctor(doctor::DoctorArgs),
    /// Measure storage read bandwidth at the expert store's block size and queue depth.
    Probe(probe::ProbeArgs),
    /// Write a checkpoint's spine as row-int8 with f16 scales (lossy; docs/INT8.md).
    Convert(convert::ConvertArgs),
    /// Measure the int8 spine against the published checkpoint: top-1 agreement, KL, logits.
    Accuracy(convert::AccuracyArgs),
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
    // `run` handles a closed stdout itself (it stops generating and still prints its stats);
    // `serve` must outlive clients that hang up.
    if !matches!(cli.cmd, Cmd::Serve(_) | Cmd::Run(_)) {
        interrupt::default_sigpipe();
    }
    let res: Result<()> = match cli.cmd {
        Cmd::Run(a) => run::run(&a),
        Cmd::Probe(a) => probe::run(&a),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Verify(a) => verify::run(&a),
        Cmd::Doctor(a) => match doctor::run(&a) {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => Err(e),
        },
        Cmd::Serve(a) => serve::run(&a),
        Cmd::Pull(a) => pull::run(&a),
        Cmd::Synth(a) => synth::run(&a),
        Cmd::Convert(a) => convert::run(&a),
        Cmd::Accuracy(a) => convert::accuracy(&a),
        Cmd::Inspect { dir, json } => inspect::run(&dir, json),
    };
    if let Err(e) = res {
        eprintln!("error: {}", causes(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, `: ` apart, each said once. Library errors print their source
/// inline as well as expose it as a cause, and contexts name the path their cause names too;
/// `{e:#}` would repeat both ("…: No such file (os error 2): No such file (os error 2)").
/// A cause already inside the message is left out, and one that begins with the words the
/// message ends with continues it.
fn causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if s.is_empty() || out.contains(&s) {
            continue;
        }
        // "opening /m" + "/m: no config.json" → "opening /m: no config.json".
        let overlap = s.match_indices(": ").map(|(i, _)| i).find(|&i| {
            out.strip_suffix(&s[..i]).is_some_and(|head| head.is_empty() || head.ends_with(' '))
        });
        match overlap {
            Some(i) => out.push_str(&s[i..]),
            None => {
                if !out.is_empty() {
                    out.push_str(": ");
                }
                out.push_str(&s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::causes;

    #[test]
    fn error_causes_were_printed_twice() {
        // A library error that prints its source inline and also exposes it as its cause,
        // under a context that names the same path.
        let source = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = source.to_string();
        let inline = sluice_checkpoint::CheckpointError::Io { path: "/m/a".into(), source };
        let e = anyhow::Error::new(inline).context("reading /m/a");
        assert_eq!(causes(&e), format!("reading /m/a: {said}"));
        let e = anyhow::anyhow!("x: boom").context("y");
        assert_eq!(causes(&e), "y: x: boom", "distinct causes are all kept");
    }
}
