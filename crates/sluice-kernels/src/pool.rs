//! The thread pool the kernels split output rows over: the calling thread works too, and
//! helpers spin briefly between calls before they park.
//!
//! A pass makes thousands of kernel calls from the engine's own thread. Handed to rayon from
//! outside its pool, each call injects a job, wakes a worker and puts the caller to sleep on a
//! latch until the workers finish: two context switches per call, tens of microseconds on a
//! busy machine, and the caller's core idles meanwhile. Here a call publishes the job, the
//! caller claims chunks itself, and helpers that are still spinning from the previous call
//! join within a fraction of a microsecond; a helper that found no work for
//! [`SPIN_ROUNDS`] rounds parks on a condition variable (so an idle engine burns no CPU) and
//! is woken by the next call.
//!
//! Only the split changes with the pool: every chunk is a set of whole output rows computed
//! by the same code, so neither the number of threads nor which thread took a chunk changes a
//! result bit (see [`crate::matmul`]). A pool runs one call at a time; a second caller (another
//! engine thread, or a chunk calling back into the kernels) does not wait but runs all of its
//! chunks itself.

mod counters;

pub use counters::PoolCounters;
use counters::Tally;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::Instant;

/// Rounds a helper polls for the next call before it parks (each round is a CPU pause hint;
/// every 64th yields the core). Tens of microseconds: long enough to bridge the gap between
/// the kernel calls of one pass, short enough not to take a shared core from others for long.
pub const SPIN_ROUNDS: u32 = 1 << 14;

/// The environment variable that sets the size of the process-wide pool.
pub const THREADS_ENV: &str = "SLUICE_THREADS";

/// In the low half of the state word: no chunk may be claimed (a call is being published).
const CLOSED: u64 = u32::MAX as u64;

/// The job a call publishes: a type-erased `&&(dyn Fn(usize) + Sync)` that lives on the
/// caller's stack until every claimed chunk has finished.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// What the caller and the helpers share.
struct Shared {
    /// `generation << 32 | next chunk`: a helper claims chunk `i` of generation `g` by
    /// moving the word from `(g, i)` to `(g, i + 1)`, so a claim can never mix the chunk index
    /// of one call with the job of another.
    state: AtomicU64,
    /// Pointer to the current call's [`Job`] reference.
    job: AtomicPtr<()>,
    /// Chunks in the current call.
    chunks: AtomicUsize,
    /// Whether each thread claims at most one chunk of the current call
    /// ([`Pool::on_every_thread`]).
    once: AtomicBool,
    /// Chunks of the current call that have finished (or panicked).
    done: AtomicUsize,
    /// Whether a chunk of the current call panicked on a helper.
    panicked: AtomicBool,
    /// Helpers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    /// Set when the pool is dropped.
    shutdown: AtomicBool,
    /// Held by the call in progress (one call at a time).
    busy: Mutex<()>,
    /// Guards parking.
    park: Mutex<()>,
    /// Wakes parked helpers.
    wake: Condvar,
    /// What the calls so far cost ([`Pool::counters`]).
    counters: Tally,
}

/// A pool of `threads − 1` helper threads plus whichever thread calls [`Pool::run`].
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    threads: usize,
    /// The buffers a prefill call's activations are packed into, lent to one call at a time.
    pack: crate::packed::PackBuf,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish_non_exhaustive()
    }
}

