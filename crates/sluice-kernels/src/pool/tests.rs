//! Tests of the pool: every chunk once, index order, nesting, parking, panics, and
//! [`Pool::on_every_thread`].

use super::*;
use std::sync::atomic::AtomicU32;

#[test]
fn every_chunk_once_in_many_calls() {
    for threads in [1, 2, 3, 5] {
        let pool = Pool::new(threads).expect("pool");
        for chunks in [0, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..chunks).map(|_| AtomicU32::new(0)).collect();
            pool.run(chunks, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{threads} {chunks}");
        }
    }
}

#[test]
fn map_keeps_index_order_and_chunks_are_disjoint() {
    let pool = Pool::new(3).expect("pool");
    pool.install(|| {
        assert_eq!(map(100, |i| i * i), (0..100).map(|i| i * i).collect::<Vec<_>>());
        let mut data: Vec<usize> = vec![0; 10];
        let sums = map_chunks_mut(&mut data, 4, |i, part| {
            part.iter_mut().for_each(|v| *v = i + 1);
            part.len()
        });
        assert_eq!(sums, vec![4, 4, 2]);
        assert_eq!(data, vec![1, 1, 1, 1, 2, 2, 2, 2, 3, 3]);
        assert!(map(0, |i| i).is_empty());
    });
}

#[test]
fn concurrent_callers_and_nested_calls() {
    let pool = Pool::new(3).expect("pool");
    let total = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                for _ in 0..200 {
                    pool.run(8, &|_| {
                        // A nested call finds the pool busy and runs inline.
                        pool.run(2, &|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    });
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 8 * 2);
}

#[test]
fn parked_helpers_wake() {
    let pool = Pool::new(2).expect("pool");
    let n = AtomicUsize::new(0);
    for _ in 0..3 {
        // The event: the helper has passed its spin rounds and counts itself a sleeper
        // (under the park lock, just before it waits on the condvar), so this call has to
        // wake it.
        while pool.shared.sleepers.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        pool.run(16, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(n.load(Ordering::Relaxed), 48);
}

#[test]
fn a_panicking_chunk_reaches_the_caller_and_the_pool_survives() {
    let pool = Pool::new(2).expect("pool");
    for bad in [0usize, 5, 31] {
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(32, &|i| assert_ne!(i, bad, "chunk {i}"));
        }));
        assert!(r.is_err(), "chunk {bad} panicked");
    }
    let n = AtomicUsize::new(0);
    pool.run(10, &|_| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 10);
}

/// The last attempt at warming every pool thread's scratch hung: it ran `threads` chunks
/// through `run` with a barrier of `threads` parties, but `run` may hand every chunk to
/// the caller, so the first chunk waited forever for threads that never came.
#[test]
fn a_barrier_of_every_pool_thread_hung_under_run_so_on_every_thread_reaches_each_once() {
    for threads in [1, 2, 3, 5] {
        let pool = Pool::new(threads).expect("pool");
        for round in 0..50 {
            if round % 10 == 9 {
                // Now and then with every helper parked, so the call has to wake them.
                while pool.shared.sleepers.load(Ordering::SeqCst) < threads - 1 {
                    std::thread::yield_now();
                }
            }
            let seen: Mutex<Vec<(usize, std::thread::ThreadId)>> = Mutex::new(Vec::new());
            // Every thread waits here for all the others, which only terminates if each
            // thread runs `f` exactly once at the same time as the rest.
            let barrier = std::sync::Barrier::new(threads);
            pool.on_every_thread(&|i| {
                seen.lock().expect("lock").push((i, std::thread::current().id()));
                barrier.wait();
            })
            .expect("an idle pool");
            let mut seen = seen.into_inner().expect("lock");
            seen.sort_by_key(|&(i, _)| i);
            assert_eq!(
                seen.iter().map(|&(i, _)| i).collect::<Vec<_>>(),
                (0..threads).collect::<Vec<_>>()
            );
            let ids: std::collections::HashSet<_> = seen.iter().map(|&(_, id)| id).collect();
            assert!(ids.contains(&std::thread::current().id()), "the caller takes part");
            assert_eq!(ids.len(), threads, "{threads} threads, round {round}");
        }
        // Plain calls still work between and after.
        let n = AtomicUsize::new(0);
        pool.run(64, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 64);
    }
}

/// A helper read the generation it had "seen" when its thread began to run, so a call
/// published between `Pool::new` and that moment was skipped: `on_every_thread` then waited
/// forever for the parked helper (the working-memory test hung on the process-wide pool's
/// first call). Fresh pools, each called at once, race the helpers' start.
#[test]
fn a_helper_that_started_after_the_first_call_was_published_skipped_it() {
    for _ in 0..100 {
        let pool = Pool::new(3).expect("pool");
        let n = AtomicUsize::new(0);
        pool.on_every_thread(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .expect("an idle pool");
        assert_eq!(n.load(Ordering::Relaxed), 3);
    }
}

#[test]
fn on_every_thread_from_inside_a_call_is_refused_and_panics_reach_the_caller() {
    let pool = Pool::new(3).expect("pool");
    let refused = AtomicUsize::new(0);
    pool.run(4, &|_| {
        if pool.on_every_thread(&|_| {}) == Err(PoolBusy) {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert_eq!(refused.load(Ordering::Relaxed), 4);
    for bad in [0usize, 2] {
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            let _ = pool.on_every_thread(&|i| assert_ne!(i, bad, "thread {i}"));
        }));
        assert!(r.is_err(), "index {bad} panicked");
    }
    let n = AtomicUsize::new(0);
    pool.on_every_thread(&|_| {
        n.fetch_add(1, Ordering::Relaxed);
    })
    .expect("idle again");
    assert_eq!(n.load(Ordering::Relaxed), 3);
}

#[test]
fn install_scopes_the_current_pool() {
    let a = Pool::new(3).expect("pool");
    assert_eq!(a.install(|| with_current(Pool::threads)), 3);
    let b = Pool::new(1).expect("pool");
    a.install(|| {
        assert_eq!(b.install(|| with_current(Pool::threads)), 1);
        assert_eq!(with_current(Pool::threads), 3);
    });
    assert!(matches!(Pool::new(0), Err(PoolError::NoThreads)));
}

#[test]
fn counters_tell_split_calls_from_calls_run_alone_and_count_nested_calls_once() {
    let pool = Pool::new(3).expect("pool");
    let before = pool.counters();
    pool.run(24, &|_| {
        // A call from inside a chunk runs inline and is inside the outer call's time.
        pool.run(4, &|_| {});
    });
    pool.run(1, &|_| {});
    pool.on_every_thread(&|_| {}).expect("idle");
    let c = pool.counters().since(&before);
    assert_eq!(c.calls, 3, "{c:?}");
    assert_eq!(c.split, 2, "{c:?}");
    assert_eq!(c.chunks, 24 + 3, "{c:?}");
    assert!(c.caller_chunks >= 1 && c.caller_chunks <= 24 + 1, "{c:?}");
    assert!(c.tail_ns <= c.busy_ns, "{c:?}");
    assert_eq!(Pool::new(1).expect("pool").counters(), PoolCounters::default());
}
