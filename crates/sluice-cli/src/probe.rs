//! `sluice probe`: what this machine delivers, measured now — storage read bandwidth at the
//! expert store's block size and queue depth (O_DIRECT, scattered reads over the model's
//! shards or a file) through io_uring or the pread pool (`--io`; `both` measures each in the
//! same run), and the ISA tier the kernels run on. With `--kernels`, in the same run:
//! memory read bandwidth, every weight format's matmul rate at 1 and 8 activation rows next to
//! it and to storage (MXFP4 in K3's and GPT-OSS's expert shapes, FP8 in DeepSeek-V3's, INT4 in
//! Kimi K2's), the rates at 64 and 256 rows in GFLOP/s next to the FMA
//! peak measured on the same threads, and the fixed cost of a kernel call.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sluice_checkpoint::Checkpoint;
use sluice_engine::plan::parse_size;
use sluice_kernels::probe::KernelProbe;
use sluice_store::IoBackend;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Flags of `sluice probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Read the shards of this checkpoint.
    #[arg(long, conflicts_with = "file")]
    model: Option<PathBuf>,
    /// Read this file instead.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Block size of each read (default: one Kimi K3 expert, 17,547,264 bytes rounded to 4 KiB).
    #[arg(long, default_value = "17551360")]
    block: String,
    /// Reads in flight.
    #[arg(long, default_value_t = 16)]
    readers: usize,
    /// Read backend: auto (io_uring where the kernel allows it, else the pread pool), uring,
    /// pread, or both (io_uring then pread over the same blocks, in one run; pread alone where
    /// the kernel refuses io_uring).
    #[arg(long, default_value = "auto")]
    io: String,
    /// Most bytes to read.
    #[arg(long, default_value = "4G")]
    bytes: String,
    /// Also measure memory read bandwidth, every kernel's rate (int8, bf16, f32, MXFP4 as K3
    /// and GPT-OSS shape their experts, FP8 as DeepSeek-V3, INT4 as Kimi K2; at 1 and 8
    /// activation rows in GB/s and against storage; at 64 and 256 rows in GFLOP/s against the measured FMA
    /// peak) and call overhead. Without --model or --file, storage is read
    /// from a temporary file of up to 1 GiB written in --scratch-dir and removed afterwards.
    #[arg(long)]
    kernels: bool,
    /// Threads for the kernel measurements (default: one per available core).
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds to spend on the kernel measurements (each figure is a median over as many
    /// repetitions as fit, at least three).
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Where --kernels writes its temporary storage file (default: the system temp directory).
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Largest temporary file `--kernels` writes for the storage measurement.
const SCRATCH_MAX: u64 = 1 << 30;

/// Runs the command.
pub fn run(a: &ProbeArgs) -> Result<()> {
    let block = usize::try_from(parse_size(&a.block).map_err(anyhow::Error::msg)?)?;
    let max = parse_size(&a.bytes).map_err(anyhow::Error::msg)?;
    let threads = a.threads.unwrap_or_else(available_threads);
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    if !(a.seconds.is_finite() && a.seconds >= 0.0) {
        bail!("--seconds must be a non-negative number, got {}", a.seconds);
    }
    let (paths, scratch) = match (&a.model, &a.file) {
        (Some(d), _) => {
            let c = Checkpoint::open(d).with_context(|| format!("opening {}", d.display()))?;
            (c.shard_paths().to_vec(), None)
        }
        (None, Some(f)) => (vec![f.clone()], None),
        (None, None) if a.kernels => {
            let dir = a.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
            let s = Scratch::write(&dir, max.min(SCRATCH_MAX), block)?;
            (vec![s.path.clone()], Some(s))
        }
        (None, None) => bail!("give --model DIR or --file PATH to read from (or --kernels)"),
    };
    let backends = match a.io.as_str() {
        "both" => {
            let usable = IoBackend::usable();
            if let Err(e) = sluice_store::backend::uring_available() {
                eprintln!(
                    "io_uring is not available ({e}): --io both measures the pread pool only"
                );
            }
            usable
        }
        other => match IoBackend::parse(other) {
            Some(b) => vec![b],
            None => bail!("--io {other:?}: expected auto, uring, pread or both"),
        },
    };
    let mut all = Vec::with_capacity(backends.len());
    for b in backends {
        for p in &paths {
            // O_DIRECT reads bypass the page cache already; this drops what buffered reads
            // of misaligned tails may have left. Best effort.
            let _ = sluice_store::probe::drop_file_cache(p);
        }
        all.push(
            sluice_store::probe::storage_read(&paths, block, a.readers, max, b)
                .with_context(|| format!("reading for the storage probe (--io {})", a.io))?,
        );
    }
    drop(scratch);
    let Some(s) = all.first().cloned() else { bail!("no storage measurement") };
    let storage_source = match (&a.model, &a.file) {
        (Some(d), _) => d.display().to_string(),
        (None, Some(f)) => f.display().to_string(),
        (None, None) => "temporary file".to_owned(),
    };
    let isa = sluice_kernels::isa::isa().name();
    let kernels = if a.kernels {
        Some(sluice_kernels::probe::measure(threads, a.seconds).context("measuring the kernels")?)
    } else {
        None
    };
    if a.json {
        let mut out = json!({
            "storage_read_gbps": s.gbps,
            "storage": s,
            "storage_source": storage_source,
            "storage_by_backend": all,
            "isa": isa,
            "threads": threads,
        });
        if let Some(k) = &kernels {
            merge_kernels(&mut out, k, s.gbps);
        }
        println!("{out}");
        return Ok(());
    }
    for s in &all {
        println!(
            "storage read {:.3} GB/s ({} bytes in {:.2}s, {} KiB blocks, {} in flight via {}, {}, {storage_source}); kernels ISA {isa}, {threads} threads",
            s.gbps,
            s.bytes,
            s.secs,
            s.block / 1024,
            s.readers,
            s.backend,
            if s.direct { sluice_store::platform::direct::NAME } else { "page cache" },
        );
    }
    if let Some(k) = &kernels {
        print_kernels(k, s.gbps);
    }
    Ok(())
}

/// Adds the kernel measurements to the JSON object: the flat fields, each kernel with
/// its ratio to memory (and MXFP4's to storage), and the call overheads.
fn merge_kernels(out: &mut Value, k: &KernelProbe, storage_gbps: f64) {
    let rates: Vec<Value> = k
        .kernels
        .iter()
        .map(|r| {
            json!({
                "format": r.format,
                "layout": r.layout,
                "rows": r.rows,
                "ratio_to_storage": r.gbps / storage_gbps,
                "gbps": r.gbps,
                "ratio_to_memory": r.ratio_to_memory,
                "gflops": r.gflops,
                "ratio_to_fma_peak": r.ratio_to_fma_peak,
                "shape": r.shape,
                "bytes_per_call": r.bytes_per_call,
                "samples": r.samples,
            })
        })
        .collect();
    out["memory_read_gbps"] = json!(k.memory_read_gbps);
    out["fma_peak_gflops"] = json!(k.fma_peak_gflops);
    out["kernels"] = Value::Array(rates);
    out["dispatch_overhead_ns"] = json!(k.dispatch_overhead_ns);
    out["dispatch"] = json!(k.dispatch);
    out["streamed_expert_formats"] = Value::Array(
        expert_formats(k, storage_gbps)
            .into_iter()
            .map(|(format, layout, gbps, ratio)| {
                json!({"format": format, "layout": layout, "rows": 1, "gbps": gbps,
                       "ratio_to_storage": ratio, "target": EXPERT_TARGET})
            })
            .collect(),
    );
}

/// How many times the storage rate a streamed expert format must decode at one row, so that
/// decoding never bounds a streamed pass (issue 16).
const EXPERT_TARGET: f64 = 5.0;

/// The one-row (decode) rate of every format routed experts stream in — MXFP4 (GPT-OSS), FP8
/// (DeepSeek V3/R1), INT4 (Kimi K2 Thinking) — as `(format, layout, GB/s, ratio to storage)`,
/// the fastest layout of each format.
fn expert_formats(k: &KernelProbe, storage_gbps: f64) -> Vec<(String, String, f64, f64)> {
    ["mxfp4", "fp8", "int4"]
        .iter()
        .filter_map(|f| {
            k.kernels
                .iter()
                .filter(|r| r.format == *f && r.rows == 1)
                .max_by(|a, b| a.gbps.total_cmp(&b.gbps))
                .map(|r| (r.format.clone(), r.layout.clone(), r.gbps, r.gbps / storage_gbps))
        })
        .collect()
}

/// The kernel measurements as a table.
fn print_kernels(k: &KernelProbe, storage_gbps: f64) {
    println!(
        "memory read {:.2} GB/s, FMA peak {:.1} GFLOP/s ({} threads)",
        k.memory_read_gbps, k.fma_peak_gflops, k.threads
    );
    println!(
        "{:<6} {:<11} {:>4} {:>9} {:>10} {:>11} {:>8} {:>8}",
        "format", "layout", "T", "GB/s", "vs memory", "vs storage", "GFLOP/s", "vs peak"
    );
    for r in &k.kernels {
        let storage = format!("{:.1}x", r.gbps / storage_gbps);
        println!(
            "{:<6} {:<11} {:>4} {:>9.2} {:>9.0}% {:>11} {:>8.1} {:>7.0}%",
            r.format,
            r.layout,
            r.rows,
            r.gbps,
            100.0 * r.ratio_to_memory,
            storage,
            r.gflops,
            100.0 * r.ratio_to_fma_peak
        );
    }
    let line: Vec<String> = expert_formats(k, storage_gbps)
        .iter()
        .map(|(f, l, g, r)| {
            let verdict = if *r >= EXPERT_TARGET { "ok" } else { "BELOW" };
            format!("{f} ({l}) {g:.2} GB/s = {r:.1}x {verdict}")
        })
        .collect();
    println!(
        "streamed experts at T=1 vs storage (target >= {EXPERT_TARGET:.0}x): {}",
        line.join(", ")
    );
    let d = &k.dispatch;
    println!(
        "call overhead: {:.0} ns alone; a {}x{} call split over {} threads {:.0} ns vs {:.0} ns on one (overhead {:.0} ns)",
        d.serial_call_ns,
        d.split_shape[0],
        d.split_shape[1],
        k.threads,
        d.split_call_ns,
        d.one_thread_ns,
        d.overhead_ns
    );
}

/// A temporary file for the storage measurement, removed when dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Writes `len` bytes (rounded down to whole `block`s, at least one) of pseudo-random data
    /// to a new file in `dir` and syncs it, so that O_DIRECT reads come from the device.
    fn write(dir: &Path, len: u64, block: usize) -> Result<Self> {
        let block = u64::try_from(block.max(4096))?;
        let len = (len / block).max(1) * block;
        let path = dir.join(format!(".sluice-probe-{}.tmp", std::process::id()));
        let s = Self { path };
        let mut f = std::fs::File::create(&s.path)
            .with_context(|| format!("creating {}", s.path.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut left = len;
        while left > 0 {
            for w in buf.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            let n = usize::try_from(left.min(buf.len() as u64))?;
            f.write_all(&buf[..n]).with_context(|| format!("writing {}", s.path.display()))?;
            left -= n as u64;
        }
        f.sync_all().with_context(|| format!("syncing {}", s.path.display()))?;
        Ok(s)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Nothing to report if it is already gone.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
