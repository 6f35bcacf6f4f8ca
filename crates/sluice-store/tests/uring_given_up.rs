//! The io_uring backend when `io_uring_enter` really fails: a seccomp filter makes the system
//! call return an error for one store's ring (matched by its descriptor), after that store has
//! served reads through it. The request that needs the ring fails with an error naming the
//! system call and the OS error, nothing hangs, the cache stays consistent, and later requests
//! are served exactly through the pread fallback. Three stores: an error that is not transient
//! (EINVAL, given up at once), a transient one (EAGAIN, given up after `ENTER_ATTEMPTS` tries),
//! and EINVAL arriving while the kernel holds a stalled read's timer.
//!
//! A seccomp filter cannot be removed and is installed on every thread of the process (so that
//! the ring's driver thread gets it too): this file holds one test, and each filter matches only
//! the descriptor of a ring that stays open until the process ends.
#![cfg(target_os = "linux")] // io_uring and seccomp are Linux's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, collect, reference, Fixture};
use sluice_store::fault::{Fault, When};
use sluice_store::index::Span;
use sluice_store::uring::ENTER_ATTEMPTS;
use sluice_store::{
    CacheSize, FaultyReader, IoBackend, IoMode, ShardFiles, StoreError, StreamingConfig,
    StreamingExperts,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

type Reference = BTreeMap<(usize, u32), Vec<u8>>;

/// The descriptors of this process's io_uring instances.
fn rings() -> BTreeSet<i32> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            let fd = e.file_name().to_str()?.parse().ok()?;
            (target.to_str()? == "anon_inode:[io_uring]").then_some(fd)
        })
        .collect()
}

/// A store on io_uring reading through a fault injector, and its ring's descriptor.
fn store(fx: &Fixture) -> (Arc<FaultyReader<ShardFiles>>, StreamingExperts, i32) {
    let files = ShardFiles::open(fx.ckpt.shard_paths(), IoMode::Direct).expect("opens");
    let reader = Arc::new(FaultyReader::new(files));
    let cfg = StreamingConfig {
        cache: CacheSize::Slots(64),
        // Every read of a request in flight at once (a layer has 16 experts).
        readers: 16,
        backend: IoBackend::Uring,
        max_prefetch_slots: Some(0),
        ..Default::default()
    };
    let before = rings();
    let store = fx.streaming_with(reader.clone(), &cfg);
    let new: Vec<i32> = rings().difference(&before).copied().collect();
    assert_eq!(new.len(), 1, "one new ring: {new:?}");
    (reader, store, new[0])
}

/// Makes `io_uring_enter` on ring `fd` fail with `errno` in every thread of this process, now
/// and later. Returns why not where seccomp filters cannot be installed.
fn fail_enter(fd: i32, errno: i32) -> Result<(), std::io::Error> {
    let code = |c: u32| u16::try_from(c).expect("BPF opcode");
    let stmt = |c: u32, k: u32| libc::sock_filter { code: code(c), jt: 0, jf: 0, k };
    let jeq = |k: u32, jf: u8| libc::sock_filter {
        code: code(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
        jt: 0,
        jf,
        k,
    };
    let errno = u32::try_from(errno).expect("errno");
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    // `struct seccomp_data`: nr (4 bytes), arch (4), instruction_pointer (8), args[6] (8 each);
    // the descriptor is the low half of args[0].
    let fd_word = if cfg!(target_endian = "little") { 16 } else { 20 };
    let nr = u32::try_from(libc::SYS_io_uring_enter).expect("syscall number");
    let mut program = [
        stmt(load, 0),
        jeq(nr, 3),
        stmt(load, fd_word),
        jeq(u32::try_from(fd).expect("descriptor"), 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | errno),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).expect("short program"),
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `prctl(PR_SET_NO_NEW_PRIVS)` takes integers only; it is required to install a
    // filter without privileges and only forbids gaining privileges through exec.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `prog` points to `program`, a valid filter that lives across the call (the
    // kernel copies it).
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            std::ptr::addr_of!(prog),
        )
    };
    match r {
        0 => Ok(()),
        -1 => Err(std::io::Error::last_os_error()),
        tid => Err(std::io::Error::other(format!("thread {tid} could not take the filter"))),
    }
}

/// Asserts that `err` is a read error caused by the ring being given up with `os_error`.
fn assert_enter_error(err: &StoreError, os_error: &str, what: &str) {
    let StoreError::Read { source, .. } = err else {
        panic!("{what}: expected a read error, got {err:?}");
    };
    let msg = source.to_string();
    assert!(msg.starts_with("io_uring_enter failed") && msg.contains(os_error), "{what}: {msg}");
}

