//! Pull throughput against the local test hub, next to `curl` fetching the same files.
//!
//! ```text
//! cargo run --release -p sluice-hub --features test-hub --example pull_bench -- \
//!     [--mib 1024] [--files 4] [--workers 4] [--runs 3] [--bars 1]
//! ```
//!
//! The hub serves `--files` LFS files totalling `--mib` MiB of pseudo-random bytes from
//! memory, through the same resolve → 302 → CDN path as huggingface.co. Each sluice run pulls
//! them into a fresh directory (SHA-256 verified, fsynced, renamed); each curl run fetches
//! them with `curl --parallel -L` into a fresh directory, then (a second figure) also runs
//! `sha256sum` over them, for a like-for-like comparison with verification. Medians of
//! `--runs` runs are printed in MiB/s.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice_hub::testhub::{safetensors_bytes, HubFile, HubRepo, TestHub};
use sluice_hub::{
    Bars, HubClient, HubConfig, ModeRequest, NoProgress, PlanOptions, Progress, PullOptions,
    StatvfsFreeSpace,
};

struct Args {
    mib: usize,
    files: usize,
    workers: usize,
    runs: usize,
    bars: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { mib: 1024, files: 4, workers: 4, runs: 3, bars: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let n: usize = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
        match flag.as_str() {
            "--mib" => a.mib = n,
            "--files" => a.files = n.max(1),
            "--workers" => a.workers = n.max(1),
            "--runs" => a.runs = n.max(1),
            "--bars" => a.bars = n != 0,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn run_sluice(
    hub: &TestHub,
    repo: &HubRepo,
    workers: usize,
    scratch: &Path,
    show: bool,
    bars: bool,
) -> Result<Duration, String> {
    let dir = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let client = HubClient::new(HubConfig::new(hub.endpoint())).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let info = client.resolve(&repo.id, "main").map_err(|e| e.to_string())?;
    let opts = PlanOptions {
        mode: ModeRequest::Full,
        dir: Some(dir.path().to_path_buf()),
        reuse_cache: None,
        workers,
        ..PlanOptions::default()
    };
    let plan = client.plan(&info, &opts, &StatvfsFreeSpace).map_err(|e| e.to_string())?;
    let pull = PullOptions { workers, ..PullOptions::default() };
    let progress: Box<dyn Progress> =
        if bars { Box::new(Bars::new()) } else { Box::new(NoProgress) };
    let report = client.pull(&plan, &pull, progress.as_ref()).map_err(|e| e.to_string())?;
    let elapsed = t.elapsed();
    if show {
        println!("{plan}\n\n{report}\n");
    }
    Ok(elapsed)
}

fn run_curl(
    hub: &TestHub,
    repo: &HubRepo,
    workers: usize,
    scratch: &Path,
    hash: bool,
) -> Result<Duration, String> {
    let dir = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-f", "-L", "--parallel", "--parallel-max", &workers.to_string()]);
    for f in &repo.files {
        cmd.arg("-o").arg(dir.path().join(&f.path));
        cmd.arg(format!("{}/{}/resolve/main/{}", hub.endpoint(), repo.id, f.path));
    }
    let t = Instant::now();
    let st = cmd.status().map_err(|e| format!("curl: {e}"))?;
    if !st.success() {
        return Err(format!("curl failed: {st}"));
    }
    if hash {
        let mut sum = Command::new("sha256sum");
        for f in &repo.files {
            sum.arg(dir.path().join(&f.path));
        }
        let out = sum.output().map_err(|e| format!("sha256sum: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        for f in &repo.files {
            if !text.contains(&f.sha256()) {
                return Err(format!("curl fetched wrong bytes for {}", f.path));
            }
        }
    }
    Ok(t.elapsed())
}

fn main() -> Result<(), String> {
    let a = parse_args()?;
    let each = a.mib * 1024 * 1024 / a.files;
    let files = (0..a.files)
        .map(|i| {
            let name = format!("model-{:05}-of-{:05}.safetensors", i + 1, a.files);
            let data = safetensors_bytes(&[("model.embed_tokens.weight", each)], i as u64);
            HubFile::new(&name, data, true)
        })
        .collect();
    let repo = HubRepo::new("bench/throughput", files);
    let total: u64 = repo.files.iter().map(|f| f.data.len() as u64).sum();
    let hub = TestHub::start(vec![repo.clone()]).map_err(|e| e.to_string())?;
    let scratch = std::env::temp_dir();
    println!(
        "{} files, {} MiB in total, {} workers, {} runs (median MiB/s)",
        a.files, a.mib, a.workers, a.runs
    );

    let mut sluice = Vec::new();
    let mut curl = Vec::new();
    let mut curl_hash = Vec::new();
    let have_curl = Command::new("curl").arg("--version").output().is_ok();
    // Interleave the tools so drift in the machine's load hits both alike.
    for run in 0..a.runs {
        sluice.push(mib_per_s(
            total,
            run_sluice(&hub, &repo, a.workers, &scratch, run == 0, a.bars)?,
        ));
        if have_curl {
            curl.push(mib_per_s(total, run_curl(&hub, &repo, a.workers, &scratch, false)?));
            curl_hash.push(mib_per_s(total, run_curl(&hub, &repo, a.workers, &scratch, true)?));
        }
    }
    println!("sluice pull (SHA-256 + fsync + rename): {:8.1}", median(sluice));
    if have_curl {
        println!("curl --parallel -L (no verification):   {:8.1}", median(curl));
        println!("curl --parallel -L + sha256sum:         {:8.1}", median(curl_hash));
    } else {
        println!("curl not found: no comparison");
    }
    Ok(())
}
