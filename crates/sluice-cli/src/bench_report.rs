//! What `sluice bench` derives from each run's `sluice run --json` output, and the per
//! configuration summary (median, min, max of every figure).
//!
//! The storage bound of a phase is the expert bytes it read divided by the bandwidth probed in
//! the same invocation; the ratio of measured time to that bound is the headline figure
//! (1.0 = the pass costs exactly its reads; every other cost is hidden underneath them). A
//! stricter variant divides by the disk's best showing in the run (see [`derive`]).

use crate::bench::Config;
use serde_json::{json, Map, Value};

/// One finished run.
#[derive(Debug)]
pub struct RunRecord {
    /// Configuration name.
    pub config: String,
    /// 1-based run number within the configuration.
    pub run: usize,
    /// Wall seconds of the whole child process.
    pub wall_s: f64,
    /// 1-minute load average just before the run.
    pub load_before: Option<f64>,
    /// Whether its tokens equal the oracle.
    pub tokens_match: bool,
    /// The child's JSON output.
    pub output: Value,
}

/// The figures of one run, summarized per configuration (name, what it is).
pub const METRICS: &[(&str, &str)] = &[
    ("wall_s", "process wall s"),
    ("load_s", "load s"),
    ("ttft_s", "time to first token s (prefill)"),
    ("s_per_token", "decode s/token"),
    ("acceptance", "draft acceptance"),
    ("read_bytes_per_token", "expert bytes read/token (decode)"),
    ("written_bytes_per_token", "process bytes written/token"),
    ("prefill_s", "prefill s"),
    ("prefill_bound_s", "prefill bound s"),
    ("prefill_ratio", "prefill / bound"),
    ("prefill_busy_ratio", "prefill / needed bytes at max(probe, reads while busy)"),
    ("prefill_read_amplification", "prefill read / distinct routed"),
    ("s_per_pass", "decode s/pass"),
    ("decode_bound_s_per_pass", "decode bound s/pass"),
    ("decode_ratio", "decode / bound"),
    ("decode_read_gbps", "decode reads GB/s while busy"),
    ("decode_busy_ratio", "decode / needed bytes at max(probe, reads while busy)"),
    ("tokens_per_pass", "tokens/pass"),
    ("decode_bytes_per_pass", "expert bytes read/pass"),
    ("decode_needed_bytes_per_pass", "expert bytes needed/pass (read − unused guesses)"),
    ("expert_bytes_read", "expert bytes read"),
    ("other_bytes_read", "other bytes read (spine...)"),
    ("hit_rate", "cache hit rate"),
    ("prefetch_recall", "prefetch recall"),
    ("prefetch_issued", "prefetch reads issued"),
    ("prefetch_used", "prefetch reads used"),
    ("prefetch_wasted_bytes", "prefetch wasted bytes"),
    ("expert_reads", "expert reads"),
    ("requests_per_expert_read", "disk requests per expert read"),
    ("decode_io_wait_s_per_pass", "decode io wait s/pass"),
    ("decode_compute_s_per_pass", "decode other s/pass"),
    ("s_per_pass_per_moe_layer", "decode s/pass per MoE layer"),
    ("peak_rss_bytes", "peak RSS bytes"),
    ("process_read_bytes", "process bytes read (storage)"),
    ("process_written_bytes", "process bytes written (storage)"),
    ("expert_cache_written_bytes", "expert disk cache bytes written"),
    ("state_written_bytes", "state file bytes written"),
    ("swap_in_bytes", "swap-in bytes (system-wide)"),
    ("swap_out_bytes", "swap-out bytes (system-wide)"),
    ("major_faults", "major page faults"),
    ("disk_written_bytes", "model disk bytes written (all)"),
    ("model_page_cache_fraction", "model files in page cache"),
];

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

/// Bytes read for guesses that were never used, summed over a phase's per-layer stats.
fn wasted(layers: &Value) -> f64 {
    layers.as_array().map_or(0.0, |ls| ls.iter().map(|l| f(l, "wasted_bytes")).sum())
}