/// Why a pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Zero threads were asked for.
    #[error("a pool needs at least one thread")]
    NoThreads,
    /// The operating system refused a helper thread.
    #[error("cannot start helper thread {index} of {threads}: {source}")]
    Spawn {
        /// Which helper.
        index: usize,
        /// Threads asked for.
        threads: usize,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// [`Pool::on_every_thread`] found the pool running another call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the kernel pool is running another call, so its helper threads are not free")]
pub struct PoolBusy;

impl Pool {
    /// A pool of `threads` threads in all: the caller of [`Pool::run`] and `threads − 1`
    /// helpers.
    pub fn new(threads: usize) -> Result<Self, PoolError> {
        if threads == 0 {
            return Err(PoolError::NoThreads);
        }
        // Generation 0, closed: helpers start having seen it (see `helper`).
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            chunks: AtomicUsize::new(0),
            once: AtomicBool::new(false),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            busy: Mutex::new(()),
            park: Mutex::new(()),
            wake: Condvar::new(),
            counters: Tally::default(),
        });
        let mut pool = Self {
            shared,
            helpers: Vec::new(),
            threads,
            pack: crate::packed::PackBuf::new(threads),
        };
        for index in 1..threads {
            let s = Arc::clone(&pool.shared);
            let h = std::thread::Builder::new()
                .name(format!("sluice-kernel-{index}"))
                .spawn(move || helper(&s))
                .map_err(|source| PoolError::Spawn { index, threads, source })?;
            // On an early return `pool` is dropped, which stops the helpers started so far.
            pool.helpers.push(h);
        }
        Ok(pool)
    }

    /// Threads that take part in a call (the caller included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// What this pool's calls have cost so far (see [`PoolCounters`]).
    pub fn counters(&self) -> PoolCounters {
        self.shared.counters.snapshot()
    }

    /// Runs `f(0), …, f(chunks − 1)`, each exactly once, spread over the calling thread and
    /// the helpers; returns when all have finished. If the pool is busy with another call, the
    /// calling thread runs every chunk itself.
    ///
    /// # Panics
    /// If a chunk panics: once every chunk has finished, the panic is resumed on the caller.
    pub fn run(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        let t0 = Instant::now();
        let guard = match self.shared.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // A call from inside a chunk (or another thread): its time is inside the
                // outer call's, so it is not counted again.
                (0..chunks).for_each(f);
                return;
            }
        };
        if self.helpers.is_empty() || chunks <= 1 {
            (0..chunks).for_each(f);
            self.shared.counters.alone(t0);
            return;
        }
        let s = &*self.shared;
        let chunks_u32 = u32::try_from(chunks).expect("invariant: fewer than 2^32 chunks");
        let job: Job<'_> = f;
        let (g, woke) = publish(s, &job, chunks, false);
        // The caller claims chunks like any helper; its own panic is held until every chunk
        // has finished, since helpers may still be using `job` on this stack frame.
        let mut ran = 0u64;
        let mine = panic::catch_unwind(AssertUnwindSafe(|| {
            while let Some(i) = claim(s, g, chunks_u32) {
                f(i);
                ran += 1;
                s.done.fetch_add(1, Ordering::Release);
            }
        }));
        if mine.is_err() {
            // The chunk that panicked counts as finished; stop further claims.
            s.done.fetch_add(1, Ordering::Release);
            close_and_count_unclaimed(s, g, chunks_u32);
        }
        let t1 = Instant::now();
        finish(s, chunks);
        s.counters.split(t0, t1, chunks, ran, woke);
        drop(guard);
        resume(s, mine);
    }

    /// Runs `f` exactly once on each of the pool's [`threads`](Self::threads) threads (the
    /// calling thread and every helper), each with its own index below `threads`; returns
    /// when all have finished. For per-thread state that work made by a thread keeps (a
    /// kernel's scratch): made up front, it is in place before anything is measured or run.
    ///
    /// A helper takes its call when it next looks for work, waking from its park if need be,
    /// so this waits for every helper but for nothing else.
    ///
    /// # Errors
    /// [`PoolBusy`] if the pool is running another call (another thread's, or the one this
    /// is called from inside of): its helpers are taken, and waiting for them from inside a
    /// chunk would never end. Nothing has run then.
    ///
    /// # Panics
    /// If `f` panics on any thread: once every thread has finished, the panic is resumed on
    /// the caller.
    pub fn on_every_thread(&self, f: &(dyn Fn(usize) + Sync)) -> Result<(), PoolBusy> {
        let guard = match self.shared.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(PoolBusy),
        };
        if self.helpers.is_empty() {
            let t0 = Instant::now();
            f(0);
            self.shared.counters.alone(t0);
            return Ok(());
        }
        let t0 = Instant::now();
        let s = &*self.shared;
        let job: Job<'_> = f;
        // One chunk per thread, each thread claiming at most one (`Shared::once`): the
        // caller takes one, so each helper must take one of the rest before `done` can reach
        // `threads`.
        let (g, woke) = publish(s, &job, self.threads, true);
        let chunks_u32 = u32::try_from(self.threads).expect("invariant: fewer than 2^32 threads");
        let mine = panic::catch_unwind(AssertUnwindSafe(|| {
            if let Some(i) = claim(s, g, chunks_u32) {
                f(i);
            }
        }));
        // Counted whether it returned or panicked; the helpers' chunks are still theirs to
        // claim, so none is counted for them here.
        s.done.fetch_add(1, Ordering::Release);
        let t1 = Instant::now();
        finish(s, self.threads);
        s.counters.split(t0, t1, self.threads, 1, woke);
        drop(guard);
        resume(s, mine);
        Ok(())
    }

    /// How many buffers this pool rotates a prefill's packed activations through
    /// ([`crate::pack_buffers`] of its threads unless set otherwise).
    pub fn pack_buffers(&self) -> usize {
        self.pack.buffers()
    }

    /// Keeps `buffers` pack buffers (1 to 8) from now on: a memory plan that cannot spare
    /// them keeps one ([`crate::pool_scratch_bytes`]). Buffers made already are freed now.
    /// Waits for a call that holds them.
    pub fn set_pack_buffers(&self, buffers: usize) {
        self.pack.set_buffers(buffers);
    }

    /// The buffers this pool lends a packed prefill call ([`crate::packed`]).
    pub(crate) fn pack_buf(&self) -> &crate::packed::PackBuf {
        &self.pack
    }

    /// Makes `self` the pool that [`current`] returns on this thread while `f` runs.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Pool);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(std::ptr::from_ref(self))));
        f()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _park = self.shared.park.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            // A helper never panics (chunks run under `catch_unwind`); nothing to report.
            let _ = h.join();
        }
    }
}

