//! `sluice bench --snapshot-io DIR`: what one Kimi K3 prompt state costs to keep on disk, at
//! the published configuration (93 layers: 69 KDA with 96 heads of 128 and a conv window of
//! 3 × 3 × 12,288, 24 MLA with a 512 + 64 latent per position, vocabulary 163,840), without the
//! model: a state of N positions is built with those shapes and drawn values
//! ([`K3State::synthetic`]), handed to the real on-disk state cache ([`StateCache`]: encode,
//! temp file, fsync, rename, directory fsync), its pages dropped, and restored through the
//! cache's lookup (read, checksum, decode) into a live state. In the same run, and interleaved
//! with it, the disk's own bandwidth is measured on a plain file of the same size written the
//! same way (1 MiB buffered writes, fsync) and read back cold, so each figure is reported as a
//! ratio to what the disk did at that moment.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_engine::state_cache::{StateCache, StateCacheConfig};
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::state::K3State;
use sluice_models::kimi_k3::synth::K3Dims;
use sluice_models::State;
use sluice_store::platform::advice;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Kimi K3's published vocabulary (the logits row kept with a prompt-end state).
const K3_VOCAB: usize = 163_840;
/// Kimi K3's decoder layers; [`K3Dims::k3_slice`] makes every fourth and the last MLA, which
/// gives the published 69 KDA and 24 MLA layers.
const K3_LAYERS: usize = 93;

/// One size's measurements.
#[derive(Debug, Default)]
struct Size {
    bytes: u64,
    write: Vec<f64>,
    restore: Vec<f64>,
    disk_write: Vec<f64>,
    disk_read: Vec<f64>,
}

