//! Checks that check (issue 13): `inspect`, `verify`, `convert` and `doctor` refuse what `run`
//! refuses; NaN/Inf in weights stop a run with the tensor named; interrupted writers leave no
//! debris after the next run; `probe` and shard opening refuse what they cannot measure or
//! read; error causes are printed once. Real processes on real files, each test named after
//! the defect it guards.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::sluice;
use sluice_checkpoint::{read_header, write_safetensors, TensorData};
use sluice_core::DType;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A fresh copy of the demo model (a tiny Kimi K3 in the published layout) under `root`.
fn demo(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let o = sluice(&["synth", "--preset", "demo", "--out", s(&dir)], root);
    assert!(o.status.success(), "synth: {}", err(&o));
    dir
}

/// The shard holding the tensor whose name ends with `suffix`, and the full name.
fn find(dir: &Path, suffix: &str) -> (PathBuf, String) {
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("model.safetensors.index.json")).expect("index"),
    )
    .expect("index JSON");
    let (name, file) = index["weight_map"]
        .as_object()
        .expect("weight_map")
        .iter()
        .find(|(k, _)| k.ends_with(suffix))
        .unwrap_or_else(|| panic!("no tensor ending {suffix}"));
    (dir.join(file.as_str().expect("file name")), name.clone())
}

/// Rewrites the shard holding `suffix`, letting `edit` change that tensor's name, dtype, shape
/// or bytes; renames are carried into the index.
fn rewrite(
    dir: &Path,
    suffix: &str,
    edit: impl FnOnce(&mut String, &mut DType, &mut Vec<u64>, &mut Vec<u8>),
) {
    let (path, target) = find(dir, suffix);
    let h = read_header(&path).expect("header");
    let bytes = std::fs::read(&path).expect("shard");
    let mut ts: Vec<(String, DType, Vec<u64>, Vec<u8>)> = h
        .tensors
        .iter()
        .map(|t| {
            let a = usize::try_from(t.data_start).unwrap();
            let b = a + usize::try_from(t.len).unwrap();
            (t.name.clone(), t.dtype, t.shape.clone(), bytes[a..b].to_vec())
        })
        .collect();
    let t = ts.iter_mut().find(|t| t.0 == target).expect("tensor in its shard");
    edit(&mut t.0, &mut t.1, &mut t.2, &mut t.3);
    let renamed = t.0.clone();
    let data: Vec<TensorData<'_>> = ts
        .iter()
        .map(|(name, dtype, shape, data)| TensorData { name, dtype: *dtype, shape, data })
        .collect();
    write_safetensors(&path, &data, Some(&h.metadata)).expect("rewrite shard");
    if renamed != target {
        let ip = dir.join("model.safetensors.index.json");
        let mut index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&ip).unwrap()).unwrap();
        let map = index["weight_map"].as_object_mut().unwrap();
        let file = map.remove(&target).unwrap();
        map.insert(renamed, file);
        std::fs::write(&ip, serde_json::to_vec(&index).unwrap()).unwrap();
    }
}

fn set_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}

/// The id of a process that has exited (for temporary names of a writer that was killed).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().expect("spawn true");
    let pid = c.id();
    c.wait().expect("wait");
    pid
}

/// `inspect`, `verify` and `run` on `dir`: all three must fail, each saying `why`.
fn all_refuse(dir: &Path, cache: &Path, why: &str) {
    for args in [
        vec!["inspect", s(dir)],
        vec!["verify", s(dir)],
        vec!["run", "--model", s(dir), "--prompt-ids", "1,2,3", "--max-new", "2"],
    ] {
        let o = sluice(&args, cache);
        let said = format!("{}{}", out(&o), err(&o));
        assert!(!o.status.success(), "{args:?} passed: {said}");
        assert!(said.contains(why), "{args:?} did not say {why:?}: {said}");
    }
}

#[test]
fn inspect_and_verify_passed_what_run_refuses() {
    let root = tempfile::tempdir().unwrap();
    let base = demo(root.path(), "base");
    let o = sluice(&["inspect", s(&base)], root.path());
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("32 per layer"), "{}", out(&o));
    assert!(sluice(&["verify", s(&base)], root.path()).status.success());

    // A config that contradicts its tensors: 64 experts named, 32 stored.
    let d = demo(root.path(), "experts64");
    set_config(&d, |c| c["text_config"]["num_experts"] = 64.into());
    all_refuse(&d, root.path(), "block_sparse_moe.experts.32.");

    // A missing tensor.
    let d = demo(root.path(), "missing");
    rewrite(&d, "layers.1.input_layernorm.weight", |name, _, _, _| {
        *name = name.replace("input_layernorm", "input_layernorn");
    });
    all_refuse(&d, root.path(), "layers.1.input_layernorm.weight");

    // A wrong dtype (same bytes) and a wrong shape (same bytes).
    let d = demo(root.path(), "dtype");
    rewrite(&d, "layers.1.self_attn.q_proj.weight", |_, dtype, _, _| *dtype = DType::F16);
    all_refuse(&d, root.path(), "q_proj.weight");
    let d = demo(root.path(), "shape");
    rewrite(&d, "layers.2.post_attention_layernorm.weight", |_, _, shape, _| {
        let n = shape[0];
        *shape = vec![2, n / 2];
    });
    all_refuse(&d, root.path(), "post_attention_layernorm.weight");
}

