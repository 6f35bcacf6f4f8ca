//! Random corruption of a valid shard never panics: opening returns `Ok` or `Err`, and when
//! it returns `Ok` every tensor's bytes are readable.

mod common;

use std::sync::OnceLock;

use common::{f32_bytes, text_config, write_config};
use proptest::prelude::*;
use sluice_checkpoint::{parse_header, write_safetensors, Checkpoint, TensorData};
use sluice_core::DType;

/// A valid three-tensor file (built once).
fn valid_file() -> Vec<u8> {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(build_valid_file).clone()
}

fn build_valid_file() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.safetensors");
    let a = f32_bytes(6);
    let b = f32_bytes(2);
    write_safetensors(
        &path,
        &[
            TensorData { name: "layers.0.w", dtype: DType::F32, shape: &[2, 3], data: &a },
            TensorData { name: "layers.0.b", dtype: DType::BF16, shape: &[4], data: &b },
            TensorData { name: "layers.1.s", dtype: DType::U8, shape: &[], data: &[9] },
        ],
        Some(&[("format".to_owned(), "pt".to_owned())].into()),
    )
    .expect("write");
    std::fs::read(&path).expect("read")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_header_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = valid_file();
        let header_end = header_end(&bytes);
        for (at, value) in edits {
            let i = at.index(header_end);
            bytes[i] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check(&bytes)?;
    }

    #[test]
    fn mutated_numbers_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), b'0'..=b'9'), 1..4),
    ) {
        // Changing only digits keeps the JSON valid, so the edits reach the shape, offset and
        // length checks instead of stopping at the JSON parser.
        let mut bytes = valid_file();
        let digits: Vec<usize> = (8..header_end(&bytes)).filter(|&i| bytes[i].is_ascii_digit()).collect();
        for (at, value) in edits {
            bytes[digits[at.index(digits.len())]] = value;
        }
        check(&bytes)?;
    }
}

/// End of the header of a valid file.
fn header_end(bytes: &[u8]) -> usize {
    8 + usize::try_from(u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))).expect("fits")
}

/// Parses `bytes` directly and through `Checkpoint::open`; on success every range must fit.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = std::path::Path::new("fuzz.safetensors");
    if let Ok(header) = parse_header(path, bytes) {
        for t in &header.tensors {
            prop_assert!(t.data_start + t.len <= bytes.len() as u64);
        }
    }

    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write");
    if let Ok(ckpt) = Checkpoint::open(dir.path()) {
        for t in ckpt.tensors() {
            prop_assert_eq!(ckpt.bytes(t).len() as u64, t.len);
        }
    }
    Ok(())
}