/// Derives the per-run figures; `gbps` is the probed bandwidth in GB/s (10⁹ bytes).
///
/// A phase's bound divides the expert bytes it read by the probed bandwidth (`*_ratio`, the
/// issue's definition). A second, stricter bound (`*_busy_ratio`) divides them by the larger of
/// the probe and the bandwidth the run's own reads got while the disk was busy with them
/// (bytes over the wall time with a read in flight): a disk that serves the engine's reads
/// faster than the probe's (a swinging virtual disk, a host cache) then cannot make the ratio
/// look better than the disk's best showing in the same run. With the engine's own rate as the
/// denominator that bound is exactly the time the disk was busy, so the busy ratio says how
/// much of the pass the disk sat idle. The stricter bound counts only the bytes the phase
/// needed: prefetched experts that were never used (`wasted_bytes` of its layers) kept the
/// disk busy without shortening anything, so they do not count as work done.
pub fn derive(r: &RunRecord, gbps: f64) -> Value {
    let st = &r.output["stats"];
    let bw = gbps * 1e9;
    let passes = f(st, "passes");
    let decode_passes = (passes - 1.0).max(0.0);
    let decode_s = f(st, "decode_s");
    let s_per_pass = ratio(decode_s, decode_passes);
    let decode_read = f(st, "decode_expert_bytes_read");
    let decode_got = ratio(decode_read, f(st, "decode_read_busy_s"));
    let per_pass = ratio(decode_read, decode_passes);
    let bound = per_pass.and_then(|b| ratio(b, bw));
    let decode_needed = (decode_read - wasted(&st["decode_layers"])).max(0.0);
    let busy_bound = ratio(decode_needed, decode_passes)
        .and_then(|b| ratio(b, decode_got.map_or(bw, |g| g.max(bw))));
    let prefill_read = f(st, "prefill_expert_bytes_read");
    let prefill_got = ratio(prefill_read, f(st, "prefill_read_busy_s"));
    let prefill_bound = ratio(prefill_read, bw);
    let prefill_needed = (prefill_read - wasted(&st["prefill_layers"])).max(0.0);
    let prefill_busy_bound = ratio(prefill_needed, prefill_got.map_or(bw, |g| g.max(bw)));
    let moe_layers = st["decode_layers"].as_array().map_or(0, Vec::len);
    #[allow(clippy::cast_precision_loss)]
    let per_layer = s_per_pass.and_then(|s| ratio(s, moe_layers as f64));
    let expert_read = f(st, "expert_bytes_read");
    let process_read = f(st, "process_read_bytes");
    let wait = f(st, "decode_io_wait_s");
    let mut d = json!({
        "config": r.config,
        "run": r.run,
        "tokens_match": r.tokens_match,
        "load_before": r.load_before,
        "wall_s": r.wall_s,
        "load_s": r.output["load_s"],
        "prompt_tokens": st["prompt_tokens"],
        "prefill_passes": st["prefill_passes"],
        "generated_tokens": st["generated_tokens"],
        "decode_passes": decode_passes,
        "prefill_s": st["prefill_s"],
        "prefill_bound_s": prefill_bound,
        "prefill_ratio": prefill_bound.and_then(|b| ratio(f(st, "prefill_s"), b)),
        "prefill_expert_bytes_read": prefill_read,
        "prefill_distinct_expert_bytes": st["prefill_distinct_expert_bytes"],
        "prefill_read_amplification": ratio(prefill_read, f(st, "prefill_distinct_expert_bytes")),
        "prefill_io_wait_s": st["prefill_io_wait_s"],
        "s_per_pass": s_per_pass,
        "decode_bound_s_per_pass": bound,
        "decode_read_gbps": decode_got.map(|g| g / 1e9),
        "decode_busy_ratio": busy_bound.and_then(|b| s_per_pass.and_then(|s| ratio(s, b))),
        "prefill_read_gbps": prefill_got.map(|g| g / 1e9),
        "prefill_busy_ratio": prefill_busy_bound.and_then(|b| ratio(f(st, "prefill_s"), b)),
        "decode_ratio": bound.and_then(|b| s_per_pass.and_then(|s| ratio(s, b))),
        "tokens_per_pass": st["tokens_per_pass"],
        "decode_bytes_per_pass": per_pass,
        "decode_needed_bytes_per_pass": ratio(decode_needed, decode_passes),
        "expert_bytes_read": expert_read,
        "other_bytes_read": (process_read > 0.0).then(|| (process_read - expert_read).max(0.0)),
        "hit_rate": st["hit_rate"],
        "prefetch_recall": st["prefetch_recall"],
        "prefetch_wasted_bytes": st["prefetch_wasted_bytes"],
        "decode_io_wait_s_per_pass": ratio(wait, decode_passes),
        "decode_compute_s_per_pass": ratio(decode_s - wait, decode_passes),
        "moe_layers": moe_layers,
        "s_per_pass_per_moe_layer": per_layer,
        "peak_rss_bytes": st["peak_rss_bytes"],
        "budget_bytes": r.output["plan"]["budget"],
        "cache_slots": r.output["plan"]["slots"],
        "prefill_layers": st["prefill_layers"],
        "decode_layers": st["decode_layers"],
    });
    // The workload figures (added after: more keys in one macro exceed its recursion limit).
    for (k, x) in [
        ("ttft_s", st["prefill_s"].clone()),
        ("s_per_token", st["s_per_token"].clone()),
        ("acceptance", st["acceptance"].clone()),
        ("read_bytes_per_token", st["expert_bytes_read_per_token"].clone()),
    ] {
        d[k] = x;
    }
    // Machine telemetry (null where the OS did not say: summaries skip it, never zero).
    let m = &r.output["machine"];
    for k in [
        "process_read_bytes",
        "process_written_bytes",
        "expert_cache_written_bytes",
        "state_written_bytes",
        "swap_in_bytes",
        "swap_out_bytes",
        "major_faults",
    ] {
        d[k] = m[k].clone();
    }
    d["disk_written_bytes"] = json!(m["disk_written_after_bytes"]
        .as_u64()
        .zip(m["disk_written_before_bytes"].as_u64())
        .map(|(a, b)| a.saturating_sub(b)));
    d["model_page_cache_fraction"] = m["model_page_cache"]["fraction"].clone();
    // Bytes the process wrote per generated token (the workload suite's figure; absent when
    // the OS did not say).
    #[allow(clippy::cast_precision_loss)]
    let per_token = m["process_written_bytes"].as_u64().and_then(|w| {
        st["generated_tokens"].as_u64().filter(|&n| n > 0).map(|n| w as f64 / n as f64)
    });
    d["written_bytes_per_token"] = json!(per_token);
    // Disk requests per expert read (1 where an expert's parts coalesce into one read).
    d["requests_per_expert_read"] = json!(ratio(f(st, "expert_span_reads"), f(st, "expert_reads")));
    d["expert_reads"] = st["expert_reads"].clone();
    d["prefetch_issued"] = st["prefetch_issued"].clone();
    d["prefetch_used"] = st["prefetch_used"].clone();
    d
}

