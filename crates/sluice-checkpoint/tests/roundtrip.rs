//! Writing checkpoints with the writer and reading them back through `Checkpoint::open`.

mod common;

use std::collections::BTreeMap;

use common::{f32_bytes, k3_config, text_config, write_config};
use sluice_checkpoint::{
    read_header, write_index, write_safetensors, Checkpoint, CheckpointError, ShardWriter,
    TensorData, TensorSpec,
};
use sluice_core::DType;

#[test]
fn single_file_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    let w = f32_bytes(6);
    let b: Vec<u8> = [1u16, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect();
    let scalar = 7.5f32.to_le_bytes();
    let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let path = dir.path().join("model.safetensors");
    let size = write_safetensors(
        &path,
        &[
            TensorData { name: "model.w", dtype: DType::F32, shape: &[2, 3], data: &w },
            TensorData { name: "model.b", dtype: DType::BF16, shape: &[3], data: &b },
            TensorData { name: "model.s", dtype: DType::F32, shape: &[], data: &scalar },
            TensorData { name: "model.empty", dtype: DType::U8, shape: &[0, 4], data: &[] },
        ],
        Some(&meta),
    )
    .expect("write");
    assert_eq!(size, std::fs::metadata(&path).expect("stat").len());

    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(ckpt.len(), 4);
    assert_eq!(ckpt.name_prefix(), "");
    assert_eq!(ckpt.shard_paths(), std::slice::from_ref(&path));
    assert_eq!(ckpt.shard_metadata(0), Some(&meta));
    assert!(ckpt.index_metadata().is_none());
    let e = ckpt.expect("model.w", DType::F32, &[2, 3]).expect("model.w");
    assert_eq!(ckpt.bytes(e), w.as_slice());
    assert_eq!(e.numel(), 6);
    assert_eq!(ckpt.shard_file(e), path.as_path());
    assert_eq!(ckpt.bytes(ckpt.tensor("model.b").expect("b")), b.as_slice());
    assert_eq!(ckpt.bytes(ckpt.tensor("model.s").expect("s")), scalar.as_slice());
    assert!(ckpt.bytes(ckpt.tensor("model.empty").expect("empty")).is_empty());
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["model.b", "model.empty", "model.s", "model.w"]);

    // Data follows the given order, and the header is space-padded to a multiple of 8.
    let raw = std::fs::read(&path).expect("read");
    let n = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
    assert_eq!(n % 8, 0);
    assert_eq!(e.offset, 8 + n);
    assert!(ckpt.get("model.b").expect("b").offset > e.offset);
    let header = read_header(&path).expect("read_header");
    assert_eq!(header.data_offset, 8 + n);
    assert_eq!(header.tensors.len(), 4);
    assert_eq!(header.metadata, meta);
}

#[test]
fn expect_reports_dtype_and_shape_mismatch_naming_the_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    let path = dir.path().join("model.safetensors");
    let data = f32_bytes(4);
    write_safetensors(
        &path,
        &[TensorData { name: "w", dtype: DType::F32, shape: &[2, 2], data: &data }],
        None,
    )
    .expect("write");
    let ckpt = Checkpoint::open(dir.path()).expect("open");

    let err = ckpt.expect("w", DType::BF16, &[2, 2]).expect_err("dtype mismatch");
    assert!(matches!(
        err,
        CheckpointError::DTypeMismatch { expected: DType::BF16, got: DType::F32, .. }
    ));
    assert!(
        err.to_string().contains("model.safetensors") && err.to_string().contains("\"w\""),
        "{err}"
    );

    let err = ckpt.expect("w", DType::F32, &[4]).expect_err("shape mismatch");
    match &err {
        CheckpointError::ShapeMismatch { file, tensor, expected, got } => {
            assert_eq!(file, &path);
            assert_eq!(tensor, "w");
            assert_eq!(expected, &[4]);
            assert_eq!(got, &[2, 2]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }

    let err = ckpt.tensor("nope").expect_err("missing");
    assert!(matches!(err, CheckpointError::MissingTensor { ref tensor, .. } if tensor == "nope"));
    assert!(err.to_string().contains("nope"));
}

#[test]
fn multi_shard_with_index_and_language_model_prefix() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &k3_config());
    let mut weight_map = BTreeMap::new();
    let mut total = 0;
    let mut expected = BTreeMap::new();
    for shard in 1..=3u8 {
        let file = format!("model-{shard:05}-of-000003.safetensors");
        let names = [
            format!("language_model.model.layers.{shard}.mlp.w"),
            format!("language_model.model.layers.{shard}.norm.weight"),
        ];
        let w: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(shard)).collect();
        let n: Vec<u8> = vec![shard; 8];
        write_safetensors(
            &dir.path().join(&file),
            &[
                TensorData { name: &names[0], dtype: DType::U8, shape: &[4, 8], data: &w },
                TensorData { name: &names[1], dtype: DType::BF16, shape: &[4], data: &n },
            ],
            None,
        )
        .expect("write shard");
        total += 40;
        for (name, data) in names.iter().zip([w, n]) {
            weight_map.insert(name.clone(), file.clone());
            expected.insert(name.clone(), (file.clone(), data));
        }
    }
    write_index(dir.path(), &weight_map, total).expect("write index");

    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(ckpt.len(), 6);
    assert_eq!(ckpt.shard_paths().len(), 3);
    assert_eq!(ckpt.name_prefix(), "language_model.");
    assert_eq!(ckpt.config().architecture(), "KimiK3ForConditionalGeneration");
    assert_eq!(ckpt.config().text_config()["model_type"], "kimi_linear");
    assert_eq!(ckpt.index_metadata().expect("metadata")["total_size"], total);
    for (name, (file, data)) in &expected {
        let e = ckpt.tensor(name).expect("tensor");
        assert_eq!(ckpt.shard_file(e), dir.path().join(file));
        assert_eq!(ckpt.bytes(e), data.as_slice(), "{name}");
    }
    let e = ckpt.expect("language_model.model.layers.2.mlp.w", DType::U8, &[4, 8]).expect("expect");
    assert_eq!(e.shard, 1);
}

