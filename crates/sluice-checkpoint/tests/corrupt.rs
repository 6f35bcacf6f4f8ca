//! One test per malformed input: each must fail with its specific error variant, and the
//! message must name the file (and the tensor, where one is involved).

mod common;

use std::collections::BTreeMap;
use std::fs::OpenOptions;

use common::{crafted, f32_bytes, open_err, open_single, raw_file, text_config, write_config};
use sluice_checkpoint::{
    write_index, write_safetensors, Checkpoint, CheckpointError, TensorData, MAX_HEADER_LEN,
};
use sluice_core::DType;

#[test]
fn file_shorter_than_length_prefix() {
    let (err, _) = open_err(&[1, 2, 3]);
    assert!(matches!(err, CheckpointError::FileTooShort { len: 3, .. }), "{err:?}");
}

#[test]
fn header_length_zero() {
    let (err, _) = open_err(&raw_file(0, b"", b"{}"));
    assert!(matches!(err, CheckpointError::HeaderEmpty { .. }), "{err:?}");
}

#[test]
fn header_length_huge() {
    for n in [MAX_HEADER_LEN + 1, u64::MAX] {
        let (err, msg) = open_err(&raw_file(n, b"{}", b""));
        assert!(matches!(err, CheckpointError::HeaderTooLarge { len, .. } if len == n), "{err:?}");
        assert!(msg.contains(&n.to_string()), "{msg}");
    }
}

#[test]
fn header_length_past_end() {
    let (err, _) = open_err(&raw_file(4096, b"{}      ", b""));
    assert!(
        matches!(err, CheckpointError::HeaderPastEnd { len: 4096, file_len: 16, .. }),
        "{err:?}"
    );
}

#[test]
fn header_not_utf8() {
    let (err, _) = open_err(&raw_file(4, b"{\xff}\x20", b""));
    assert!(matches!(err, CheckpointError::HeaderNotUtf8 { valid_up_to: 1, .. }), "{err:?}");
}

#[test]
fn header_invalid_json_names_line_and_column() {
    let (err, msg) = open_err(&crafted("{\"w\" 12}", b""));
    assert!(matches!(err, CheckpointError::BadJson { .. }), "{err:?}");
    assert!(msg.contains("line 1 column"), "{msg}");
}

#[test]
fn header_not_an_object() {
    let (err, _) = open_err(&crafted("[1, 2]  ", b""));
    assert!(matches!(err, CheckpointError::BadStructure { .. }), "{err:?}");
}