#[test]
fn inspect_described_a_llama_config_as_k3_layers() {
    let root = tempfile::tempdir().unwrap();
    let d = demo(root.path(), "llama");
    set_config(&d, |c| c["architectures"] = serde_json::json!(["LlamaForCausalLM"]));
    all_refuse(&d, root.path(), "LlamaForCausalLM");
}

#[test]
fn nan_weights_ran_to_exit_0_repeating_token_0() {
    let root = tempfile::tempdir().unwrap();
    // A NaN in a matrix the pass reads: the run stops at that layer, naming the tensor.
    let d = demo(root.path(), "nan-q");
    rewrite(&d, "layers.1.self_attn.q_proj.weight", |_, _, _, data| {
        data[..2].copy_from_slice(&0x7fc0u16.to_le_bytes());
    });
    let o =
        sluice(&["run", "--model", s(&d), "--prompt-ids", "1,2,3", "--max-new", "4"], root.path());
    assert!(!o.status.success(), "a NaN q_proj ran: {}", out(&o));
    let e = err(&o);
    assert!(e.contains("layer 1") && e.contains("layers.1.self_attn.q_proj.weight"), "{e}");
    assert!(e.contains("NaN"), "{e}");

    // An Inf in a vector read at load: refused before any pass, by run and by the checks.
    let d = demo(root.path(), "inf-norm");
    rewrite(&d, "layers.3.input_layernorm.weight", |_, dtype, _, data| {
        let inf: Vec<u8> = match dtype {
            DType::F32 => f32::INFINITY.to_le_bytes().to_vec(),
            _ => 0x7f80u16.to_le_bytes().to_vec(),
        };
        data[..inf.len()].copy_from_slice(&inf);
    });
    all_refuse(&d, root.path(), "layers.3.input_layernorm.weight holds +Inf");
}

#[test]
fn verify_passed_a_flipped_byte_in_a_converted_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let d = demo(root.path(), "src");
    let int8 = root.path().join("src-int8");
    let o = sluice(&["convert", "--spine", "int8", s(&d), "--out", s(&int8)], root.path());
    assert!(o.status.success(), "{}", err(&o));
    let o = sluice(&["verify", s(&int8)], root.path());
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    let (shard, _) = find(&int8, "layers.1.self_attn.q_proj.weight");
    let mut b = std::fs::read(&shard).unwrap();
    let at = b.len() - 100;
    b[at] ^= 1;
    std::fs::write(&shard, b).unwrap();
    let o = sluice(&["verify", s(&int8)], root.path());
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!o.status.success(), "a flipped byte passed: {}", out(&o));
    assert!(out(&o).contains(&format!("BAD  {name}: altered: SHA-256")), "{}", out(&o));
}

#[test]
fn convert_converted_an_invalid_source() {
    let root = tempfile::tempdir().unwrap();
    let d = demo(root.path(), "bad");
    rewrite(&d, "layers.2.self_attn.o_proj.weight", |name, _, _, _| {
        *name = name.replace("o_proj", "x_proj");
    });
    let dst = root.path().join("bad-int8");
    let o = sluice(&["convert", "--spine", "int8", s(&d), "--out", s(&dst)], root.path());
    assert!(!o.status.success(), "converted: {}", out(&o));
    assert!(err(&o).contains("layers.2.self_attn.o_proj.weight"), "{}", err(&o));
    assert!(!dst.exists(), "nothing is written for a refused source");
}

#[test]
fn doctor_called_a_plain_checkpoint_unhealthy() {
    let root = tempfile::tempdir().unwrap();
    let d = demo(root.path(), "plain");
    let o = sluice(&["doctor", s(&d)], root.path());
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    let text = out(&o);
    assert!(text.contains("verdict     healthy"), "{text}");
    let tiers = text.lines().find(|l| l.starts_with("kernels")).expect("kernels line");
    let list = tiers.split("(tiers ").nth(1).expect("tier list").trim_end_matches(')');
    let names: Vec<&str> = list.split(", ").collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "each tier once: {tiers}");
    // A broken plain checkpoint is a problem, named.
    rewrite(&d, "layers.1.input_layernorm.weight", |name, _, _, _| *name = format!("{name}x"));
    let o = sluice(&["doctor", s(&d)], root.path());
    assert!(!o.status.success());
    assert!(out(&o).contains("layers.1.input_layernorm.weight"), "{}", out(&o));
}

