//! The tokenizers `sluice synth` writes for synthetic slices: with `--tokenizer trained`, a
//! slice's tokenizer encodes text exactly as the built-in mini-K3's does (its 8,192 trained
//! ranks keep their ids, fillers follow, K3's specials sit after the ranks), so workloads sized
//! in mini-K3 tokens keep their size on a slice; the synthetic tokenizer takes far more tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_engine::demo::{trained_ranks, write_tokenizer_files, write_trained_tokenizer_files};
use sluice_tokenizer::Tokenizer;
use std::path::PathBuf;

fn mini_k3() -> Tokenizer {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/mini-k3");
    Tokenizer::from_dir(dir).unwrap()
}

/// A paragraph of the repository's own docs: the kind of text mini-K3's ranks were trained on.
const TEXT: &str = include_str!("../../../docs/ARCHITECTURE.md");

#[test]
fn a_trained_slice_tokenizer_encodes_as_mini_k3_does() {
    let dir = tempfile::tempdir().unwrap();
    write_trained_tokenizer_files(dir.path(), 32_768).unwrap();
    let slice = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(slice.num_ranks(), 32_768);
    let mini = mini_k3();
    let text = &TEXT[..TEXT.len().min(20_000)];
    let want = mini.encode_ordinary(text);
    assert_eq!(slice.encode_ordinary(text), want);
    assert_eq!(slice.decode(&want).unwrap(), text.as_bytes());
    // K3's specials follow the ranks, whatever their number.
    assert_eq!(slice.special_id("<|end_of_msg|>"), Some(32_768 + 2));

    // The synthetic tokenizer spends far more tokens on the same text.
    let synth_dir = tempfile::tempdir().unwrap();
    write_tokenizer_files(synth_dir.path(), 32_768).unwrap();
    let synthetic = Tokenizer::from_dir(synth_dir.path()).unwrap();
    let n = synthetic.encode_ordinary(text).len();
    assert!(n > 2 * want.len(), "synthetic {n} tokens, trained {}", want.len());
}

#[test]
fn trained_ranks_are_unique_and_exactly_as_many_as_asked() {
    for n in [256, 1000, 8192, 9000] {
        let r = trained_ranks(n);
        assert_eq!(r.len(), n);
        let unique: std::collections::HashSet<_> = r.iter().collect();
        assert_eq!(unique.len(), n, "{n} ranks");
    }
    // A prefix of mini-K3's table: a smaller slice keeps the first ranks' ids.
    assert_eq!(trained_ranks(300)[..], trained_ranks(9000)[..300]);
}