#[test]
fn shard_writer_streams_in_chunks_and_matches_one_shot_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = f32_bytes(1000);
    let b = f32_bytes(3);
    let one = dir.path().join("one.safetensors");
    write_safetensors(
        &one,
        &[
            TensorData { name: "a", dtype: DType::F32, shape: &[10, 100], data: &a },
            TensorData { name: "b", dtype: DType::F32, shape: &[3], data: &b },
        ],
        None,
    )
    .expect("write");

    let two = dir.path().join("two.safetensors");
    let specs =
        vec![TensorSpec::new("a", DType::F32, [10, 100]), TensorSpec::new("b", DType::F32, [3])];
    let mut w = ShardWriter::create(&two, specs, None).expect("create");
    assert!(!two.exists(), "nothing appears under the final name before finish");
    for chunk in a.chunks(333) {
        w.write_tensor_chunk("a", chunk).expect("chunk");
    }
    assert_eq!(w.next_tensor().map(|s| s.name.as_str()), Some("b"));
    w.write_tensor("b", &b).expect("b");
    assert!(w.next_tensor().is_none());
    w.finish().expect("finish");
    assert_eq!(std::fs::read(&one).expect("one"), std::fs::read(&two).expect("two"));
}

#[test]
fn shard_writer_rejects_wrong_order_wrong_length_and_early_finish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.safetensors");
    let specs =
        vec![TensorSpec::new("a", DType::BF16, [2]), TensorSpec::new("b", DType::BF16, [2])];

    let mut w = ShardWriter::create(&path, specs.clone(), None).expect("create");
    let err = w.write_tensor("b", &[0; 4]).expect_err("out of order");
    assert!(
        matches!(err, CheckpointError::WriteRejected { ref tensor, .. } if tensor == "b"),
        "{err:?}"
    );
    let err = w.write_tensor("a", &[0; 3]).expect_err("short");
    assert!(matches!(err, CheckpointError::LengthMismatch { expected: 4, got: 3, .. }), "{err:?}");
    let err = w.write_tensor_chunk("a", &[0; 5]).expect_err("too long");
    assert!(matches!(err, CheckpointError::WriteRejected { .. }), "{err:?}");
    w.write_tensor("a", &[0; 4]).expect("a");
    let err = w.finish().expect_err("incomplete");
    assert!(
        matches!(err, CheckpointError::WriteIncomplete { written: 1, total: 2, .. }),
        "{err:?}"
    );
    assert!(!path.exists());

    let err = ShardWriter::create(&path, vec![specs[0].clone(), specs[0].clone()], None)
        .expect_err("dup");
    assert!(matches!(err, CheckpointError::WriteRejected { .. }), "{err:?}");

    let err = write_safetensors(
        &path,
        &[TensorData { name: "a", dtype: DType::F32, shape: &[2], data: &[0; 4] }],
        None,
    )
    .expect_err("length");
    assert!(matches!(err, CheckpointError::LengthMismatch { expected: 8, got: 4, .. }), "{err:?}");

    // A dropped writer leaves no temporary files behind.
    drop(ShardWriter::create(&path, specs, None).expect("create"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn write_index_refuses_unsafe_shard_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let map = BTreeMap::from([("w".to_owned(), "../evil.safetensors".to_owned())]);
    let err = write_index(dir.path(), &map, 0).expect_err("unsafe name");
    assert!(matches!(err, CheckpointError::WriteRejected { .. }), "{err:?}");
}