/// Runs the benchmark in `dir` (created; its files are removed afterwards) for each prompt
/// length in `tokens`, `runs` times each, and prints a table (or one JSON object).
pub fn run(dir: &Path, tokens: &[usize], runs: usize, json_out: bool) -> Result<()> {
    if tokens.is_empty() || tokens.contains(&0) {
        bail!("--snapshot-tokens needs one or more lengths of at least 1 token");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = K3Dims::k3_slice(K3_LAYERS, 896, K3_VOCAB).text_config();
    let cfg = K3Config::from_json(&text).context("the published K3 dimensions")?;
    let mut sizes: Vec<Size> = tokens.iter().map(|_| Size::default()).collect();
    // Runs outermost, sizes inside: drift of a shared machine hits every size alike.
    for run in 0..runs {
        for (i, &n) in tokens.iter().enumerate() {
            let s = &mut sizes[i];
            let (write, restore, bytes) = state_round(dir, &cfg, n, run as u64)?;
            let (dw, dr) = disk_round(dir, bytes)?;
            s.bytes = bytes;
            s.write.push(write);
            s.restore.push(restore);
            s.disk_write.push(dw);
            s.disk_read.push(dr);
            if !json_out {
                eprintln!(
                    "run {}: {n} tokens, {bytes} bytes: write {write:.3}s, restore {restore:.3}s; \
                     plain file write {dw:.3}s, cold read {dr:.3}s",
                    run + 1
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir.join("states"));
    report(tokens, &sizes, json_out);
    Ok(())
}

/// Writes and restores one state of `n` positions; returns (write s, restore s, file bytes).
fn state_round(dir: &Path, cfg: &K3Config, n: usize, seed: u64) -> Result<(f64, f64, u64)> {
    let states = dir.join("states");
    let _ = std::fs::remove_dir_all(&states);
    let state = State::new("kimi_k3", K3State::synthetic(cfg, n, seed));
    let shape = state.shape();
    let snap = Arc::new(state.snapshot(None));
    drop(state);
    #[allow(clippy::cast_precision_loss)]
    let logits: Arc<[f32]> = (0..K3_VOCAB).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let ids: Vec<u32> = (0..n).map(|i| u32::try_from(i * 7 % K3_VOCAB).unwrap_or(0)).collect();
    let c = StateCacheConfig { dir: states.clone(), max_bytes: u64::MAX, every: 0 };
    let cache = StateCache::open(c, [0x4b; 32], shape, K3_VOCAB)
        .with_context(|| format!("opening a state cache in {}", states.display()))?;
    let t0 = Instant::now();
    cache.submit(&ids, snap, Some(logits));
    cache.flush();
    let write = t0.elapsed().as_secs_f64();
    let st = cache.stats();
    if st.files_written != 1 || st.write_errors > 0 {
        bail!("the state file was not written ({} errors)", st.write_errors);
    }
    for e in std::fs::read_dir(&states)? {
        advice::drop_file(&e?.path()).context("dropping the state file's pages")?;
    }
    let t1 = Instant::now();
    let restored = cache.lookup(&ids, 0).context("the state just written was not restored")?;
    let live = restored.snapshot.restore();
    let restore = t1.elapsed().as_secs_f64();
    if live.len() != n || restored.logits.as_ref().map(Vec::len) != Some(K3_VOCAB) {
        bail!("the restored state has {} positions, {n} expected", live.len());
    }
    Ok((write, restore, st.bytes_written))
}

/// Writes a plain file of `bytes` the way the state writer does (1 MiB buffered writes, then
/// fsync), drops its pages and reads it back; returns (write s, read s).
fn disk_round(dir: &Path, bytes: u64) -> Result<(f64, f64)> {
    let path = dir.join(format!(".sluice-disk-probe-{}", std::process::id()));
    let block = vec![0x5au8; 1 << 20];
    let t0 = Instant::now();
    {
        let f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut left = bytes;
        while left > 0 {
            let k = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
            w.write_all(&block[..k])?;
            left -= k as u64;
        }
        let f = w.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        f.sync_all()?;
    }
    let write = t0.elapsed().as_secs_f64();
    advice::drop_file(&path).context("dropping the probe file's pages")?;
    let t1 = Instant::now();
    let mut r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&path)?);
    let mut buf = vec![0u8; 1 << 20];
    while r.read(&mut buf)? > 0 {}
    let read = t1.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok((write, read))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints the table (or JSON): per size the file, medians and their ratios to the disk.
fn report(tokens: &[usize], sizes: &[Size], json_out: bool) {
    let rows: Vec<Value> = tokens
        .iter()
        .zip(sizes)
        .map(|(&n, s)| {
            #[allow(clippy::cast_precision_loss)]
            let gb = s.bytes as f64 / 1e9;
            let (w, r) = (median(&s.write), median(&s.restore));
            let (dw, dr) = (median(&s.disk_write), median(&s.disk_read));
            json!({
                "tokens": n, "bytes": s.bytes,
                "write_s": w, "restore_s": r,
                "disk_write_s": dw, "disk_read_s": dr,
                "disk_write_gbps": gb / dw, "disk_read_gbps": gb / dr,
                "write_vs_disk": w / dw, "restore_vs_disk": r / dr,
                "write_runs_s": s.write, "restore_runs_s": s.restore,
            })
        })
        .collect();
    if json_out {
        println!("{}", json!({ "snapshot_io": rows }));
        return;
    }
    println!(
        "tokens | state file bytes | write s | restore s | plain write s (GB/s) | cold read s \
         (GB/s) | write ÷ plain | restore ÷ cold read"
    );
    for r in &rows {
        println!(
            "{} | {} | {:.3} | {:.3} | {:.3} ({:.2}) | {:.3} ({:.2}) | {:.2} | {:.2}",
            r["tokens"],
            r["bytes"],
            r["write_s"].as_f64().unwrap_or(f64::NAN),
            r["restore_s"].as_f64().unwrap_or(f64::NAN),
            r["disk_write_s"].as_f64().unwrap_or(f64::NAN),
            r["disk_write_gbps"].as_f64().unwrap_or(f64::NAN),
            r["disk_read_s"].as_f64().unwrap_or(f64::NAN),
            r["disk_read_gbps"].as_f64().unwrap_or(f64::NAN),
            r["write_vs_disk"].as_f64().unwrap_or(f64::NAN),
            r["restore_vs_disk"].as_f64().unwrap_or(f64::NAN),
        );
    }
}