/// After the ring was given up during a request for `ids` of `layer`: the store says so, is
/// consistent, and serves `ids` of every layer exactly. Other layers are served at once; `layer`
/// once the failed request's reads have ended (a read the kernel held ends when the kernel
/// completes it; a request joining it before then would be given the ring's error again).
fn assert_fallback_works(
    fx: &Fixture,
    store: &StreamingExperts,
    want: &Reference,
    (layer, ids): (usize, &[u32]),
) {
    assert_eq!(store.io_backend(), "pread");
    let why = store.io_fallback_reason().expect("the reason is kept");
    assert!(why.starts_with("io_uring_enter failed"), "{why}");
    store.check_consistency(true).expect("no slot left half-filled or pinned");
    for &l in fx.moe_layers.iter().filter(|&&l| l != layer) {
        let got = collect(store, l, ids).expect("served through the pread fallback");
        assert_same(want, l, &got, "after the ring was given up");
    }
    assert!(
        store.wait_reads_done(Duration::from_secs(60)),
        "the failed request's reads never ended"
    );
    let got = collect(store, layer, ids).expect("served through the pread fallback");
    assert_same(want, layer, &got, "after the ring was given up");
    store.check_consistency(true).expect("consistent");
}

/// A regression of the give-up logic would leave a request waiting for ever: end the process
/// with a failure instead (a guard against hanging, far above the seconds this test takes).
/// Its sleep is the deadline itself, not a guess at when an event has happened.
fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        // Straight to stderr: the test harness captures `eprintln!` and would drop it.
        let msg =
            format!("still running after {limit:?}: a request waits for ever on a given-up ring\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
        std::process::exit(101);
    });
}

#[test]
fn a_failing_io_uring_enter_fails_its_request_and_pread_takes_over() {
    watchdog(Duration::from_secs(300));
    if let Err(e) = sluice_store::backend::uring_available() {
        eprintln!("io_uring unavailable ({e}): nothing to test");
        return;
    }
    let fx = Fixture::open("tiny-a");
    let want = reference(&fx);
    let l = fx.moe_layers[0];
    let (first, second): (Vec<u32>, Vec<u32>) = (0..16).partition(|i| i % 2 == 0);
    let stores = [store(&fx), store(&fx), store(&fx)];
    for (_, s, _) in &stores {
        let got = collect(s, l, &first).expect("the ring works before the filter");
        assert_same(&want, l, &got, "before");
        assert_eq!(s.io_backend(), "io_uring");
    }
    let [(_, a, a_fd), (_, b, b_fd), (stalls, c, c_fd)] = &stores;

    // Not transient: the first failure gives the ring up.
    if let Err(e) = fail_enter(*a_fd, libc::EINVAL) {
        eprintln!("cannot install a seccomp filter ({e}): nothing to test");
        return;
    }
    let err = collect(a, l, &second).expect_err("the request that needs the ring fails");
    assert_enter_error(&err, "os error 22", "EINVAL");
    assert_fallback_works(&fx, a, &want, (l, &second));

    // Transient: retried, then given up.
    fail_enter(*b_fd, libc::EAGAIN).expect("a second filter");
    let err = collect(b, l, &second).expect_err("the request that needs the ring fails");
    assert_enter_error(&err, &format!("{ENTER_ATTEMPTS} times in a row"), "EAGAIN");
    assert_enter_error(&err, "os error 11", "EAGAIN");
    assert_fallback_works(&fx, b, &want, (l, &second));

    // Given up while the kernel holds the stall timers of two reads (or while it holds the
    // later one, if the earlier expired first): each read fails when its timer expires, since
    // it would need the ring, the first failing the request; nothing waits for ever.
    let span = |id: u32| c.index().get(l, id).expect("expert").spans()[0];
    let (near, far) = (span(second[0]), span(second[second.len() - 1]));
    // Neither stall may hit the other's read (aligned reads of neighbours share pages).
    let reads_into = |a: Span, b: Span| {
        a.file == b.file
            && a.read_offset() < b.offset + b.len
            && b.offset < a.read_offset() + a.region_len()
    };
    assert!(!reads_into(near, far) && !reads_into(far, near), "apart on disk");
    for (s, ms) in [(near, 300), (far, 1500)] {
        let at = When::Overlaps { file: s.file, start: s.offset, end: s.offset + s.len };
        stalls.inject(at, Fault::Stall(Duration::from_millis(ms)), Some(1));
    }
    std::thread::scope(|scope| {
        let request = scope.spawn(|| collect(c, l, &second));
        assert!(
            stalls.wait_faults(2, Duration::from_secs(60)),
            "the stalled reads were never prepared"
        );
        fail_enter(*c_fd, libc::EINVAL).expect("a third filter");
        let err = request.join().expect("no panic").expect_err("the request fails");
        assert_enter_error(&err, "os error 22", "EINVAL with reads in the kernel");
    });
    assert_fallback_works(&fx, c, &want, (l, &second));
}
