//! End-to-end conversions of the committed Kimi K3 fixtures (`tests/fixtures/kimi_k3/tiny-a`
//! and `tiny-b`, copied to a temporary directory first): every quantized element within half
//! a step of its source, everything else byte-identical, the manifest true to the files,
//! determinism, resume, and refusal of corrupt or unsuitable sources.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use sluice_core::{bf16_to_f32, f16_to_f32, DType};

use super::manifest::JOURNAL_FILE;
use super::*;
use crate::{write_json_atomic, Checkpoint};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3").join(name)
}

/// A copy of fixture `name` in `root/src`.
fn source(root: &Path, name: &str) -> PathBuf {
    let dir = root.join("src");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for entry in std::fs::read_dir(fixture(name)).expect("fixture dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy fixture file");
    }
    dir
}

/// Converts, checking that progress is monotonic and ends at its total.
fn convert(src: &Path, dst: &Path, opts: &ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let mut calls: Vec<(u64, u64)> = Vec::new();
    let report = convert_spine_int8(src, dst, opts, |d, t| calls.push((d, t)))?;
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1), "monotonic");
    let last = calls.last().copied().expect("progress was reported");
    assert_eq!(last.0, last.1, "progress ends at the total");
    Ok(report)
}

/// Every file of `dir` (name → bytes).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read"))
        })
        .collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn fixtures_convert_within_half_a_step() {
    for name in ["tiny-a", "tiny-b"] {
        let root = tmp();
        let src = source(root.path(), name);
        let dst = root.path().join("out");
        let report = convert(&src, &dst, &ConvertOptions::default()).expect("convert");
        assert_eq!(report.files_reused, 0);
        let (a, b) =
            (Checkpoint::open(&src).expect("source"), Checkpoint::open(&dst).expect("output"));
        let mut quantized = Vec::new();
        for e in a.tensors() {
            let got = b.tensor(&e.name).expect("every tensor is in the output");
            if keeps_full_precision(&e.name) {
                assert_eq!((got.dtype, &got.shape), (e.dtype, &e.shape), "{}", e.name);
                assert_eq!(b.bytes(got), a.bytes(e), "{} copied unchanged", e.name);
                continue;
            }
            quantized.push(e.name.clone());
            let scale = b
                .expect(&format!("{}_scale", e.name), DType::F16, &e.shape[..1])
                .expect("scale tensor");
            assert_eq!((got.dtype, &got.shape), (DType::I8, &e.shape), "{}", e.name);
            let cols = usize::try_from(e.shape[1]).expect("small");
            let (q, s, x) = (b.bytes(got), b.bytes(scale), a.bytes(e));
            for (i, (&qi, xb)) in q.iter().zip(x.chunks_exact(2)).enumerate() {
                let r = i / cols;
                let s = f16_to_f32(u16::from_le_bytes([s[2 * r], s[2 * r + 1]]));
                let x = bf16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
                let deq = f32::from(i8::from_le_bytes([qi])) * s;
                let err = (f64::from(deq) - f64::from(x)).abs();
                assert!(
                    err <= f64::from(s) * 0.5 * (1.0 + 1e-6),
                    "{} [{r}]: {x} → {deq} (scale {s})",
                    e.name
                );
            }
        }
        assert!(quantized.iter().any(|n| n.ends_with("lm_head.weight")));
        assert!(quantized.iter().any(|n| n.ends_with("routed_expert_up_proj.weight")));
        assert!(!quantized.iter().any(|n| n.ends_with("embed_tokens.weight")));
        assert_eq!(report.tensors_quantized, quantized.len());

        // The manifest lists every output file (itself and the journal aside) with its hash,
        // and every source file read.
        let m = Int8Manifest::read(&report.manifest).expect("manifest");
        quantized.sort();
        assert_eq!(m.quantized, quantized);
        let listed: Vec<&str> = m.output.iter().map(|f| f.name.as_str()).collect();
        let mut on_disk: Vec<String> =
            files(&dst).into_keys().filter(|n| n != MANIFEST_FILE && n != JOURNAL_FILE).collect();
        on_disk.sort();
        assert_eq!(listed, on_disk);
        for (dir, records) in [(&dst, &m.output), (&src, &m.source)] {
            for f in records {
                let (size, sha) = hash_file(&dir.join(&f.name)).expect("hash");
                assert_eq!((size, sha.as_str()), (f.size, f.sha256.as_str()), "{}", f.name);
            }
        }
        for copied in ["config.json", "tiktoken.model", "tokenizer_config.json", "golden.json"] {
            assert_eq!(
                std::fs::read(dst.join(copied)).ok(),
                std::fs::read(src.join(copied)).ok(),
                "{copied}"
            );
        }
    }
}

#[test]
fn same_bytes_every_run() {
    let root = tmp();
    let src = source(root.path(), "tiny-b");
    let (one, two) = (root.path().join("one"), root.path().join("two"));
    convert(&src, &one, &ConvertOptions::default()).expect("first");
    convert(&src, &two, &ConvertOptions::default()).expect("second");
    assert_eq!(files(&one), files(&two));
}

