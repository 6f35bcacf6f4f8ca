//! `sluice bench`: end-to-end benchmark runs as fresh `sluice run --json` child processes.
//!
//! Configurations are interleaved (A B C A B C …) so slow drift of a shared machine hits each
//! alike; every run's tokens are checked against an oracle (the first run's, or ids given in a
//! file) and a mismatch is a loud failure with a non-zero exit. Storage bandwidth is probed on
//! the model's own shards (uncached, cold) before and after the runs, so each run's pass time
//! is compared with the bound measured in the same invocation: expert bytes read ÷ bandwidth.
//! Cold runs drop the model's pages first. With `--cgroup-limit` every child runs in a fresh
//! memory cgroup (v1) of that size, so page cache counts against the limit like on a small
//! machine (Linux only; the OS-specific calls are in `sluice_store::platform`).

use crate::bench_report::{derive, print_summary, summarize, RunRecord};
use crate::open::Target;
use crate::workload;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sluice_checkpoint::{Checkpoint, CheckpointConfig};
use sluice_engine::plan::parse_size;
use sluice_engine::Spine;
use sluice_store::platform::{advice, counters, direct, memory::ChildLimit};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Flags of `sluice bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Checkpoint directory; omit to use the built-in model (mini-K3).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A workload of the suite (prose, code, long, chat, tools) or a JSON file of the same
    /// shape (tools/workloads/): its prompt, rendered for the model, and its --max-new. Without
    /// --config, runs two configurations: `plain` and `ngram` (--draft ngram).
    #[arg(long, conflicts_with_all = ["prompt", "prompt_ids", "prompt_len"])]
    workload: Option<String>,
    /// Write the route trace (`sluice run --trace-routes`) of the first run of the first
    /// configuration to FILE.
    #[arg(long, value_name = "FILE")]
    trace_routes: Option<PathBuf>,
    /// A configuration as NAME=ARGS, where ARGS are extra `sluice run` flags separated by
    /// spaces (e.g. `--config noprefetch=--no-prefetch`). Repeatable; default one configuration
    /// named `default` with no extra flags.
    #[arg(long = "config")]
    configs: Vec<String>,
    /// Runs per configuration.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Drop the model's cached pages before every run.
    #[arg(long)]
    cold: bool,
    /// Let the runs read and write the model's hot set (warm starts): each run then starts
    /// with the experts the runs before it used most. Default: every run starts with an empty
    /// cache (`--no-warm-start` is passed to each run).
    #[arg(long)]
    warm_start: bool,
    /// With --cold: only drop the model's files' pages (`posix_fadvise`; `msync` on macOS),
    /// never the whole page cache (/proc/sys/vm/drop_caches).
    #[arg(long)]
    fadvise_only: bool,
    /// Prompt text.
    #[arg(long, conflicts_with_all = ["prompt_ids", "prompt_len"])]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt_len")]
    prompt_ids: Option<Vec<u32>>,
    /// A prompt of this many deterministic pseudo-random token ids (default 8).
    #[arg(long)]
    prompt_len: Option<usize>,
    /// New tokens per run (default 8, or the workload's).
    #[arg(long)]
    max_new: Option<usize>,
    /// File with the expected generated ids (comma or whitespace separated); default: the
    /// first run's tokens are the oracle.
    #[arg(long)]
    oracle_ids: Option<PathBuf>,
    /// `--memory` passed to every run.
    #[arg(long)]
    memory: Option<String>,
    /// Run every child in a memory cgroup (v1) limited to this size (needs a writable
    /// /sys/fs/cgroup/memory).
    #[arg(long)]
    cgroup_limit: Option<String>,
    /// Bytes the storage probe reads (before and after the runs).
    #[arg(long, default_value = "2G")]
    probe_bytes: String,
    /// Print one JSON object with every run and the summary.
    #[arg(long)]
    json: bool,
    /// Instead of model runs: write and restore prompt states of drawn values through the
    /// on-disk state cache in DIR, against the disk's bandwidth measured in the same run: Kimi
    /// K3's at the published dimensions (no model needed), or with --model that model's
    /// (see docs/PERFORMANCE.md).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["workload", "configs"])]
    snapshot_io: Option<PathBuf>,
    /// Prompt lengths of the states --snapshot-io writes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,4096,16384",
        requires = "snapshot_io"
    )]
    snapshot_tokens: Vec<usize>,
}

/// A named configuration: extra `sluice run` flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name shown in the report.
    pub name: String,
    /// Extra flags.
    pub args: Vec<String>,
}

fn parse_configs(raw: &[String], workload: bool) -> Result<Vec<Config>> {
    if raw.is_empty() && workload {
        return Ok(vec![
            Config { name: "plain".into(), args: Vec::new() },
            Config { name: "ngram".into(), args: vec!["--draft".into(), "ngram".into()] },
        ]);
    }
    if raw.is_empty() {
        return Ok(vec![Config { name: "default".into(), args: Vec::new() }]);
    }
    let mut out: Vec<Config> = Vec::new();
    for r in raw {
        let Some((name, args)) = r.split_once('=') else {
            bail!("--config {r:?}: expected NAME=ARGS (e.g. noprefetch=--no-prefetch)");
        };
        if name.is_empty() || out.iter().any(|c| c.name == name) {
            bail!("--config {r:?}: the name must be non-empty and unique");
        }
        out.push(Config {
            name: name.into(),
            args: args.split_whitespace().map(String::from).collect(),
        });
    }
    Ok(out)
}

/// Deterministic pseudo-random prompt ids in `[256, vocab - 256)` (away from special tokens).
fn synthetic_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(512).max(1) as u64;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            u32::try_from(256 + (x >> 33) % span).unwrap_or(256)
        })
        .collect()
}

fn read_ids(path: &Path) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>().with_context(|| format!("{}: {s:?} is not a token id", path.display()))
        })
        .collect()
}

/// Drops the model's cached pages; returns how.
fn drop_caches(paths: &[PathBuf], fadvise_only: bool) -> Result<String> {
    for p in paths {
        sluice_store::probe::drop_file_cache(p)
            .with_context(|| format!("dropping the cached pages of {}", p.display()))?;
    }
    // The whole cache is dropped only where this process may.
    if !fadvise_only && advice::drop_all().is_ok() {
        return Ok(format!("{} on every model file + {}", advice::FILE_METHOD, advice::ALL_METHOD));
    }
    Ok(format!("{} on every model file", advice::FILE_METHOD))
}

/// Runs one child and returns its JSON output (or why it failed).
fn run_child(
    exe: &Path,
    cg: Option<&ChildLimit>,
    base: &[String],
    cfg: &Config,
) -> Result<(Value, f64)> {
    let mut cmd = match cg {
        Some(cg) => cg.command(exe),
        None => Command::new(exe),
    };
    cmd.args(base).args(&cfg.args);
    let t0 = Instant::now();
    let out = cmd.output().with_context(|| format!("starting {}", exe.display()))?;
    let wall = t0.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: String = stderr
            .lines()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        bail!("config {}: `sluice run` failed ({}):\n{tail}", cfg.name, out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.trim()).with_context(|| {
        format!("config {}: `sluice run --json` printed no JSON object", cfg.name)
    })?;
    Ok((v, wall))
}

/// Runs the command.
pub fn run(a: &BenchArgs) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(dir) = &a.snapshot_io {
        return crate::snapshot_io::run(
            dir,
            a.model.as_deref(),
            &a.snapshot_tokens,
            a.runs,
            a.json,
        );
    }
    let configs = parse_configs(&a.configs, a.workload.is_some())?;
    let workload = a.workload.as_deref().map(workload::load).transpose()?;
    let target = Target::find(a.model.as_deref(), Spine::Bf16, "benchmarking")?;
    let model = target.dir.clone();
    let ckpt = Checkpoint::open(&model).with_context(|| format!("opening {}", model.display()))?;
    let shards = ckpt.shard_paths().to_vec();
    drop(ckpt);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&model)
        .with_context(|| format!("listing {}", model.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let max_new = a.max_new.or(workload.as_ref().map(|w| w.max_new)).unwrap_or(8);
    let prompt_args: Vec<String> = match (&a.prompt, &a.prompt_ids, a.prompt_len) {
        _ if workload.is_some() => {
            let w = workload.as_ref().context("workload")?;
            let fmt = target.format("a workload needs the model's tokenizer")?;
            vec!["--prompt-ids".into(), join_ids(&w.prompt_ids(fmt)?)]
        }
        (Some(t), _, _) => vec!["--prompt".into(), t.clone()],
        (None, Some(ids), _) => vec!["--prompt-ids".into(), join_ids(ids)],
        (None, None, n) => {
            let cfg = CheckpointConfig::load(&model).context("reading config.json")?;
            let vocab = cfg.text_config().get("vocab_size").and_then(Value::as_u64).unwrap_or(1024);
            let vocab = usize::try_from(vocab).unwrap_or(1024);
            vec!["--prompt-ids".into(), join_ids(&synthetic_prompt(n.unwrap_or(8), vocab))]
        }
    };
    let mut base: Vec<String> = vec![
        "run".into(),
        "--model".into(),
        model.display().to_string(),
        "--json".into(),
        "--max-new".into(),
        max_new.to_string(),
    ];
    // Long prompts (the `long` workload) need a context beyond run's default plan.
    if a.workload.is_some() {
        let n = prompt_args.get(1).map_or(0, |ids| ids.split(',').count());
        base.extend(["--context".into(), (n + max_new).max(4096).to_string()]);
    }
    base.extend(prompt_args);
    if !a.warm_start {
        // Runs must not warm each other through the hot set, or the first run of a
        // configuration would be measured against later ones that started warm.
        base.push("--no-warm-start".into());
    }
    if let Some(m) = &a.memory {
        parse_size(m).map_err(anyhow::Error::msg)?;
        base.extend(["--memory".into(), m.clone()]);
    }
    let cg = a
        .cgroup_limit
        .as_deref()
        .map(|s| {
            parse_size(s)
                .map_err(anyhow::Error::msg)
                .and_then(|b| ChildLimit::new(b).context("--cgroup-limit"))
        })
        .transpose()?;
    let mut oracle: Option<Vec<u32>> = a.oracle_ids.as_deref().map(read_ids).transpose()?;
    let oracle_source = if oracle.is_some() { "file" } else { "first run" };
    let exe = std::env::current_exe().context("finding the sluice executable")?;
    let probe_max = parse_size(&a.probe_bytes).map_err(anyhow::Error::msg)?;
    // One Kimi K3 expert per read (the store's block size), smaller for toy models so the
    // probe still reads something.
    let largest =
        shards.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).max().unwrap_or(0);
    let probe_block =
        usize::try_from((largest / 4 / 4096 * 4096).clamp(4096, 17_551_360)).unwrap_or(4096);
    let probe = |when: &str| -> Result<sluice_store::probe::StorageProbe> {
        if !a.json {
            eprintln!(
                "bench: probing storage on the model's shards ({when}, {}, {} bytes)",
                direct::NAME,
                probe_max
            );
        }
        for p in &shards {
            let _ = sluice_store::probe::drop_file_cache(p);
        }
        sluice_store::probe::storage_read(
            &shards,
            probe_block,
            16,
            probe_max,
            sluice_store::IoBackend::Auto,
        )
        .context("storage probe")
    };
    let before = probe("before")?;
    let mut records: Vec<RunRecord> = Vec::new();
    let mut mismatches = 0usize;
    let mut drop_method = String::from("none (warm)");
    for r in 0..a.runs {
        for cfg in &configs {
            if a.cold {
                drop_method = drop_caches(&files, a.fadvise_only)?;
            }
            let load = counters::load_average();
            let mut cfg = cfg.clone();
            if let Some(p) = a.trace_routes.as_ref().filter(|_| records.is_empty()) {
                cfg.args.extend(["--trace-routes".into(), p.display().to_string()]);
            }
            let (v, wall) = run_child(&exe, cg.as_ref(), &base, &cfg)?;
            let ids: Vec<u32> = v["generated_ids"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                        .collect()
                })
                .unwrap_or_default();
            let matches = match &oracle {
                Some(o) => *o == ids,
                None => {
                    oracle = Some(ids.clone());
                    true
                }
            };
            if !matches {
                mismatches += 1;
                eprintln!(
                    "\n!!! TOKEN MISMATCH: config {} run {} generated {:?}\n!!! oracle ({oracle_source}) is {:?}\n",
                    cfg.name, r + 1, ids, oracle.as_deref().unwrap_or_default()
                );
            }
            let rec = RunRecord {
                config: cfg.name.clone(),
                run: r + 1,
                wall_s: wall,
                load_before: load,
                tokens_match: matches,
                output: v,
            };
            if !a.json {
                eprintln!(
                    "bench: {} run {} done in {:.1}s (load {:.2}){}",
                    cfg.name,
                    r + 1,
                    wall,
                    load.unwrap_or(0.0),
                    if matches { "" } else { " MISMATCH" }
                );
            }
            records.push(rec);
        }
    }
    let after = probe("after")?;
    let gbps = (before.gbps + after.gbps) / 2.0;
    let derived: Vec<Value> = records.iter().map(|r| derive(r, gbps)).collect();
    let summary = summarize(&configs, &derived);
    if a.json {
        let mut v = json!({
            "model": model.display().to_string(),
            "runs_per_config": a.runs,
            "cold": a.cold,
            "cache_drop": drop_method,
            "cgroup_limit_bytes": a.cgroup_limit.as_deref().map(parse_size).transpose().map_err(anyhow::Error::msg)?,
            "configs": configs.iter().map(|c| json!({"name": c.name, "args": c.args})).collect::<Vec<_>>(),
            "probe_before": before,
            "probe_after": after,
            "storage_gbps": gbps,
            "oracle": oracle,
            "oracle_source": oracle_source,
            "mismatches": mismatches,
            "runs": derived,
            "raw": records.iter().map(|r| &r.output).collect::<Vec<_>>(),
            "summary": summary,
        });
        // Added after: one more key in the macro above exceeds its recursion limit.
        v["workload"] = json!(workload
            .as_ref()
            .map(|w| json!({"name": w.name, "about": w.about, "source": w.source})));
        println!("{v}");
    } else {
        println!(
            "storage: {:.3} GB/s before, {:.3} GB/s after ({}, {} KiB blocks, 16 in flight) → bound uses {gbps:.3} GB/s; cold: {} ({drop_method})",
            before.gbps,
            after.gbps,
            direct::NAME,
            before.block / 1024,
            a.cold
        );
        print_summary(&summary);
    }
    if mismatches > 0 {
        bail!("{mismatches} run(s) generated tokens different from the oracle ({oracle_source})");
    }
    Ok(())
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_and_prompts() {
        let c = parse_configs(&["a=--no-prefetch --readers 4".into(), "b=".into()], false)
            .expect("valid");
        assert_eq!(c[0].args, ["--no-prefetch", "--readers", "4"]);
        assert!(c[1].args.is_empty());
        assert!(parse_configs(&["noequals".into()], false).is_err());
        assert!(parse_configs(&["a=".into(), "a=--x".into()], false).is_err());
        let w = parse_configs(&[], true).expect("workload defaults");
        assert_eq!(w.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["plain", "ngram"]);
        let p = synthetic_prompt(300, 1000);
        assert_eq!(p, synthetic_prompt(300, 1000), "deterministic");
        assert!(p.iter().all(|&t| (256..744).contains(&t)));
    }
}
