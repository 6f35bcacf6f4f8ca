//! `sluice verify DIR`: is this checkpoint intact, and will it run? With an install manifest
//! (`sluice-install.json`, written by `sluice pull`) every installed file is re-hashed against
//! its recorded SHA-256, and so is every file of a converted checkpoint's int8 manifest
//! (`sluice-int8-manifest.json`, written by `sluice convert`); in every case each shard's
//! header is parsed and every tensor's byte range checked against the file length and the
//! index, and the model is checked as `sluice run` checks it at load (architecture, every
//! tensor's presence, dtype and shape against the config). One line per file and one for the
//! model, a non-zero exit when anything is wrong.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use sluice_checkpoint::convert::{Int8Manifest, MANIFEST_FILE as INT8_MANIFEST};
use sluice_checkpoint::verify::{check_records, check_structure};
use sluice_hub::verify::{bytes_to_hash, verify_install};
use sluice_hub::{InstallManifest, MANIFEST_FILE};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    let int8_path = a.dir.join(INT8_MANIFEST);
    let int8 = if int8_path.exists() {
        Some(Int8Manifest::read(&int8_path).context("reading the int8 manifest")?)
    } else {
        None
    };
    let mut files: BTreeMap<String, Verdict> = BTreeMap::new();
    let total = manifest.as_ref().map_or(0, bytes_to_hash)
        + int8.as_ref().map_or(0, |m| m.output.iter().map(|f| f.size).sum());
    if total > 0 {
        let bar = ProgressBar::new(total);
        if a.json {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template(
                "hashing {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec} eta {eta}",
            )
            .context("progress template")?,
        );
        let install = manifest.as_ref().map(|m| verify_install(&a.dir, m, &mut |n| bar.inc(n)));
        let converted =
            int8.as_ref().map(|m| check_records(&a.dir, &m.output, &mut |n| bar.inc(n)));
        let all = install
            .into_iter()
            .flatten()
            .map(|c| (c.file, c.bytes, c.problem))
            .chain(converted.into_iter().flatten().map(|c| (c.file, c.bytes, c.problem)));
        for (file, bytes, problem) in all {
            let v = files.entry(file).or_default();
            v.bytes = v.bytes.max(bytes);
            v.hashed = problem.is_none() && v.problems.is_empty();
            v.problems.extend(problem);
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
    let model = check_model(&a.dir);
    let bad =
        files.values().filter(|v| !v.problems.is_empty()).count() + usize::from(model.is_err());
    if a.json {
        let list: Vec<_> = files
            .iter()
            .map(|(f, v)| {
                json!({"file": f, "bytes": v.bytes, "sha256_checked": v.hashed,
                       "tensors": v.tensors, "ok": v.problems.is_empty(), "problems": v.problems})
            })
            .collect();
        let model = match &model {
            Ok(family) => json!({"ok": true, "family": family}),
            Err(e) => json!({"ok": false, "problem": format!("{e:#}")}),
        };
        println!(
            "{}",
            json!({"dir": a.dir.display().to_string(), "manifest": manifest.is_some(),
                   "int8_manifest": int8.is_some(), "ok": bad == 0, "model": model,
                   "files": list})
        );
    } else {
        if manifest.is_none() && int8.is_none() {
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
        match &model {
            Ok(family) => println!(
                "OK   model: {family}; every tensor `sluice run` loads is present with the dtype \
                 and shape its config implies"
            ),
            Err(e) => println!("BAD  model: {e:#}"),
        }
    }
    if bad > 0 {
        let what = if model.is_err() { " and the model check" } else { "" };
        bail!("{bad} of {} checks failed (the files{what})", files.len() + 1);
    }
    Ok(())
}

/// The checks `sluice run` makes when it loads the model: the family it found, or why it
/// would refuse to run.
fn check_model(dir: &Path) -> Result<&'static str> {
    let ckpt = crate::inspect::open_checkpoint(dir)?;
    Ok(sluice_models::check(&ckpt)?.family.display)
}
