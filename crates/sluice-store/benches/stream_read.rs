//! Streaming read throughput at Kimi K3's real expert size (17,547,264 bytes, six tensors at
//! an unaligned start, as in the published shards), through the whole store: index, reader
//! pool, slot cache, `for_each`. Every request is a miss (16 experts per "layer", 16 slots),
//! so the figure is the storage path alone. Compare with MACHINE.md (fio: ~1.28 GB/s, 8 psync
//! threads, 4 MiB blocks, O_DIRECT).
//!
//! `cargo bench -p sluice-store --bench stream_read`; `SLUICE_BENCH_EXPERTS` (default 64)
//! sets the data file size, `SLUICE_BENCH_FILE` its path (default under `target/`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_checkpoint::TensorEntry;
use sluice_core::{DType, MemoryBudget};
use sluice_store::{
    CacheSize, ExpertIndex, ExpertLoc, ExpertStore, IoMode, ShardFiles, StreamingConfig,
    StreamingExperts,
};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// K3 expert tensors: packed `[2048, 5376/2]`-sized and scales, for w1, w2, w3.
const PACKED: u64 = 5_505_024;
const SCALE: u64 = 344_064;
const EXPERT: u64 = 3 * (PACKED + SCALE);
/// Where the first expert starts (a safetensors header of odd length precedes the data).
const START: u64 = 12_345;

fn main() {
    assert_eq!(EXPERT, 17_547_264);
    let experts: usize =
        std::env::var("SLUICE_BENCH_EXPERTS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let path = std::env::var("SLUICE_BENCH_FILE").map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/sluice-bench-experts.bin")
    });
    let len = START + experts as u64 * EXPERT;
    if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(len) {
        eprintln!("writing {len} bytes to {}", path.display());
        let mut f = std::fs::File::create(&path).expect("create bench file");
        let block: Vec<u8> = (0..4 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24).to_le_bytes()[0])
            .collect();
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(block.len());
            f.write_all(&block[..n]).expect("write");
            left -= n as u64;
        }
        f.sync_all().expect("sync");
    }
    drop_page_cache(&path);
    let lens = [PACKED, SCALE, PACKED, SCALE, PACKED, SCALE];
    let locs: Vec<ExpertLoc> = (0..experts as u64)
        .map(|e| {
            let mut off = START + e * EXPERT;
            let ents: Vec<TensorEntry> = lens
                .iter()
                .map(|&l| {
                    let t = TensorEntry {
                        name: format!("e{e}"),
                        shard: 0,
                        dtype: DType::U8,
                        shape: vec![l],
                        offset: off,
                        len: l,
                    };
                    off += l;
                    t
                })
                .collect();
            ExpertLoc::locate(&ents, std::slice::from_ref(&path), &[len]).expect("locate")
        })
        .collect();
    let index = ExpertIndex::from_layers(vec![locs], vec![path.clone()]);
    let ids: Vec<u32> = (0..u32::try_from(experts).expect("experts fit u32")).collect();
    println!("{:<22} {:>8} {:>10} {:>8}", "mode", "readers", "GB/s", "stall%");
    let configs = [
        (IoMode::Direct, 1),
        (IoMode::Direct, 4),
        (IoMode::Direct, 8),
        (IoMode::Direct, 16),
        (IoMode::BufferedDropCache, 16),
    ];
    // Twice, interleaved: the disk is shared and noisy.
    for (io, readers) in configs.iter().chain(configs.iter()).copied() {
        drop_page_cache(&path);
        let files = ShardFiles::open(std::slice::from_ref(&path), io).expect("open");
        let cfg = StreamingConfig {
            cache: CacheSize::Slots(16),
            readers,
            io,
            ..StreamingConfig::default()
        };
        let store =
            StreamingExperts::new(index.clone(), Arc::new(files), &cfg, &MemoryBudget::unlimited())
                .expect("store");
        let t0 = Instant::now();
        let mut sum = 0u64;
        for wave in ids.chunks(16) {
            store
                .for_each(0, wave, &mut |_, v| {
                    let (first, last) = (v.part(0), v.part(5));
                    sum += u64::from(first[0]) + u64::from(last[last.len() - 1]);
                    Ok(())
                })
                .expect("read");
        }
        let secs = t0.elapsed().as_secs_f64();
        let s = store.stats();
        assert_eq!(s.misses, experts as u64);
        println!(
            "{:<22} {readers:>8} {:>10.3} {:>7.1}%  (checksum {sum})",
            format!("{io:?}"),
            s.bytes_served as f64 / secs / 1e9,
            100.0 * s.stall_ns as f64 / 1e9 / secs
        );
    }
}

/// Drops the file's pages from the page cache so every configuration starts cold.
fn drop_page_cache(path: &std::path::Path) {
    sluice_store::platform::advice::drop_file(path).expect("dropping the file's cached pages");
}