/// Publishes `job` as a call of `chunks` chunks (each thread claiming at most one if
/// `once`), wakes parked helpers, and returns its generation and whether any helper was
/// parked. The caller holds `busy` and keeps `job` alive until [`finish`] returns.
fn publish(s: &Shared, job: &Job<'_>, chunks: usize, once: bool) -> (u64, bool) {
    // Close the previous generation before touching the job fields, so that a helper that
    // read them cannot then claim a chunk (see `Shared::state`).
    let g = (s.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & u64::from(u32::MAX);
    s.state.store(g << 32 | CLOSED, Ordering::SeqCst);
    s.job.store(std::ptr::from_ref(job).cast_mut().cast(), Ordering::SeqCst);
    s.chunks.store(chunks, Ordering::SeqCst);
    s.once.store(once, Ordering::SeqCst);
    s.done.store(0, Ordering::SeqCst);
    s.panicked.store(false, Ordering::SeqCst);
    s.state.store(g << 32, Ordering::SeqCst);
    let parked = s.sleepers.load(Ordering::SeqCst) > 0;
    if parked {
        let _park = s.park.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.wake.notify_all();
    }
    (g, parked)
}

/// Waits until `chunks` chunks of the current call count as finished.
fn finish(s: &Shared, chunks: usize) {
    let mut spins = 0u32;
    while s.done.load(Ordering::Acquire) < chunks {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// After a call has finished and released `busy`: resumes the caller's own panic (`mine`),
/// or panics if a helper's chunk did.
fn resume(s: &Shared, mine: std::thread::Result<()>) {
    if let Err(p) = mine {
        panic::resume_unwind(p);
    }
    assert!(!s.panicked.load(Ordering::Acquire), "a kernel chunk panicked on a pool thread");
}

/// Claims the next chunk of generation `g`, if any is left.
fn claim(s: &Shared, g: u64, chunks: u32) -> Option<usize> {
    let mut cur = s.state.load(Ordering::Acquire);
    loop {
        let (cg, i) = (cur >> 32, cur & CLOSED);
        if cg != g || i >= u64::from(chunks) {
            return None;
        }
        match s.state.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return usize::try_from(i).ok(),
            Err(now) => cur = now,
        }
    }
}

/// After a chunk panicked on the caller: closes generation `g` to further claims and counts
/// the chunks nobody claimed as finished.
fn close_and_count_unclaimed(s: &Shared, g: u64, chunks: u32) {
    let prev = s.state.swap(g << 32 | CLOSED, Ordering::AcqRel);
    let claimed = (prev & CLOSED).min(u64::from(chunks));
    let unclaimed = usize::try_from(u64::from(chunks) - claimed).unwrap_or(0);
    s.done.fetch_add(unclaimed, Ordering::Release);
}

/// A helper thread: waits for a new generation (spinning, then parked), claims and runs its
/// chunks, and repeats until the pool is dropped.
fn helper(s: &Shared) {
    // The generation the pool started at, not the one this thread first reads: a call
    // published before the thread got to run is one it has not seen (reading the state here
    // skipped it, which `run` survives, its caller taking every chunk, but
    // `on_every_thread` waits for each helper's).
    let mut seen = 0;
    loop {
        let g = match wait_for_call(s, seen) {
            Some(g) => g,
            None => return,
        };
        seen = g;
        // The job fields are read before any claim; a successful claim of generation `g`
        // proves they were still `g`'s (the caller closes `g` before rewriting them).
        let chunks = u32::try_from(s.chunks.load(Ordering::SeqCst)).unwrap_or(0);
        let job = s.job.load(Ordering::SeqCst).cast::<Job<'_>>().cast_const();
        let once = s.once.load(Ordering::SeqCst);
        while let Some(i) = claim(s, g, chunks) {
            // SAFETY: the claim of chunk `i` of generation `g` succeeded, so `job` points to
            // that call's `Job` reference on the caller's stack, and the caller does not
            // return (nor publish another call) until this chunk counts as done below.
            let f = unsafe { *job };
            if panic::catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
            s.done.fetch_add(1, Ordering::Release);
            if once {
                break;
            }
        }
    }
}

/// Waits until the state shows a generation other than `seen` with chunks open, or the pool
/// shuts down (`None`).
fn wait_for_call(s: &Shared, seen: u64) -> Option<u64> {
    let open = |st: u64| (st >> 32 != seen && st & CLOSED != CLOSED).then_some(st >> 32);
    for round in 0..SPIN_ROUNDS {
        if s.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(g) = open(s.state.load(Ordering::Acquire)) {
            return Some(g);
        }
        if round % 64 == 63 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let mut guard = s.park.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let found = loop {
        if s.shutdown.load(Ordering::SeqCst) {
            break None;
        }
        if let Some(g) = open(s.state.load(Ordering::SeqCst)) {
            break Some(g);
        }
        guard = s.wake.wait(guard).unwrap_or_else(std::sync::PoisonError::into_inner);
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    found
}

thread_local! {
    /// The pool [`Pool::install`] set on this thread, if any.
    static CURRENT: Cell<*const Pool> = const { Cell::new(std::ptr::null()) };
}

/// The pool the kernels use on this thread: the one [`Pool::install`] set, else the
/// process-wide pool ([`global`]).
pub fn with_current<R>(f: impl FnOnce(&Pool) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    if p.is_null() {
        f(global())
    } else {
        // SAFETY: `install` sets the pointer from a `&Pool` that outlives the closure it
        // runs, and restores the previous value (on unwinding too) before that borrow ends.
        f(unsafe { &*p })
    }
}

/// `f(0), …, f(n − 1)` computed on the current pool ([`with_current`]), in index order. The
/// model code uses it for work split over heads; a kernel call inside `f` finds the pool busy
/// and runs inline, so no second pool competes for the cores.
pub fn map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let slots: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    with_current(|pool| {
        pool.run(n, &|i| {
            let v = f(i);
            *slots[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
        });
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .expect("invariant: `run` returns after every index ran (a panic propagates)")
        })
        .collect()
}

/// [`map`] over the `chunk`-element pieces of `data` (the last may be shorter), each piece
/// handed to `f` with its index, mutably.
pub fn map_chunks_mut<E: Send, T: Send>(
    data: &mut [E],
    chunk: usize,
    f: impl Fn(usize, &mut [E]) -> T + Sync,
) -> Vec<T> {
    let parts: Vec<Mutex<&mut [E]>> = data.chunks_mut(chunk.max(1)).map(Mutex::new).collect();
    map(parts.len(), |i| {
        let mut part = parts[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(i, &mut part)
    })
}

/// The process-wide pool: `SLUICE_THREADS` threads when that is a positive number, else one
/// per available core. Started on first use; if helpers cannot be started, calls run on the
/// calling thread alone.
pub fn global() -> &'static Pool {
    static GLOBAL: OnceLock<Pool> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let threads = std::env::var(THREADS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        Pool::new(threads)
            .or_else(|_| Pool::new(1))
            .expect("invariant: a one-thread pool starts no thread")
    })
}

#[cfg(test)]
mod tests;