/// Median (mean of the middle two for an even count), min and max.
pub fn stats(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((med, v[0], v[n - 1]))
}

/// Per configuration: every metric's median, min and max over its runs.
pub fn summarize(configs: &[Config], runs: &[Value]) -> Value {
    let mut out = Vec::new();
    for c in configs {
        let mine: Vec<&Value> = runs.iter().filter(|r| r["config"] == c.name.as_str()).collect();
        let mut m = Map::new();
        for (k, _) in METRICS {
            let vals: Vec<f64> = mine.iter().filter_map(|r| r[*k].as_f64()).collect();
            if let Some((med, lo, hi)) = stats(vals) {
                m.insert((*k).into(), json!({"median": med, "min": lo, "max": hi}));
            }
        }
        out.push(json!({"config": c.name, "args": c.args, "runs": mine.len(), "metrics": m}));
    }
    Value::Array(out)
}

/// Prints the summary as one block per configuration.
pub fn print_summary(summary: &Value) {
    for c in summary.as_array().into_iter().flatten() {
        println!(
            "config {} ({} runs) {}",
            c["config"].as_str().unwrap_or("?"),
            c["runs"],
            c["args"]
        );
        for (k, what) in METRICS {
            let m = &c["metrics"][*k];
            if let (Some(med), Some(lo), Some(hi)) =
                (m["median"].as_f64(), m["min"].as_f64(), m["max"].as_f64())
            {
                let f = |v| fmt(k, v);
                println!("  {what:<32} median {:>12} [min {}, max {}]", f(med), f(lo), f(hi));
            }
        }
    }
}

