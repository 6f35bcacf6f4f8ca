//! `sluice bench --snapshot-io DIR`: what one prompt state costs to keep on disk. A state of N
//! positions is built with drawn values — by default Kimi K3's at its published dimensions
//! (93 layers, 69 KDA + 24 MLA, vocabulary 163,840; [`sluice_models::snapshot::reference_state`]),
//! with `--model DIR` that model's own state ([`sluice_models::State::fill_synthetic`]) — handed
//! to the real on-disk state cache ([`StateCache`]: chunked checksums, temp file, fsync, rename,
//! directory fsync), its pages dropped, and restored through the cache's lookup (read, chunk
//! checksums, into the arrays) into a live state. In the same run, and interleaved with it, the
//! disk's own bandwidth is measured on a plain file of the same size written the same way
//! (1 MiB buffered writes, fsync) and read back cold, so each figure is reported as a ratio to
//! what the disk did at that moment. Nothing here names a family: the state comes through the
//! model boundary.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_checkpoint::Checkpoint;
use sluice_engine::state_cache::{StateCache, StateCacheConfig};
use sluice_models::{Model, State};
use sluice_store::platform::advice;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Where the measured states come from.
enum Source {
    /// The reference state (Kimi K3 at its published dimensions).
    Reference,
    /// A loaded model's own state.
    Model(Model),
}

impl Source {
    /// A state of `n` drawn positions and its model's vocabulary.
    fn state(&self, n: usize, seed: u64) -> Result<(State, usize)> {
        match self {
            Source::Reference => Ok(sluice_models::snapshot::reference_state(n, seed)?),
            Source::Model(m) => {
                let mut s = m.new_state();
                s.fill_synthetic(n, seed);
                Ok((s, m.vocab_size()))
            }
        }
    }
}

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
pub fn run(
    dir: &Path,
    model: Option<&Path>,
    tokens: &[usize],
    runs: usize,
    json_out: bool,
) -> Result<()> {
    if tokens.is_empty() || tokens.contains(&0) {
        bail!("--snapshot-tokens needs one or more lengths of at least 1 token");
    }
    let source = match model {
        None => Source::Reference,
        Some(m) => {
            let ckpt = Checkpoint::open(m).with_context(|| format!("opening {}", m.display()))?;
            let model = sluice_models::load(Arc::new(ckpt))
                .with_context(|| format!("loading {}", m.display()))?;
            Source::Model(model)
        }
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut sizes: Vec<Size> = tokens.iter().map(|_| Size::default()).collect();
    // Runs outermost, sizes inside: drift of a shared machine hits every size alike.
    for run in 0..runs {
        for (i, &n) in tokens.iter().enumerate() {
            let s = &mut sizes[i];
            let (write, restore, bytes) = state_round(dir, &source, n, run as u64)?;
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
fn state_round(dir: &Path, source: &Source, n: usize, seed: u64) -> Result<(f64, f64, u64)> {
    let states = dir.join("states");
    let _ = std::fs::remove_dir_all(&states);
    let (state, vocab) = source.state(n, seed)?;
    let shape = state.shape();
    let snap = Arc::new(state.snapshot(None));
    drop(state);
    #[allow(clippy::cast_precision_loss)]
    let logits: Arc<[f32]> = (0..vocab).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let top = u32::try_from(vocab).unwrap_or(u32::MAX).max(1);
    let ids: Vec<u32> = (0..n).map(|i| u32::try_from(i * 7).unwrap_or(0) % top).collect();
    let c = StateCacheConfig { dir: states.clone(), max_bytes: u64::MAX, every: 0 };
    let cache = StateCache::open(c, [0x4b; 32], shape, vocab)
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
    if live.len() != n || restored.logits.as_ref().map(Vec::len) != Some(vocab) {
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
