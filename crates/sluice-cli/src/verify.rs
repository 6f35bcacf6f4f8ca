//! `sluice verify DIR`: is this checkpoint intact? With an install manifest
//! (`sluice-install.json`, written by `sluice pull`) every installed file is re-hashed against
//! its recorded SHA-256; in every case each shard's header is parsed and every tensor's byte
//! range checked against the file length and the index. One line per file, a non-zero exit
//! when anything is wrong.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use sluice_checkpoint::verify::check_structure;
use sluice_hub::verify::{bytes_to_hash, verify_install};
use sluice_hub::{InstallManifest, MANIFEST_FILE};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Flags of `sluice verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Checkpoint directory.
    dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One file's verdict, merged from the hash and the structure checks.
#[derive(Debug, Default)]
struct Verdict {
    bytes: u64,
    hashed: bool,
    tensors: Option<usize>,
    problems: Vec<String>,
}

/// Runs the command.
pub fn run(a: &VerifyArgs) -> Result<()> {
    let manifest_path = a.dir.join(MANIFEST_FILE);
    let manifest = if manifest_path.exists() {
        Some(InstallManifest::read(&manifest_path).context("reading the install manifest")?)
    } else {
        None
    };
    let mut files: BTreeMap<String, Verdict> = BTreeMap::new();
    if let Some(m) = &manifest {
        let bar = ProgressBar::new(bytes_to_hash(m));
        if a.json {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template(
                "hashing {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec} eta {eta}",
            )
            .context("progress template")?,
        );
        for c in verify_install(&a.dir, m, &mut |n| bar.inc(n)) {
            let v = files.entry(c.file).or_default();
            v.bytes = c.bytes;
            v.hashed = c.problem.is_none();
            v.problems.extend(c.problem);
        }
        bar.finish_and_clear();
    }
    let structure = check_structure(&a.dir)
        .with_context(|| format!("reading the index of {}", a.dir.display()))?;
    for c in structure {
        let v = files.entry(c.file).or_default();
        v.bytes = v.bytes.max(c.len);
        v.tensors = Some(c.tensors);
        v.problems.extend(c.problem);
    }
    let bad = files.values().filter(|v| !v.problems.is_empty()).count();
    if a.json {
        let list: Vec<_> = files
            .iter()
            .map(|(f, v)| {
                json!({"file": f, "bytes": v.bytes, "sha256_checked": v.hashed,
                       "tensors": v.tensors, "ok": v.problems.is_empty(), "problems": v.problems})
            })
            .collect();
        println!(
            "{}",
            json!({"dir": a.dir.display().to_string(), "manifest": manifest.is_some(),
                   "ok": bad == 0, "files": list})
        );
    } else {
        if manifest.is_none() {
            println!(
                "no {MANIFEST_FILE}: checking structure only (headers, tensor ranges against file \
                 lengths and the index); bytes changed inside a tensor cannot be detected without \
                 recorded hashes"
            );
        }
        for (f, v) in &files {
            let what = match (v.hashed, v.tensors) {
                (true, Some(t)) => format!("SHA-256 matches, {t} tensors in range"),
                (true, None) => "SHA-256 matches".to_owned(),
                (false, Some(t)) => format!("{t} tensors in range"),
                (false, None) => String::new(),
            };
            if v.problems.is_empty() {
                println!("OK   {f} ({} bytes, {what})", v.bytes);
            } else {
                println!("BAD  {f}: {}", v.problems.join("; "));
            }
        }
    }
    if bad > 0 {
        bail!("{bad} of {} files failed verification", files.len());
    }
    Ok(())
}
