//! The spine store hands out exactly the bytes of the file for every placement (resident,
//! streamed through two buffers, rows), over several passes in pass order and out of order,
//! through O_DIRECT and buffered reads; it charges the budget what it allocates and refuses
//! when that does not fit; a failed read is a clear error naming the piece, and the next
//! acquire reads the piece again. A spine already in the page cache is copied from there, not
//! read again from the disk, and a spine that is not grows the page cache by nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

use sluice_core::MemoryBudget;
use sluice_store::fault::{Fault, When};
use sluice_store::platform::{advice, residency};
use sluice_store::spine::{PieceLayout, SpineFootprint, TensorRange};
use sluice_store::{FaultyReader, IoMode, Placement, ReadAt, ShardFiles, SpineIndex, SpineStore};
use std::io::Write;
use std::sync::Arc;
use Placement::{Resident as R, Rows as W, Streamed as S};

/// A 9 MB file of position-derived bytes and five pieces: rows (embedding), three layers (two
/// tensors each with a gap, one spanning more than a chunk) and a head.
fn fixture() -> (tempfile::NamedTempFile, Vec<Vec<TensorRange>>, Vec<u8>) {
    let data: Vec<u8> =
        (0..9_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&data).unwrap();
    let t = |offset: u64, len: u64| TensorRange { file: 0, offset, len };
    let pieces = vec![
        vec![t(100, 64 * 300)],
        vec![t(30_001, 5000), t(35_001, 777)],
        vec![t(1_000_003, 4_500_000), t(7_000_000, 12_345)],
        vec![t(6_000_000, 100_000)],
        vec![t(8_000_001, 999_999)],
    ];
    (f, pieces, data)
}

fn index(f: &tempfile::NamedTempFile, pieces: &[Vec<TensorRange>]) -> SpineIndex {
    let layouts =
        pieces.iter().enumerate().map(|(i, t)| PieceLayout::new(format!("piece {i}"), t)).collect();
    SpineIndex::new(layouts, vec![f.path().to_path_buf()]).unwrap()
}

fn files(idx: &SpineIndex, io: IoMode) -> Arc<dyn ReadAt> {
    Arc::new(ShardFiles::open(idx.paths(), io).unwrap())
}

fn check_piece(store: &SpineStore, i: usize, tensors: &[TensorRange], data: &[u8]) {
    let g = store.acquire(i).unwrap();
    for t in tensors {
        let got = g.tensor(t.file, t.offset, t.len).unwrap();
        let want = &data[t.offset as usize..(t.offset + t.len) as usize];
        assert!(got == want, "piece {i} tensor at {} differs", t.offset);
    }
}

fn check_rows(store: &SpineStore, t: TensorRange, data: &[u8]) {
    let rows = [3usize, 0, 299, 3];
    let mut seen = 0;
    store
        .read_rows(0, t, 64, &rows, &mut |i, b| {
            let o = (t.offset + rows[i] as u64 * 64) as usize;
            assert_eq!(b, &data[o..o + 64], "row {}", rows[i]);
            seen += 1;
        })
        .unwrap();
    assert_eq!(seen, rows.len());
}

#[test]
fn every_placement_serves_the_file_bytes_over_several_passes() {
    let (f, pieces, data) = fixture();
    let idx = index(&f, &pieces);
    let plans = [
        vec![R, R, R, R, R],
        vec![W, R, R, R, S],
        vec![W, S, S, S, S],
        vec![W, R, S, S, R],
        vec![R, S, R, R, R],
        vec![W, S, R, R, S],
    ];
    for io in [IoMode::Direct, IoMode::Buffered] {
        for placements in &plans {
            let budget = MemoryBudget::new(1 << 30);
            let fp = SpineFootprint::of(&idx, placements);
            let store =
                SpineStore::open(idx.clone(), files(&idx, io), placements.clone(), 3, &budget)
                    .unwrap();
            assert_eq!(budget.used(), fp.total(), "{placements:?}: charged what it holds");
            let streamed = placements.iter().filter(|&&p| p == S).count() as u64;
            assert_eq!(fp.buffers, streamed.min(2));
            for _pass in 0..3 {
                let _p = store.begin_pass();
                for (i, t) in pieces.iter().enumerate() {
                    if placements[i] == W {
                        check_rows(&store, t[0], &data);
                    } else {
                        check_piece(&store, i, t, &data);
                    }
                }
            }
            // Out of pass order, and a peek at the next piece while one is held.
            for i in [3usize, 1, 4, 2, 2] {
                if placements[i] != W {
                    check_piece(&store, i, &pieces[i], &data);
                    let next = (i + 1) % pieces.len();
                    drop(store.peek(next));
                }
            }
            let s = store.stats();
            if streamed > 2 {
                assert!(s.piece_reads >= 3 * streamed, "{placements:?}: {s:?}");
            }
            drop(store);
            assert_eq!(budget.used(), 0, "charges returned on drop");
        }
    }
}

