//! Machine telemetry: real counters move with real work, and every reader the OS refuses
//! answers `None` ("n/a"), never an error or a zero.

use std::io::Write;
use std::path::Path;

#[cfg(target_os = "linux")]
use sluice_store::platform::machine;
use sluice_store::telemetry::{self, page_cache_share, Sample, Telemetry};

#[test]
fn a_write_and_a_fsync_show_in_the_process_and_own_counters() {
    let dir = tempfile::tempdir().expect("temp dir");
    let start = Sample::now(Some(dir.path()));
    let path = dir.path().join("blob");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(&vec![7u8; 4 << 20]).expect("write");
    f.sync_all().expect("fsync");
    telemetry::count_state_write(4 << 20);
    telemetry::count_expert_read(123);
    let t = Telemetry::since(&start).with_budget(1 << 30);
    assert!(t.state_written_bytes >= 4 << 20, "{t:?}");
    assert!(t.expert_read_bytes >= 123, "{t:?}");
    assert_eq!(t.budget_bytes, Some(1 << 30));
    if cfg!(target_os = "linux") {
        // A tmpfs /tmp writes nothing to storage; a disk-backed one writes the 4 MiB.
        let w = t.process_written_bytes.expect("Linux reports /proc/self/io");
        assert!(w == 0 || w >= 4 << 20, "{w}");
        assert!(t.swap_in_bytes.is_some() && t.major_faults.is_some(), "{t:?}");
    }
    let line = t.to_string();
    assert!(line.starts_with("machine: ") && line.contains("state files read"), "{line}");
}

#[test]
fn a_page_cache_share_is_measured_and_bounded() {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(&vec![1u8; 8 << 20]).expect("write");
    f.as_file().sync_all().expect("sync");
    // Read it so its pages are cached, then check the share is a fraction.
    let _ = std::fs::read(f.path()).expect("read");
    let share = page_cache_share(&[f.path().to_path_buf()]).expect("a mappable file");
    assert!((0.0..=1.0).contains(&share.fraction), "{share:?}");
    assert_eq!(share.file_bytes, 8 << 20);
    assert!(share.sampled_bytes > 0 && share.sampled_bytes <= 8 << 20, "{share:?}");
    assert!(page_cache_share(&[Path::new("/nonexistent/sluice.safetensors").into()]).is_none());
}

#[cfg(target_os = "linux")]
#[test]
fn readers_pointed_at_missing_or_unreadable_files_say_not_available() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing");
    assert_eq!(machine::process_io_from(&missing), None);
    assert_eq!(machine::swap_pages_from(&missing), None);
    assert_eq!(machine::disk_written_from(&missing), None);
    assert_eq!(machine::swap_areas_from(&missing), None);
    assert_eq!(machine::disk_of_devnum(dir.path(), 8, 0), None);
    // A directory is unreadable as a file (EISDIR), as a file without permission would be for
    // a user that root tests cannot play.
    assert_eq!(machine::process_io_from(dir.path()), None);
    // A file without the fields (a kernel that does not count them) is not a zero either.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "rchar: 5\n").expect("write");
    assert_eq!(machine::process_io_from(&empty), None);
    assert_eq!(machine::swap_pages_from(&empty), None);
    assert_eq!(machine::disk_written_from(&empty), None);
}

#[cfg(target_os = "linux")]
#[test]
fn a_partition_resolves_to_its_whole_disk() {
    // A fake /sys: dev/block/8:1 -> block/sda/sda1 (a partition), block/sda/stat.
    let sys = tempfile::tempdir().expect("temp dir");
    let sda = sys.path().join("block/sda");
    std::fs::create_dir_all(sda.join("sda1")).expect("dirs");
    std::fs::write(sda.join("sda1/partition"), "1\n").expect("partition");
    std::fs::write(sda.join("stat"), "1 0 8 0 10 0 2048 0 0 0 0\n").expect("stat");
    std::fs::create_dir_all(sys.path().join("dev/block")).expect("dev");
    std::os::unix::fs::symlink(sda.join("sda1"), sys.path().join("dev/block/8:1")).expect("link");
    let disk = machine::disk_of_devnum(sys.path(), 8, 1).expect("found");
    assert_eq!(disk.name, "sda");
    assert_eq!(machine::disk_written(&disk), Some(2048 * 512));
    // A device mapper volume on it: dm-0/slaves/sda1.
    let dm = sys.path().join("block/dm-0");
    std::fs::create_dir_all(dm.join("slaves")).expect("dm");
    std::fs::write(dm.join("stat"), "0 0 0 0 0 0 0 0 0 0 0\n").expect("stat");
    std::os::unix::fs::symlink(sda.join("sda1"), dm.join("slaves/sda1")).expect("slave");
    std::os::unix::fs::symlink(&dm, sys.path().join("dev/block/253:0")).expect("link");
    assert_eq!(machine::disk_of_devnum(sys.path(), 253, 0).map(|d| d.name), Some("sda".into()));
}

#[cfg(target_os = "linux")]
#[test]
fn swap_areas_are_parsed_with_their_sizes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let swaps = dir.path().join("swaps");
    std::fs::write(
        &swaps,
        "Filename\tType\tSize\tUsed\tPriority\n/nonexistent/swapfile file 1024 0 -2\n",
    )
    .expect("write");
    let areas = machine::swap_areas_from(&swaps).expect("parsed");
    assert_eq!(areas.len(), 1);
    assert_eq!(areas[0].size, 1 << 20);
    assert_eq!(areas[0].disk, None, "a missing swap file has no known disk");
    assert!(machine::swap_areas().is_some(), "/proc/swaps is readable here");
}

#[test]
fn the_write_test_measures_and_removes_its_file_and_says_when_it_cannot() {
    use sluice_store::storage_check::{write_bandwidth, BLOCK};
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temp dir");
    let b = write_bandwidth(dir.path(), 8 << 20, Duration::from_secs(2)).expect("writable");
    assert!(b.bytes >= BLOCK as u64 && b.bytes <= 8 << 20, "{b:?}");
    assert!(b.gbps > 0.0 && b.secs > 0.0, "{b:?}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0, "test file removed");
    let e = write_bandwidth(&dir.path().join("missing"), 8 << 20, Duration::from_secs(1))
        .expect_err("no such directory");
    assert!(e.contains("cannot write a test file in") && e.contains("missing"), "{e}");
}

#[test]
fn swap_on_the_model_disk_is_warned_about() {
    use sluice_store::storage_check::{swap_warnings, SwapEntry};
    let on = SwapEntry { path: "/swapfile".into(), disk: Some("vda".into()), bytes: 1 << 30 };
    let w = swap_warnings(Some(std::slice::from_ref(&on)), Some("vda"));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("on the model's disk (vda)") && w[0].contains("swapoff"), "{w:?}");
    let w = swap_warnings(Some(&[on]), Some("nvme0n1"));
    assert_eq!(w.len(), 1, "enabled, elsewhere: {w:?}");
    assert!(swap_warnings(Some(&[]), Some("vda")).is_empty());
    assert!(swap_warnings(None, Some("vda")).is_empty(), "unknown is not a warning");
}
