//! `sluice doctor [DIR] [--deep] [--json]`: a read-only, network-free health check of an
//! install (files, sizes, hashes with `--deep`, mode, pinned revision, expert cache) or of a
//! plain checkpoint directory (checked as `sluice run` checks it at load), the
//! kernels' self-test on this CPU, and the storage the model lives on (free space, uncached
//! read and write bandwidth of its disk, swap on it: [`sluice_store::storage_check`]), ending
//! in a verdict and, for each problem, what to do. Exits 1 when something is wrong. The write
//! test is the one thing doctor writes: a temporary file in the model directory (at most
//! 256 MiB or 2 s, then fsync), removed after; `--no-bandwidth` skips both bandwidth tests.

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use sluice_hub::doctor::check_install;
use sluice_hub::{bytes, FreeSpace, StatvfsFreeSpace};
use sluice_kernels::selftest::self_test;
use sluice_store::storage_check::{self, Bandwidth, StorageReport};
use sluice_store::telemetry::model_files;
use std::path::{Path, PathBuf};

/// Flags of `sluice doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The install (model directory) to check; default the current directory.
    dir: Option<PathBuf>,
    /// Also hash every file (and cached expert) against the recorded SHA-256.
    #[arg(long)]
    deep: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Skip the storage read and write bandwidth tests (free space and swap are still checked).
    #[arg(long)]
    no_bandwidth: bool,
}

/// Runs the command; `Ok(false)` when problems were found.
pub fn run(a: &DoctorArgs) -> Result<bool> {
    let dir = a.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    let health =
        check_install(&dir, a.deep).with_context(|| format!("checking {}", dir.display()))?;
    let kernels = self_test();
    let isa = sluice_kernels::isa();
    let free = StatvfsFreeSpace.free_bytes(&dir).ok();
    let storage = storage(&dir, a.no_bandwidth);
    let mut problems: Vec<(String, String, String)> = Vec::new();
    match &health {
        Some(h) => {
            for p in &h.problems {
                problems.push((p.file.clone(), p.what.clone(), p.fix.clone()));
            }
        }
        // A plain checkpoint directory (the demo model, `sluice synth` or `sluice convert`
        // output, a copied download) has no install record to compare against; it is checked
        // the way `sluice run` checks it at load instead.
        None => {
            if let Err(e) = check_plain(&dir) {
                problems.push((
                    dir.display().to_string(),
                    format!("{e:#}"),
                    "point doctor at a checkpoint directory (config.json + safetensors shards), \
                     or reinstall it with `sluice pull REPO --dir DIR`"
                        .into(),
                ));
            }
        }
    }
    for k in kernels.iter().filter(|k| !k.ok) {
        problems.push((
            format!("kernels ({})", k.isa.name()),
            format!("{} differs from the scalar reference by up to {}", k.format, k.max_abs_diff),
            format!("run with SLUICE_ISA=scalar and report this CPU ({})", isa.name()),
        ));
    }
    if a.json {
        let v = json!({
            "dir": dir.display().to_string(),
            "install": health,
            "kernels": {
                "isa": isa.name(),
                "checks": kernels.iter().map(|k| json!({
                    "isa": k.isa.name(), "format": k.format, "ok": k.ok, "max_abs_diff": k.max_abs_diff,
                })).collect::<Vec<_>>(),
            },
            "free_bytes": free,
            "storage": storage,
            "healthy": problems.is_empty(),
            "problems": problems.iter().map(|(file, what, fix)| json!({"file": file, "what": what, "fix": fix})).collect::<Vec<_>>(),
        });
        println!("{v}");
        return Ok(problems.is_empty());
    }
    if let Some(h) = &health {
        println!(
            "install     {} ({} mode, {})",
            dir.display(),
            h.mode,
            if h.complete { "complete" } else { "INCOMPLETE" }
        );
        println!(
            "repository  {} @ {} → commit {} (from {})",
            h.repo, h.revision, h.commit, h.endpoint
        );
        let hashed = if a.deep { format!(", {} hashed", h.hashed) } else { String::new() };
        println!("files       {} listed, {} as published{hashed}", h.files, bytes(h.bytes));
        if let Some(c) = &h.cache {
            let verified =
                if a.deep { format!(", {} verified", c.verified) } else { String::new() };
            println!("experts     {} cached locally ({}){verified}", c.experts, bytes(c.bytes));
        }
    }
    if health.is_none() {
        println!("checkpoint  {} (a plain directory, no sluice-install.json)", dir.display());
    }
    // The self-test runs every format on every tier; each tier is named once.
    let tiers: Vec<&str> = kernels.iter().fold(Vec::new(), |mut t, k| {
        if !t.contains(&k.isa.name()) {
            t.push(k.isa.name());
        }
        t
    });
    let ok = kernels.iter().filter(|k| k.ok).count();
    println!(
        "kernels     {} in use; {ok} of {} checks equal the scalar reference (tiers {})",
        isa.name(),
        kernels.len(),
        tiers.join(", ")
    );
    if let Some(f) = free {
        println!("free disk   {} on {}", bytes(f), dir.display());
    }
    print_storage(&storage);
    if problems.is_empty() {
        println!("verdict     healthy");
    } else {
        println!("verdict     {} problem(s):", problems.len());
        for (file, what, fix) in &problems {
            println!("  - {file}: {what}\n    fix: {fix}");
        }
    }
    Ok(problems.is_empty())
}

/// The storage section; without bandwidth tests when `skip` is set.
fn storage(dir: &Path, skip: bool) -> StorageReport {
    let files = model_files(dir);
    if skip {
        let mut r = storage_check::check_space_and_swap(dir);
        r.read = Err("skipped (--no-bandwidth)".into());
        r.write = Err("skipped (--no-bandwidth)".into());
        return r;
    }
    storage_check::check(dir, &files)
}

fn print_storage(s: &StorageReport) {
    let bw = |b: &Result<Bandwidth, String>| match b {
        Ok(b) => format!(
            "{:.2} GB/s ({} in {:.2}s{})",
            b.gbps,
            bytes(b.bytes),
            b.secs,
            if b.direct { ", uncached" } else { ", through the page cache" }
        ),
        Err(e) => format!("n/a: {e}"),
    };
    let space = match (s.free_bytes, s.total_bytes) {
        (Some(f), Some(t)) => format!("{} free of {}", bytes(f), bytes(t)),
        _ => "free space n/a".into(),
    };
    println!("storage     disk {}, {space}", s.disk.as_deref().unwrap_or("n/a"));
    println!("  read      {}", bw(&s.read));
    println!("  write     {}", bw(&s.write));
    match &s.swap {
        Some(a) if a.is_empty() => println!("  swap      none"),
        Some(a) => {
            for e in a {
                println!(
                    "  swap      {} ({}, disk {})",
                    e.path.display(),
                    bytes(e.bytes),
                    e.disk.as_deref().unwrap_or("n/a")
                );
            }
        }
        None => println!("  swap      n/a"),
    }
    for w in &s.warnings {
        println!("  warning   {w}");
    }
}

/// Checks a plain checkpoint directory as `sluice run` would at load.
fn check_plain(dir: &std::path::Path) -> Result<()> {
    let ckpt = sluice_checkpoint::Checkpoint::open(dir)
        .context("no sluice-install.json, and not a checkpoint directory either")?;
    sluice_models::check(&ckpt).context("the model would not load for `sluice run`")?;
    Ok(())
}