/// A metric's value with its unit: byte counts in binary units (GiB, MiB, KiB).
fn fmt(key: &str, v: f64) -> String {
    if key.contains("bytes") && v.is_finite() && v >= 0.0 {
        // Byte counts are whole and far below 2^53; the cast only drops a fraction.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        crate::inspect::human(v.round() as u64)
    } else if v.abs() >= 1e6 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_printed_bytes_as_1_6755e7() {
        assert_eq!(fmt("decode_bytes_per_pass", 1.6755e7), "15.98 MiB");
        assert_eq!(fmt("peak_rss_bytes", 3.0 * 1024.0 * 1024.0 * 1024.0), "3.00 GiB");
        assert_eq!(fmt("s_per_pass", 0.25), "0.2500");
        assert_eq!(fmt("wall_s", 1.5e6), "1500000");
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(stats(vec![3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(stats(vec![4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(stats(vec![f64::NAN]), None);
        let out = json!({"load_s": 1.0, "plan": {"budget": 10, "slots": 2}, "stats": {
            "passes": 5, "decode_s": 4.0, "decode_expert_bytes_read": 4e9,
            "prefill_s": 2.0, "prefill_expert_bytes_read": 1e9, "prefill_distinct_expert_bytes": 1e9,
            "decode_io_wait_s": 1.0, "decode_layers": [{}, {}]}});
        let r = RunRecord {
            config: "a".into(),
            run: 1,
            wall_s: 9.0,
            load_before: None,
            tokens_match: true,
            output: out,
        };
        let d = derive(&r, 2.0);
        assert_eq!(d["s_per_pass"], 1.0);
        assert_eq!(d["decode_bound_s_per_pass"], 0.5);
        assert_eq!(d["decode_ratio"], 2.0);
        assert_eq!(d["prefill_ratio"], 4.0);
        assert_eq!(d["prefill_read_amplification"], 1.0);
        assert_eq!(d["s_per_pass_per_moe_layer"], 0.5);
        assert_eq!(d["decode_compute_s_per_pass"], 0.75);
        let s = summarize(&[Config { name: "a".into(), args: vec![] }], &[d]);
        assert_eq!(s[0]["metrics"]["decode_ratio"]["median"], 2.0);
        // A run without machine figures (the OS refused them) summarizes none, not zeros.
        assert!(s[0]["metrics"].get("swap_out_bytes").is_none(), "{s}");
        assert!(s[0]["metrics"].get("disk_written_bytes").is_none(), "{s}");

        // Reads that got 4 GB/s while the disk was busy beat the 2 GB/s probe: the bound uses
        // the faster figure (the ratio never flatters a disk that did better than its probe);
        // reads slower than the probe leave the probe's bound.
        let mut r = r;
        r.output["stats"]["decode_read_busy_s"] = json!(1.0);
        r.output["stats"]["prefill_read_busy_s"] = json!(1.0);
        let d = derive(&r, 2.0);
        assert_eq!(d["decode_read_gbps"], 4.0);
        assert_eq!(d["decode_ratio"], 2.0, "against the probe");
        assert_eq!(d["decode_busy_ratio"], 4.0, "against the reads' 4 GB/s");
        assert_eq!(d["prefill_busy_ratio"], 4.0, "1 GB/s while busy: the probe's 2 GB/s stays");

        // Guesses read and never used kept the disk busy but were not needed: the stricter
        // bound leaves them out (half of the 4 GB here), the probe's bound does not.
        r.output["stats"]["decode_layers"] = json!([{"wasted_bytes": 1e9}, {"wasted_bytes": 1e9}]);
        let d = derive(&r, 2.0);
        assert_eq!(d["decode_needed_bytes_per_pass"], 0.5e9);
        assert_eq!(d["decode_ratio"], 2.0, "every byte read, against the probe");
        assert_eq!(d["decode_busy_ratio"], 8.0, "needed bytes only, at the reads' 4 GB/s");

        // Machine figures pass through; the disk's writes are the counter's difference.
        r.output["machine"] = json!({"swap_out_bytes": 0, "disk_written_before_bytes": 100,
            "disk_written_after_bytes": 4196, "model_page_cache": {"fraction": 0.25}});
        let d = derive(&r, 2.0);
        assert_eq!(d["swap_out_bytes"], 0, "a measured zero stays a zero");
        assert_eq!(d["disk_written_bytes"], 4096);
        assert_eq!(d["model_page_cache_fraction"], 0.25);
    }
}
