//! The random-weight demo model: a tiny Kimi K3 in the published layout with **random weights**
//! and a small byte-level rank-BPE tokenizer, written deterministically. `run` and `serve` no
//! longer use it (their built-in model is the trained mini-K3, [`crate::builtin`]); it remains
//! for `sluice synth --preset demo` and for tests that need random weights. Its output is
//! meaningless by design.

use base64::Engine as _;
use serde_json::{json, Value};
use sluice_models::kimi_k3::synth::{release_config, write_checkpoint, K3Dims};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Directory name of the demo model inside the cache (bump the version when its bytes change).
pub const DEMO_NAME: &str = "demo-kimi-k3-v3";
/// Seed of the demo weights.
pub const DEMO_SEED: u64 = 0x5151_1CE0;
/// Ranks of the demo tokenizer (256 bytes + learned merges).
const DEMO_RANKS: usize = 512;
/// Marker written last: a directory without it is incomplete and is rebuilt.
const COMPLETE: &str = ".sluice-complete";

/// Text the demo tokenizer's merges are learned from.
pub const CORPUS: &str = "sluice runs mixture-of-experts language models that are far larger than \
the memory of the machine. It keeps the spine of the model resident and streams the routed \
experts that each position selects from the disk, while the full target model decides every \
token. The quick brown fox jumps over the lazy dog. Hello, world! What is the capital of \
France? The capital of France is Paris. Once upon a time, there was a little model that \
wanted to be exact. It read its experts from the disk, one layer at a time, and it never \
skipped a single one. Numbers: 1, 2, 3, 10, 100, 1000, 2026. Code: fn main() { println!(\"hi\"); }";

/// The demo's text config: K3's structure (KDA + MLA layers, AttnRes blocks, dense layer 0,
/// latent MoE with MXFP4 experts, last layer MLA) at toy widths.
pub fn demo_text_config(vocab_size: usize) -> Value {
    K3Dims {
        vocab: vocab_size,
        hidden: 128,
        layers: 7,
        kda_layers: vec![1, 2, 3, 5, 6],
        heads: 4,
        kda_head_dim: 32,
        intermediate: 256,
        attn_res_block: 3,
        q_lora: 64,
        kv_lora: 32,
        qk_nope: 32,
        qk_rope: 16,
        v_head: 32,
        dense_layers: 1,
        experts: 32,
        top_k: 4,
        moe_intermediate: 64,
        expert_hidden: 64,
    }
    .text_config()
}

/// Learns `merges` byte-pair merges over `text` (words split before spaces; most frequent pair
/// first, ties broken by the smaller pair) and returns the rank table: 256 single bytes, then
/// one token per merge.
pub fn train_byte_bpe(text: &str, merges: usize) -> Vec<Vec<u8>> {
    let mut ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut words: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut cur = String::new();
    for ch in text.chars() {
        if ch == ' ' && !cur.is_empty() {
            words.push(cur.bytes().map(|b| vec![b]).collect());
            cur.clear();
        }
        cur.push(ch);
    }
    if !cur.is_empty() {
        words.push(cur.bytes().map(|b| vec![b]).collect());
    }
    for _ in 0..merges {
        let mut counts: BTreeMap<(Vec<u8>, Vec<u8>), usize> = BTreeMap::new();
        for w in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += 1;
            }
        }
        let Some((best, _)) = counts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else {
            break;
        };
        let (a, b) = best.clone();
        let merged: Vec<u8> = [a.as_slice(), b.as_slice()].concat();
        if ranks.contains(&merged) {
            break;
        }
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == a && w[i + 1] == b {
                    w[i] = merged.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        ranks.push(merged);
    }
    ranks
}

/// K3's reserved special spellings at their offsets from the first special id.
pub fn k3_special_tokens() -> Vec<String> {
    (0..256)
        .map(|i| match i {
            0 => "[BOS]".into(),
            1 => "[EOS]".into(),
            2 => "<|end_of_msg|>".into(),
            3 => "<|open|>".into(),
            4 => "<|close|>".into(),
            5 => "<|sep|>".into(),
            6 => "[start_header_id]".into(),
            7 => "[end_header_id]".into(),
            9 => "[EOT]".into(),
            18 => "<|media_begin|>".into(),
            19 => "<|media_content|>".into(),
            20 => "<|media_end|>".into(),
            21 => "<|media_pad|>".into(),
            254 => "[UNK]".into(),
            255 => "[PAD]".into(),
            _ => format!("<|reserved_token_{i}|>"),
        })
        .collect()
}

/// A rank table of exactly `n` tokens (n ≥ 256): the 256 bytes, merges learned over
/// [`CORPUS`], then unique filler tokens (never formed by a merge) up to `n`.
pub fn synthetic_ranks(n: usize) -> Vec<Vec<u8>> {
    fill_ranks(train_byte_bpe(CORPUS, n.saturating_sub(256).min(512)), n)
}

/// The built-in mini-K3's `tiktoken.model`: 8,192 byte-level BPE ranks trained on 64 MB of
/// documentation and source code (issue 17), the tokenizer the workload suite's prompts are
/// sized in ("about 8k mini-K3 tokens").
const TRAINED_TIKTOKEN: &str =
    include_str!("../../../tests/fixtures/kimi_k3/mini-k3/tiktoken.model");