#[test]
fn interrupted_synth_convert_and_demo_left_debris() {
    let root = tempfile::tempdir().unwrap();
    let pid = dead_pid();
    let big = vec![7u8; 1 << 20];
    // synth: killed mid-shard, with no config.json yet; the same command finishes the job.
    let d = demo(root.path(), "synth");
    let tmp = d.join(format!(".model-00002-of-000008.safetensors.{pid}.0.tmp"));
    std::fs::write(&tmp, &big).unwrap();
    std::fs::remove_file(d.join("config.json")).unwrap();
    let o = sluice(&["synth", "--preset", "demo", "--out", s(&d)], root.path());
    assert!(o.status.success(), "synth refused its own output: {}", err(&o));
    assert!(err(&o).contains("MiB of tensors"), "says how much first: {}", err(&o));
    assert!(!tmp.exists() && d.join("config.json").is_file());
    assert!(sluice(&["verify", s(&d)], root.path()).status.success());
    // ...but not someone else's directory.
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let o = sluice(&["synth", "--preset", "demo", "--out", s(&other)], root.path());
    assert!(!o.status.success() && other.join("notes.txt").exists());

    // convert: killed mid-shard twice; the next run removes both.
    let dst = root.path().join("synth-int8");
    std::fs::create_dir(&dst).unwrap();
    let t1 = dst.join(format!(".model-00003-of-000008.safetensors.converting.{pid}.0.tmp"));
    let t2 = dst.join("model-00004-of-000008.safetensors.converting");
    std::fs::write(&t1, &big).unwrap();
    std::fs::write(&t2, &big).unwrap();
    let o = sluice(&["convert", "--spine", "int8", s(&d), "--out", s(&dst)], root.path());
    assert!(o.status.success(), "{}", err(&o));
    assert!(!t1.exists() && !t2.exists(), "convert left its temporary files");

    // The built-in model: killed while being written into its temporary directory.
    let cache = root.path().join("cache");
    let abandoned = cache.join(format!("mini-k3.tmp-{pid}"));
    std::fs::create_dir_all(&abandoned).unwrap();
    std::fs::write(abandoned.join("model-00001-of-000008.safetensors"), &big).unwrap();
    let o = sluice(&["run", "--prompt", "Hello", "--max-new", "2"], &cache);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        !abandoned.exists(),
        "the built-in model's abandoned temporary directory is still there"
    );
}

#[test]
fn probe_reported_0_gbps_for_small_files_and_devices() {
    let root = tempfile::tempdir().unwrap();
    let small = root.path().join("small");
    std::fs::write(&small, vec![0u8; 8192]).unwrap();
    let o = sluice(&["probe", "--file", s(&small)], root.path());
    assert!(!o.status.success(), "{}", out(&o));
    assert!(err(&o).contains("nothing to measure"), "{}", err(&o));
    let o = sluice(&["probe", "--file", "/dev/zero"], root.path());
    assert!(!o.status.success(), "{}", out(&o));
    assert!(err(&o).contains("not a regular file"), "{}", err(&o));
}

#[test]
fn a_fifo_shard_was_waited_on_forever() {
    let root = tempfile::tempdir().unwrap();
    let d = demo(root.path(), "fifo");
    let shard = d.join("model-00003-of-000008.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let made = Command::new("mkfifo").arg(&shard).status().expect("mkfifo");
    assert!(made.success());
    for args in [
        vec!["inspect", s(&d)],
        vec!["run", "--model", s(&d), "--prompt-ids", "1", "--max-new", "1"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(&args)
            .env("SLUICE_CACHE", root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The event is the process exiting, seen as the end of its stderr; the timeout only
        // keeps a regression from hanging the suite.
        let mut stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            let _ = tx.send(text);
        });
        let Ok(e) = rx.recv_timeout(Duration::from_secs(120)) else {
            let _ = child.kill();
            panic!("{args:?} is still waiting on the FIFO");
        };
        assert!(!child.wait().unwrap().success());
        assert!(e.contains("not a regular file (a FIFO)"), "{e}");
    }
}

#[test]
fn error_causes_were_printed_twice() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("missing");
    let o = sluice(&["probe", "--file", s(&missing)], root.path());
    let e = err(&o);
    assert!(!o.status.success());
    assert_eq!(e.matches("os error 2").count(), 1, "{e}");
    let o = sluice(&["inspect", s(&missing)], root.path());
    assert_eq!(err(&o).matches(s(&missing)).count(), 1, "{}", err(&o));
}