#[test]
fn header_entry_missing_field_names_tensor() {
    let (err, msg) = open_err(&crafted(r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#, &[0; 4]));
    assert!(
        matches!(err, CheckpointError::BadEntry { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
    assert!(msg.contains("shape"), "{msg}");
}

#[test]
fn negative_shape_is_a_bad_entry() {
    let (err, _) =
        open_err(&crafted(r#"{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}"#, b""));
    assert!(
        matches!(err, CheckpointError::BadEntry { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
}

#[test]
fn metadata_not_a_string_map() {
    let (err, _) = open_err(&crafted(r#"{"__metadata__":{"format":["pt"]}}"#, b""));
    assert!(matches!(err, CheckpointError::BadMetadata { .. }), "{err:?}");
}

#[test]
fn unknown_dtype() {
    let (err, msg) =
        open_err(&crafted(r#"{"w":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,4]}}"#, &[0; 4]));
    assert!(
        matches!(err, CheckpointError::UnknownDType { ref tensor, ref dtype, .. } if tensor == "w" && dtype == "Q4_K"),
        "{err:?}"
    );
    assert!(msg.contains("\"w\""), "{msg}");
}

#[test]
fn offsets_past_end() {
    let (err, msg) =
        open_err(&crafted(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, &[0; 8]));
    assert!(matches!(err, CheckpointError::OffsetsPastEnd { end: 16, data_len: 8, .. }), "{err:?}");
    assert!(msg.contains("\"w\""), "{msg}");
}

#[test]
fn offsets_reversed() {
    let (err, _) =
        open_err(&crafted(r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}"#, &[0; 8]));
    assert!(matches!(err, CheckpointError::OffsetsReversed { begin: 8, end: 0, .. }), "{err:?}");
}

#[test]
fn overlapping_tensors() {
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#;
    let (err, msg) = open_err(&crafted(header, &[0; 24]));
    assert!(
        matches!(err, CheckpointError::Overlap { ref a, ref b, .. } if a == "a" && b == "b"),
        "{err:?}"
    );
    assert!(msg.contains("\"a\"") && msg.contains("\"b\""), "{msg}");
}

#[test]
fn tensor_nested_inside_a_long_tensor_overlaps() {
    // Neighbours "b" and "c" do not overlap each other; both lie inside "a".
    let header = r#"{"a":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"c":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}}"#;
    let (err, _) = open_err(&crafted(header, &[0; 32]));
    assert!(matches!(err, CheckpointError::Overlap { ref a, .. } if a == "a"), "{err:?}");
}

#[test]
fn gaps_and_empty_tensors_are_allowed() {
    let header = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"b":{"dtype":"U8","shape":[8],"data_offsets":[16,24]}}"#;
    let data: Vec<u8> = (0..40).collect();
    let (_dir, result) = open_single(&crafted(header, &data));
    let ckpt = result.expect("gaps are legal");
    assert_eq!(ckpt.bytes(ckpt.tensor("b").expect("b")), &data[16..24]);
}

#[test]
fn dtype_times_shape_differs_from_byte_length() {
    let (err, msg) =
        open_err(&crafted(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#, &[0; 16]));
    assert!(
        matches!(err, CheckpointError::LengthMismatch { expected: 12, got: 16, .. }),
        "{err:?}"
    );
    assert!(msg.contains("\"w\""), "{msg}");
}

#[test]
fn shape_product_overflow() {
    let header = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#;
    let (err, msg) = open_err(&crafted(header, b""));
    assert!(
        matches!(err, CheckpointError::ShapeOverflow { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
    assert!(msg.contains("4294967296"), "{msg}");
}

#[test]
fn duplicate_key_in_one_header() {
    let header = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    let (err, _) = open_err(&crafted(header, &[0; 2]));
    assert!(
        matches!(err, CheckpointError::DuplicateTensor { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
}

#[test]
fn truncated_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    let path = dir.path().join("model.safetensors");
    let data = f32_bytes(16);
    write_safetensors(
        &path,
        &[TensorData { name: "w", dtype: DType::F32, shape: &[16], data: &data }],
        None,
    )
    .expect("write");
    let len = std::fs::metadata(&path).expect("stat").len();
    OpenOptions::new().write(true).open(&path).expect("open").set_len(len - 3).expect("truncate");
    let err = Checkpoint::open(dir.path()).expect_err("truncated");
    assert!(
        matches!(err, CheckpointError::OffsetsPastEnd { end: 64, data_len: 61, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("model.safetensors") && err.to_string().contains("\"w\""),
        "{err}"
    );
}

/// Writes a two-shard checkpoint and returns its directory; `edit` may change the weight map.
fn two_shards(edit: impl FnOnce(&mut BTreeMap<String, String>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    let mut map = BTreeMap::new();
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let file = format!("model-{:05}-of-000002.safetensors", i + 1);
        write_safetensors(
            &dir.path().join(&file),
            &[TensorData { name, dtype: DType::U8, shape: &[2], data: &[1, 2] }],
            None,
        )
        .expect("write shard");
        map.insert(name.to_owned(), file);
    }
    edit(&mut map);
    write_index(dir.path(), &map, 4).expect("write index");
    dir
}

#[test]
fn missing_shard() {
    let dir = two_shards(|_| {});
    std::fs::remove_file(dir.path().join("model-00002-of-000002.safetensors")).expect("rm");
    let err = Checkpoint::open(dir.path()).expect_err("missing shard");
    assert!(
        matches!(err, CheckpointError::MissingShard { ref shard, ref tensor_example, .. }
            if shard == "model-00002-of-000002.safetensors" && tensor_example == "b"),
        "{err:?}"
    );
    assert!(err.to_string().contains("model-00002-of-000002.safetensors"), "{err}");
}

#[test]
fn index_names_tensor_absent_from_its_shard() {
    let dir = two_shards(|map| {
        map.insert("ghost".to_owned(), "model-00001-of-000002.safetensors".to_owned());
    });
    let err = Checkpoint::open(dir.path()).expect_err("ghost tensor");
    assert!(
        matches!(err, CheckpointError::TensorNotInShard { ref tensor, .. } if tensor == "ghost"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("ghost") && msg.contains("model-00001-of-000002.safetensors"), "{msg}");
}

#[test]
fn index_places_tensor_in_the_wrong_shard() {
    let dir = two_shards(|map| {
        map.insert("a".to_owned(), "model-00002-of-000002.safetensors".to_owned());
    });
    let err = Checkpoint::open(dir.path()).expect_err("wrong shard");
    assert!(
        matches!(err, CheckpointError::TensorNotInShard { ref tensor, .. } if tensor == "a"),
        "{err:?}"
    );
}

#[test]
fn tensor_in_two_shards() {
    let dir = two_shards(|_| {});
    let file = dir.path().join("model-00002-of-000002.safetensors");
    write_safetensors(
        &file,
        &[
            TensorData { name: "a", dtype: DType::U8, shape: &[2], data: &[1, 2] },
            TensorData { name: "b", dtype: DType::U8, shape: &[2], data: &[1, 2] },
        ],
        None,
    )
    .expect("rewrite shard");
    let err = Checkpoint::open(dir.path()).expect_err("duplicate");
    assert!(
        matches!(err, CheckpointError::DuplicateTensor { ref tensor, .. } if tensor == "a"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("model-00001-of-000002")
            && err.to_string().contains("model-00002-of-000002")
    );
}

#[test]
fn index_with_path_traversal_shard() {
    for evil in ["../evil.safetensors", "/etc/passwd", "sub/model.safetensors", ".."] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_config(dir.path(), &text_config());
        let index = serde_json::json!({"metadata": {}, "weight_map": {"w": evil}});
        std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string())
            .expect("index");
        let err = Checkpoint::open(dir.path()).expect_err("hostile index");
        assert!(
            matches!(err, CheckpointError::UnsafeShardName { ref shard, .. } if shard == evil),
            "{err:?}"
        );
        assert!(err.to_string().contains("model.safetensors.index.json"), "{err}");
    }
}

#[test]
fn index_invalid_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    std::fs::write(dir.path().join("model.safetensors.index.json"), "{\"weight_map\": ")
        .expect("index");
    let err = Checkpoint::open(dir.path()).expect_err("bad index");
    assert!(matches!(err, CheckpointError::BadJson { .. }), "{err:?}");
    assert!(err.to_string().contains("model.safetensors.index.json"), "{err}");
}

#[test]
fn no_weights_at_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    let err = Checkpoint::open(dir.path()).expect_err("no weights");
    assert!(matches!(err, CheckpointError::NoWeights { .. }), "{err:?}");
}