#[test]
fn a_budget_too_small_for_the_buffers_is_refused() {
    let (f, pieces, _) = fixture();
    let idx = index(&f, &pieces);
    let placements = vec![W, S, S, S, R];
    let fp = SpineFootprint::of(&idx, &placements);
    let budget = MemoryBudget::new(fp.total() - 1);
    let files = files(&idx, IoMode::Direct);
    let err = SpineStore::open(idx, files, placements, 2, &budget).expect_err("must not fit");
    assert!(err.to_string().contains("memory budget"), "{err}");
    assert_eq!(budget.used(), 0, "nothing stays charged after a refusal");
}

#[test]
fn read_faults_fail_the_acquire_with_the_piece_named_and_the_next_acquire_works() {
    let (f, pieces, data) = fixture();
    let idx = index(&f, &pieces);
    let placements = vec![W, S, S, S, S];
    for fault in [Fault::Error(libc::EIO), Fault::Truncate(1_000_003 + 100), Fault::Short(1000)] {
        let inner = ShardFiles::open(idx.paths(), IoMode::Direct).unwrap();
        let faulty = Arc::new(FaultyReader::new(inner));
        // Reads of piece 2 are broken before the store exists: its first read (at open, or read
        // ahead when piece 1 is acquired) can only fail. Injecting after open raced that read
        // ahead, which on a loaded machine could finish first and leave no read to fail.
        faulty.inject(When::Overlaps { file: 0, start: 1_000_003, end: 5_500_003 }, fault, None);
        let store = SpineStore::open(
            idx.clone(),
            faulty.clone(),
            placements.clone(),
            2,
            &MemoryBudget::unlimited(),
        )
        .unwrap();
        check_piece(&store, 1, &pieces[1], &data);
        let r = store.acquire(2);
        if let Fault::Short(_) = fault {
            // Short reads are continued, never an error.
            let g = r.unwrap();
            drop(g);
        } else {
            let err = r.expect_err("the read of piece 2 fails").to_string();
            assert!(err.contains("reading the spine of piece 2"), "{err}");
            assert!(err.contains(&f.path().display().to_string()), "{err}");
            // Still failing: the next acquire tries again and reports again.
            assert!(store.acquire(2).is_err());
        }
        faulty.clear();
        check_piece(&store, 2, &pieces[2], &data);
        check_piece(&store, 3, &pieces[3], &data);
        // Row reads fail and recover the same way.
        faulty.inject(When::Always, Fault::Error(libc::EIO), None);
        let err = store.read_rows(0, pieces[0][0], 64, &[1], &mut |_, _| {}).expect_err("fails");
        assert!(err.to_string().contains("reading the spine of piece 0"), "{err}");
        faulty.clear();
        check_rows(&store, pieces[0][0], &data);
    }
}

/// Pages of `path` in the page cache, one `mincore` question a page.
fn cached_pages(path: &std::path::Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    (0..len.div_ceil(4096))
        .filter(|p| residency::resident(&f, p * 4096, 4096.min(len - p * 4096)).unwrap())
        .count()
}

/// Opens every piece resident through O_DIRECT and checks each tensor against the file;
/// returns the reader's (direct, buffered, cached) read counts.
fn load_resident(idx: &SpineIndex, pieces: &[Vec<TensorRange>], data: &[u8]) -> (u64, u64, u64) {
    let files = Arc::new(ShardFiles::open(idx.paths(), IoMode::Direct).unwrap());
    let store = SpineStore::open(
        idx.clone(),
        files.clone(),
        vec![R; pieces.len()],
        3,
        &MemoryBudget::unlimited(),
    )
    .unwrap();
    for (i, t) in pieces.iter().enumerate() {
        check_piece(&store, i, t, data);
    }
    let (direct, buffered) = files.read_counts();
    (direct, buffered, files.cached_reads())
}