#[test]
fn resumes_skipping_finished_files() {
    let root = tmp();
    let src = source(root.path(), "tiny-a");
    let (dst, fresh) = (root.path().join("out"), root.path().join("fresh"));
    let opts = ConvertOptions::default();
    let first = convert(&src, &dst, &opts).expect("first run");
    convert(&src, &fresh, &opts).expect("reference run");
    // An interruption: the manifest not yet written, one shard missing, one half-written
    // temporary, one output damaged after the fact.
    std::fs::remove_file(dst.join(MANIFEST_FILE)).expect("rm manifest");
    std::fs::remove_file(dst.join("model-00002-of-000003.safetensors")).expect("rm shard");
    std::fs::write(dst.join("model-00002-of-000003.safetensors.converting"), b"junk")
        .expect("junk");
    let third = dst.join("model-00003-of-000003.safetensors");
    let mut bytes = std::fs::read(&third).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&third, bytes).expect("damage");
    let again = convert(&src, &dst, &opts).expect("resumed run");
    assert_eq!(again.files_written, 2, "{again:?}");
    assert_eq!(again.files_reused, first.files_written - 2);
    assert_eq!(files(&dst), files(&fresh));
    // A complete directory reconverts nothing.
    let third_run = convert(&src, &dst, &opts).expect("rerun");
    assert_eq!(third_run.files_written, 0);
    assert_eq!(files(&dst), files(&fresh));
}

#[test]
fn embeddings_on_request_and_options_invalidate_the_journal() {
    let root = tmp();
    let src = source(root.path(), "tiny-a");
    let dst = root.path().join("out");
    let plain = convert(&src, &dst, &ConvertOptions::default()).expect("plain");
    let with = convert(&src, &dst, &ConvertOptions { embeddings: true }).expect("with embeddings");
    assert_eq!(with.files_reused, 0, "other options reuse nothing");
    assert_eq!(with.tensors_quantized, plain.tensors_quantized + 1);
    let out = Checkpoint::open(&dst).expect("output");
    let embed = "language_model.model.embed_tokens.weight";
    assert_eq!(out.tensor(embed).expect("embeddings").dtype, DType::I8);
    assert!(Int8Manifest::read(&dst.join(MANIFEST_FILE)).expect("manifest").options.embeddings);
}

/// Writes a `sluice-install.json` listing the source's files with their real sizes and
/// hashes, then lets `edit` change the entry for `victim`.
fn install_manifest(src: &Path, victim: &str, edit: impl Fn(&mut serde_json::Value)) {
    let mut list = Vec::new();
    for (name, bytes) in files(src).into_iter().filter(|(n, _)| n != INSTALL_MANIFEST) {
        let sha = digest::hex(&Sha256::digest(&bytes));
        let mut f = json!({"path": name, "size": bytes.len(), "sha256": sha, "state": "full"});
        if name == victim {
            edit(&mut f);
        }
        list.push(f);
    }
    let doc = json!({"format": 1, "complete": true, "files": list});
    write_json_atomic(&src.join(INSTALL_MANIFEST), &doc).expect("install manifest");
}

#[test]
fn refuses_corrupt_or_unsuitable_sources() {
    let shard = "model-00002-of-000003.safetensors";
    let opts = ConvertOptions::default();

    // A consistent install manifest converts; a wrong hash, size or state is refused.
    let root = tmp();
    let src = source(root.path(), "tiny-a");
    install_manifest(&src, shard, |_| {});
    convert(&src, &root.path().join("ok"), &opts).expect("verified source");
    install_manifest(&src, shard, |f| f["sha256"] = json!("00".repeat(32)));
    let dst = root.path().join("bad-sha");
    let err = convert(&src, &dst, &opts).expect_err("wrong sha256");
    assert!(matches!(&err, ConvertError::SourceMismatch { what: "sha256", .. }), "{err}");
    assert!(err.to_string().contains(shard), "{err}");
    assert!(!dst.join(shard).exists() && !dst.join(MANIFEST_FILE).exists());
    install_manifest(&src, shard, |f| f["size"] = json!(1));
    let err = convert(&src, &root.path().join("bad-size"), &opts).expect_err("wrong size");
    assert!(matches!(err, ConvertError::SourceMismatch { what: "size", .. }), "{err}");
    install_manifest(&src, shard, |f| f["state"] = json!("stream"));
    let err = convert(&src, &root.path().join("stream"), &opts).expect_err("stream install");
    assert!(matches!(err, ConvertError::BadManifest { .. }), "{err}");
    std::fs::remove_file(src.join(INSTALL_MANIFEST)).expect("rm install manifest");

    // A truncated shard fails the header checks, naming the file.
    let root = tmp();
    let src = source(root.path(), "tiny-a");
    let len = std::fs::metadata(src.join(shard)).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(src.join(shard))
        .expect("open")
        .set_len(len - 100)
        .expect("truncate");
    let err = convert(&src, &root.path().join("out"), &opts).expect_err("truncated shard");
    assert!(matches!(err, ConvertError::Checkpoint(_)) && err.to_string().contains(shard), "{err}");

    // Converting into the source, converting a converted directory, another architecture.
    let root = tmp();
    let src = source(root.path(), "tiny-b");
    let err = convert(&src, &src, &opts).expect_err("in place");
    assert!(matches!(err, ConvertError::SameDirectory { .. }), "{err}");
    let out = root.path().join("out");
    convert(&src, &out, &opts).expect("convert");
    let err = convert(&out, &root.path().join("twice"), &opts).expect_err("already converted");
    assert!(matches!(err, ConvertError::AlreadyConverted { .. }), "{err}");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("json");
    config["architectures"] = json!(["LlamaForCausalLM"]);
    write_json_atomic(&src.join("config.json"), &config).expect("rewrite config");
    let err = convert(&src, &root.path().join("qwen"), &opts).expect_err("no roster");
    assert!(matches!(err, ConvertError::Unsupported { .. }), "{err}");
}
