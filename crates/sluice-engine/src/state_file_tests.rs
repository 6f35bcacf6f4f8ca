//! State files in chunks: the bytes do not depend on the thread count, a restored snapshot is
//! the one written, and a damaged chunk is refused by its index.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use sluice_kernels::pool::Pool;
use sluice_models::kimi_k3::{config::K3Config, state::K3State, synth::K3Dims};
use sluice_models::State;

/// Chunks of this size cut a 6.7 MB state into about a hundred.
const SMALL: usize = 64 << 10;

/// A K3 state at the published widths with one KDA and one MLA layer (6.7 MB).
fn snapshot(positions: usize) -> (StateSnapshot, StateShape) {
    let cfg = K3Config::from_json(&K3Dims::k3_slice(2, 8, 64).text_config()).unwrap();
    let s = State::new("kimi_k3", K3State::synthetic(&cfg, positions, 5));
    (s.snapshot(None), s.shape())
}

fn encoded(s: &StateSnapshot) -> Vec<u8> {
    let mut v = Vec::new();
    s.encode(&mut v).unwrap();
    v
}

#[test]
fn the_chunk_layout_does_not_depend_on_the_thread_count() {
    let (snap, shape) = snapshot(300);
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..300).collect();
    let logits: Vec<f32> = (0..64u8).map(f32::from).collect();
    let fp = [7u8; 32];
    let mut files = Vec::new();
    for threads in [1, 3] {
        let path = dir.path().join(format!("{threads}.state"));
        let pool = Pool::new(threads).unwrap();
        let n = pool
            .install(|| write_chunked(&path, &fp, &tokens, Some(&logits), &snap, SMALL))
            .unwrap();
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        files.push(std::fs::read(&path).unwrap());
    }
    assert!(files[0] == files[1], "the same bytes with 1 and 3 threads");
    let want = Expect {
        fingerprint: &fp,
        key: prefix_key(&fp, &tokens),
        tokens: &tokens,
        shape: &shape,
        vocab: 64,
    };
    for threads in [1, 2] {
        let c = Pool::new(threads)
            .unwrap()
            .install(|| read_file(&dir.path().join("3.state"), &want))
            .map_err(|e| e.to_string())
            .unwrap();
        assert!(encoded(&c.snap) == encoded(&snap), "{threads} threads: the state written");
        assert_eq!(c.logits.as_deref(), Some(&logits[..]));
    }
    // The default chunk size writes the size `file_len` announces.
    let path = dir.path().join("default.state");
    let n = write_file(&path, &fp, &tokens, None, &snap).unwrap();
    assert_eq!(n, file_len(tokens.len(), None, &snap));
    assert_eq!(n, std::fs::metadata(&path).unwrap().len());
}

#[test]
fn a_corrupt_chunk_is_refused_by_its_index() {
    let (snap, shape) = snapshot(40);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.state");
    let tokens: Vec<u32> = (0..40).collect();
    let fp = [9u8; 32];
    write_chunked(&path, &fp, &tokens, None, &snap, SMALL).unwrap();
    let good = std::fs::read(&path).unwrap();
    let want = Expect {
        fingerprint: &fp,
        key: prefix_key(&fp, &tokens),
        tokens: &tokens,
        shape: &shape,
        vocab: 64,
    };
    let body = u64::from_le_bytes(good[92..100].try_into().unwrap());
    let chunks = usize::try_from(body.div_ceil(SMALL as u64)).unwrap();
    assert!(chunks > 50, "{chunks} chunks");
    for k in [0, 1, chunks / 2, chunks - 1] {
        let mut bad = good.clone();
        bad[HEADER_LEN + k * SMALL + 100] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        match read_file(&path, &want) {
            Err(e @ Refusal::Checksum { chunk, .. }) => {
                assert_eq!(chunk, k as u64);
                assert!(e.to_string().starts_with(&format!("chunk {k} of ")), "{e}");
            }
            Err(e) => panic!("chunk {k}: refused for another reason: {e}"),
            Ok(_) => panic!("chunk {k}: a corrupt file was used"),
        }
    }
    // A damaged chunk table is caught by the trailer before any chunk is read.
    let mut bad = good.clone();
    let at = bad.len() - 40;
    bad[at] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    assert!(matches!(read_file(&path, &want), Err(Refusal::TableChecksum)));
    // A header that declares another body length no longer matches the file's size.
    let mut bad = good;
    bad[92] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    assert!(matches!(read_file(&path, &want), Err(Refusal::Truncated | Refusal::Trailing(_))));
}
