//! A stream install's sparse shard stays open as a checkpoint while the expert disk cache
//! writes routed experts into its holes and punches them out again. A `&[u8]` over bytes that
//! change under it is undefined behaviour, so the checkpoint must never map those ranges: they
//! are located for the store's own reads, refused by name, and left out of every mapping.

mod common;

use common::{text_config, write_config};
use sluice_checkpoint::{write_safetensors, Checkpoint, CheckpointError, TensorData};
use sluice_core::DType;
use std::os::unix::fs::FileExt;

const EXPERT: &str = "model.layers.0.mlp.experts.0.w1.weight_packed";

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| u8::try_from(i % 251).unwrap_or(0).wrapping_add(seed)).collect()
}

#[test]
fn sparse_shard_expert_ranges_were_mapped_while_the_disk_cache_wrote_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &text_config());
    // Spine, expert, spine: the expert spans many whole pages whatever the page size.
    let (a, expert, b) = (pattern(5000, 1), pattern(6 * 65_536, 2), pattern(3000, 3));
    let path = dir.path().join("model.safetensors");
    write_safetensors(
        &path,
        &[
            TensorData { name: "model.a", dtype: DType::U8, shape: &[5000], data: &a },
            TensorData { name: EXPERT, dtype: DType::U8, shape: &[6 * 65_536], data: &expert },
            TensorData { name: "model.b", dtype: DType::U8, shape: &[3000], data: &b },
        ],
        None,
    )
    .expect("write");
    let ckpt = Checkpoint::open_with_shards(dir.path(), &|n| dir.path().join(n), &|_, t| {
        t.contains(".experts.")
    })
    .expect("open");

    // The spine reads as written; the expert is located but has no bytes here.
    assert_eq!(ckpt.bytes(ckpt.expect("model.a", DType::U8, &[5000]).expect("a")), &a[..]);
    assert_eq!(ckpt.bytes(ckpt.tensor("model.b").expect("b")), &b[..]);
    let e = ckpt.locate(EXPERT, DType::U8, &[6 * 65_536]).expect("located").clone();
    assert!(!ckpt.is_mapped(&e));
    assert!(ckpt.try_bytes(&e).is_none());
    let err = ckpt.tensor(EXPERT).expect_err("not mapped");
    assert!(matches!(err, CheckpointError::NotMapped { .. }), "{err}");
    assert!(err.to_string().contains("stream install"), "{err}");
    assert!(ckpt.expect(EXPERT, DType::U8, &[6 * 65_536]).is_err());

    #[cfg(target_os = "linux")]
    assert_no_mapping_covers(&path, e.offset, e.end());

    // The disk cache fills the hole and later punches it (here: overwrites it) while the
    // checkpoint is open; the spine it hands out does not change.
    let f = std::fs::OpenOptions::new().write(true).open(&path).expect("open for writing");
    f.write_all_at(&vec![0u8; expert.len()], e.offset).expect("write the expert's range");
    assert_eq!(ckpt.bytes(ckpt.tensor("model.a").expect("a")), &a[..]);
    assert_eq!(ckpt.bytes(ckpt.tensor("model.b").expect("b")), &b[..]);

    // A checkpoint opened plainly still maps everything, experts included.
    let plain = Checkpoint::open(dir.path()).expect("plain open");
    let pe = plain.tensor(EXPERT).expect("mapped in a plain checkpoint");
    assert_eq!(plain.bytes(pe).len(), expert.len());
}

/// No mapping of `path` in this process covers a whole page of `start .. end`.
#[cfg(target_os = "linux")]
fn assert_no_mapping_covers(path: &std::path::Path, start: u64, end: u64) {
    // 64 KiB: the largest page size Linux uses, so the check holds for any page size.
    let page = 65_536u64;
    let (first, last) = (start.div_ceil(page) * page, end / page * page);
    let want = std::fs::canonicalize(path).expect("canonical path");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut mapped = 0;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || std::path::Path::new(fields[5]) != want {
            continue;
        }
        let (lo, hi) = fields[0].split_once('-').expect("address range");
        let len =
            u64::from_str_radix(hi, 16).expect("hex") - u64::from_str_radix(lo, 16).expect("hex");
        let off = u64::from_str_radix(fields[2], 16).expect("hex offset");
        mapped += 1;
        assert!(
            off + len <= first || off >= last,
            "file bytes {off}..{} are mapped, overlapping the expert's pages {first}..{last}",
            off + len
        );
    }
    assert!(mapped > 0, "the spine is mapped");
}