/// A rank table of exactly `n` tokens (n ≥ 256): mini-K3's trained ranks (the first `n` of its
/// 8,192 when `n` is smaller: a prefix of a BPE rank table is one), then unique filler tokens
/// up to `n`. A synthetic slice written with it tokenizes text as a trained tokenizer does
/// (mini-K3's agent session is 3,120 tokens, against 7,637 with [`synthetic_ranks`]).
pub fn trained_ranks(n: usize) -> Vec<Vec<u8>> {
    let ranks = TRAINED_TIKTOKEN
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("the committed mini-K3 tiktoken.model is valid base64")
        })
        .take(n.max(256))
        .collect();
    fill_ranks(ranks, n)
}

/// `ranks`, then unique filler tokens (never formed by a merge) up to `n`, at most `n`.
fn fill_ranks(mut ranks: Vec<Vec<u8>>, n: usize) -> Vec<Vec<u8>> {
    let mut seen: std::collections::HashSet<Vec<u8>> = ranks.iter().cloned().collect();
    let mut i = 0usize;
    while ranks.len() < n {
        let tok = format!("\u{1}filler{i}").into_bytes();
        if seen.insert(tok.clone()) {
            ranks.push(tok);
        }
        i += 1;
    }
    ranks.truncate(n.max(256));
    ranks
}

/// Writes `tiktoken.model` (a [`synthetic_ranks`] table of `n` ranks) and a
/// `tokenizer_config.json` with K3's 256 reserved specials at ids `n..n + 256`.
pub fn write_tokenizer_files(dir: &Path, n: usize) -> std::io::Result<()> {
    write_tokenizer(dir, &synthetic_ranks(n))
}

/// As [`write_tokenizer_files`], with mini-K3's trained ranks ([`trained_ranks`]).
pub fn write_trained_tokenizer_files(dir: &Path, n: usize) -> std::io::Result<()> {
    write_tokenizer(dir, &trained_ranks(n))
}

fn write_tokenizer(dir: &Path, ranks: &[Vec<u8>]) -> std::io::Result<()> {
    let mut model = String::new();
    for (i, tok) in ranks.iter().enumerate() {
        model.push_str(&base64::engine::general_purpose::STANDARD.encode(tok));
        model.push(' ');
        model.push_str(&i.to_string());
        model.push('\n');
    }
    std::fs::write(dir.join("tiktoken.model"), model)?;
    let n = ranks.len();
    let mut added = serde_json::Map::new();
    for (i, s) in k3_special_tokens().into_iter().enumerate() {
        added.insert(
            (n + i).to_string(),
            json!({"content": s, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}),
        );
    }
    let cfg = json!({
        "added_tokens_decoder": added,
        "bos_token": "[BOS]",
        "eos_token": "<|end_of_msg|>",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "tokenizer_class": "TikTokenTokenizer",
        "model_max_length": 1048576
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec_pretty(&cfg).map_err(std::io::Error::other)?,
    )
}

/// The default cache directory: `$SLUICE_CACHE`, else `$XDG_CACHE_HOME/sluice`, else
/// `~/.cache/sluice`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("sluice");
    }
    std::env::var_os("HOME")
        .map_or_else(|| PathBuf::from(".sluice-cache"), |h| PathBuf::from(h).join(".cache/sluice"))
}

/// Returns the demo model directory under `cache`, writing it first if it is absent or
/// incomplete. Writing goes to a temporary sibling that is renamed into place when complete.
pub fn ensure_demo_model(cache: &Path) -> Result<PathBuf, crate::EngineError> {
    let dir = cache.join(DEMO_NAME);
    if dir.join(COMPLETE).is_file() {
        return Ok(dir);
    }
    let io =
        |e: std::io::Error, p: &Path| crate::EngineError::Io { path: p.to_path_buf(), source: e };
    std::fs::create_dir_all(cache).map_err(|e| io(e, cache))?;
    remove_abandoned(cache, "demo-kimi-k3-", &[".tmp-"]).map_err(|e| io(e, cache))?;
    let tmp = cache.join(format!("{DEMO_NAME}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(e, &tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io(e, &tmp))?;
    let ranks = synthetic_ranks(DEMO_RANKS);
    let text = demo_text_config(ranks.len() + 256);
    let config = release_config(&text, ranks.len() as u64);
    write_checkpoint(&tmp, &config, &text, DEMO_SEED, ranks.len(), &mut |_, _| {})?;
    write_tokenizer(&tmp, &ranks).map_err(|e| io(e, &tmp))?;
    std::fs::write(
        tmp.join("generation_config.json"),
        format!("{{\"bos_token_id\": {}, \"eos_token_id\": {}}}\n", ranks.len(), ranks.len() + 2),
    )
    .map_err(|e| io(e, &tmp))?;
    std::fs::write(
        tmp.join("README.md"),
        "Random-weight demo model written by sluice. Its output is meaningless by design.\n",
    )
    .map_err(|e| io(e, &tmp))?;
    std::fs::write(tmp.join(COMPLETE), b"").map_err(|e| io(e, &tmp))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| io(e, &dir))?;
    }
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process finished first: use its copy.
        Err(_) if dir.join(COMPLETE).is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(io(e, &dir)),
    }
}

/// Removes the directories that processes no longer running left in `cache` when they were
/// interrupted while writing a model there: names `{prefix}…{marker}PID` for any of `markers`
/// (`.tmp-` for a half-written copy, `.bad-` for a damaged one set aside).
pub(crate) fn remove_abandoned(
    cache: &Path,
    prefix: &str,
    markers: &[&str],
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(cache)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name.strip_prefix(prefix).and_then(|rest| {
            markers
                .iter()
                .find_map(|m| rest.split_once(m))
                .and_then(|(_, pid)| pid.parse::<u32>().ok())
        });
        if owner.is_some_and(sluice_checkpoint::writer_is_gone) && entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}
