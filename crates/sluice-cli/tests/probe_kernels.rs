//! `sluice probe --kernels --json`: one run prints memory and storage bandwidth, the thread
//! count, the ISA, the FMA peak and every kernel's rate in the shape issues 4 and 20 ask for,
//! with ratios that are consistent with the figures next to them; bad flags are refused with the cause named.
//! `sluice probe --io both` measures every read backend this kernel can run, once each.

use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("run the sluice binary")
}

fn positive(v: &serde_json::Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

#[test]
fn kernels_json_has_the_issue_shape() {
    let dir = tempfile::tempdir().expect("temp dir");
    // No --model or --file: storage is read from a temporary file in --scratch-dir.
    let o = sluice(&[
        "probe",
        "--kernels",
        "--json",
        "--threads",
        "2",
        "--seconds",
        "0",
        "--bytes",
        "32M",
        "--block",
        "4M",
        "--scratch-dir",
        dir.path().to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let memory = positive(&v["memory_read_gbps"], "memory_read_gbps");
    let storage = positive(&v["storage_read_gbps"], "storage_read_gbps");
    let peak = positive(&v["fma_peak_gflops"], "fma_peak_gflops");
    assert_eq!(v["threads"], 2);
    assert!(v["isa"].is_string());
    positive(&v["dispatch"]["serial_call_ns"], "serial call");
    assert!(v["dispatch_overhead_ns"].is_number());
    let kernels = v["kernels"].as_array().expect("kernels array");
    let mut seen = Vec::new();
    for k in kernels {
        let (format, rows) = (k["format"].as_str().expect("format"), k["rows"].as_u64());
        let gbps = positive(&k["gbps"], "gbps");
        let ratio = positive(&k["ratio_to_memory"], "ratio_to_memory");
        assert!((ratio - gbps / memory).abs() <= 1e-9 * ratio.max(1.0), "{k}");
        let gflops = positive(&k["gflops"], "gflops");
        let vs_peak = positive(&k["ratio_to_fma_peak"], "ratio_to_fma_peak");
        assert!((vs_peak - gflops / peak).abs() <= 1e-9 * vs_peak.max(1.0), "{k}");
        let r = positive(&k["ratio_to_storage"], "ratio_to_storage");
        assert!((r - gbps / storage).abs() <= 1e-9 * r.max(1.0), "{k}");
        let layout = k["layout"].as_str().expect("layout");
        seen.push((format.to_owned(), layout.to_owned(), rows.expect("rows")));
    }
    let lines = [
        ("int8", "dense"),
        ("bf16", "dense"),
        ("f32", "dense"),
        ("mxfp4", "k3"),
        ("mxfp4", "gpt-oss"),
        ("fp8", "deepseek-v3"),
        ("int4", "kimi-k2"),
    ];
    for (format, layout) in lines {
        for rows in [1, 8, 64, 256] {
            let line = (format.to_owned(), layout.to_owned(), rows);
            assert!(seen.contains(&line), "{format} {layout} T={rows} in {seen:?}");
        }
    }
    assert_eq!(seen.len(), 28);
    // The temporary storage file is gone.
    assert_eq!(std::fs::read_dir(dir.path()).expect("read dir").count(), 0);
}

#[test]
fn bad_kernel_flags_are_named() {
    let o = sluice(&["probe", "--kernels", "--threads", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--threads"));
    let o = sluice(&["probe", "--kernels", "--seconds=-1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--seconds"));
    let o = sluice(&["probe"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--model"));
}

#[test]
fn io_both_measures_every_usable_backend_once() {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    let block: Vec<u8> = (0..1u32 << 20).map(|i| u8::try_from(i % 251).expect("byte")).collect();
    for _ in 0..4 {
        f.write_all(&block).expect("write");
    }
    f.as_file().sync_all().expect("sync");
    let path = f.path().to_str().expect("utf-8 path");
    let o = sluice(&["probe", "--file", path, "--io", "both", "--json", "--block", "1M"]);
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let ran: Vec<&str> = v["storage_by_backend"]
        .as_array()
        .expect("storage_by_backend array")
        .iter()
        .map(|s| {
            assert_eq!(s["bytes"], 4u64 << 20, "{s}");
            s["backend"].as_str().expect("backend name")
        })
        .collect();
    let usable: Vec<&str> = sluice_store::IoBackend::usable().iter().map(|b| b.name()).collect();
    assert_eq!(ran, usable);
    assert_eq!(v["storage"]["backend"], usable[0]);
}