#[test]
fn a_spine_in_the_page_cache_was_read_again_from_the_disk() {
    let (f, pieces, data) = fixture();
    f.as_file().sync_all().unwrap();
    let idx = index(&f, &pieces);
    // tmpfs refuses O_DIRECT and keeps its pages whatever the advice: nothing to tell apart.
    if sluice_store::platform::direct::open(f.path()).is_none() {
        return;
    }
    let pages = data.len().div_ceil(4096);

    // Resident: every chunk is copied from the page cache, none read from the disk again.
    assert_eq!(std::fs::read(f.path()).unwrap(), data);
    assert_eq!(cached_pages(f.path()), pages);
    let (direct, _, cached) = load_resident(&idx, &pieces, &data);
    assert_eq!(direct, 0, "a resident chunk went to the disk");
    assert!(cached > 0);
    assert_eq!(cached_pages(f.path()), pages, "the copy left the cache as it was");

    // Not resident: O_DIRECT as before, and the page cache does not grow.
    advice::drop_file(f.path()).unwrap();
    assert_eq!(cached_pages(f.path()), 0);
    let (direct, _, cached) = load_resident(&idx, &pieces, &data);
    assert!(direct > 0);
    assert_eq!(cached, 0, "nothing was resident to copy");
    assert_eq!(cached_pages(f.path()), 0, "reading a model grew the page cache");

    // Half resident: the resident chunks are copied, the rest read uncached, and the copies
    // read nothing ahead into the cache.
    {
        // Through a mapping without read-ahead, so exactly these pages are cached.
        // SAFETY: a read-only map of a temporary file nothing writes now.
        let map = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        map.advise(memmap2::Advice::Random).unwrap();
        let sum = map[..4 << 20].iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
        std::hint::black_box(sum);
    }
    let before = cached_pages(f.path());
    assert!(before >= 1024 && before < pages, "{before} of {pages} pages cached");
    let (direct, _, cached) = load_resident(&idx, &pieces, &data);
    assert!(direct > 0 && cached > 0, "direct {direct}, cached {cached}");
    assert_eq!(cached_pages(f.path()), before, "the load grew the page cache");
}

#[test]
fn a_failed_resident_read_fails_the_open_with_the_first_failed_piece_named() {
    let (f, pieces, _) = fixture();
    let idx = index(&f, &pieces);
    let faulty =
        Arc::new(FaultyReader::new(ShardFiles::open(idx.paths(), IoMode::Direct).unwrap()));
    // Pieces 2 and 4 fail; every resident chunk is queued at once, and piece 2 is named.
    faulty.inject(
        When::Overlaps { file: 0, start: 1_000_003, end: 1_000_004 },
        Fault::Error(libc::EIO),
        None,
    );
    faulty.inject(
        When::Overlaps { file: 0, start: 8_000_001, end: 8_000_002 },
        Fault::Error(libc::EIO),
        None,
    );
    let budget = MemoryBudget::new(1 << 30);
    let err = SpineStore::open(idx.clone(), faulty.clone(), vec![R; 5], 3, &budget)
        .expect_err("piece 2 cannot be read")
        .to_string();
    assert!(err.contains("reading the spine of piece 2"), "{err}");
    assert_eq!(budget.used(), 0, "charges returned with the failed open");
}

#[test]
fn a_fault_injected_spine_load_never_reached_the_copy_from_the_page_cache() {
    // FaultyReader answered `read_at_cached` with the inner reader's plain `read_at`, so a
    // resident spine opened through it was read again from the disk, and fault tests never
    // reached the copy from the page cache.
    let (f, pieces, data) = fixture();
    f.as_file().sync_all().unwrap();
    let idx = index(&f, &pieces);
    if sluice_store::platform::direct::open(f.path()).is_none() {
        return;
    }
    assert_eq!(std::fs::read(f.path()).unwrap(), data, "the file is read, so resident");
    let faulty =
        Arc::new(FaultyReader::new(ShardFiles::open(idx.paths(), IoMode::Direct).unwrap()));
    let store = SpineStore::open(
        idx.clone(),
        faulty.clone(),
        vec![R; pieces.len()],
        3,
        &MemoryBudget::unlimited(),
    )
    .unwrap();
    for (i, t) in pieces.iter().enumerate() {
        check_piece(&store, i, t, &data);
    }
    assert!(faulty.calls() > 0, "reads went through the fault injector");
    assert!(faulty.inner().cached_reads() > 0, "and reached the copy from the page cache");
    assert_eq!(faulty.inner().read_counts().0, 0, "no O_DIRECT read of a resident file");
}
