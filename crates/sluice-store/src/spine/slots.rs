//! The stream buffers of a [`super::SpineStore`] and their state machine.
//!
//! Each buffer holds at most one piece. Its state lives under one mutex; a condition variable
//! wakes waiters whenever a chunk read ends or a buffer is unpinned.
//!
//! ```text
//! empty ──start_load──► loading (inflight > 0) ──last chunk ok──► ready ──pin/unpin──► ready
//!                          │                                        │ (pins == 0, inflight == 0)
//!                          └──a chunk failed──► failed ──acquire──► empty (error returned)
//! ```
//!
//! A load starts only into a buffer with no pins and no chunk in flight, so the bytes a guard
//! reads are never written under it, and two loads never write one buffer at once.

use super::layout::AlignedBuf;
use super::{add, chunks, read_chunk, Shared, SpineIndex};
use crate::index::Span;
use crate::io::clone_io_error;
use crate::reader::{Priority, ReaderPool};
use crate::StoreError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// A failed read, kept until the acquire that waits for it reports it.
#[derive(Debug)]
pub(crate) struct ReadFailure {
    file: usize,
    offset: u64,
    len: u64,
    error: std::io::Error,
}

impl ReadFailure {
    pub(crate) fn new(span: &Span, error: std::io::Error) -> Self {
        Self { file: span.file, offset: span.offset, len: span.len, error }
    }

    /// The error for the caller, naming the piece, file and byte range.
    pub(crate) fn into_error(self, index: &SpineIndex, piece: usize) -> StoreError {
        StoreError::SpineRead {
            piece: index.piece(piece).map_or_else(|| format!("piece {piece}"), |p| p.name().into()),
            path: index.path(self.file).to_path_buf(),
            offset: self.offset,
            len: self.len,
            source: self.error,
        }
    }

    fn duplicate(&self) -> Self {
        Self { error: clone_io_error(&self.error), ..*self }
    }
}

/// One stream buffer's state.
#[derive(Debug, Default)]
pub(crate) struct BufState {
    piece: Option<usize>,
    generation: u64,
    inflight: usize,
    failure: Option<ReadFailure>,
    pins: usize,
}

/// The stream buffers.
#[derive(Debug)]
pub(crate) struct Buffers {
    bufs: Vec<AlignedBuf>,
    state: Mutex<Vec<BufState>>,
    cv: Condvar,
}

impl Buffers {
    pub(crate) fn new(bufs: Vec<AlignedBuf>) -> Self {
        let state = (0..bufs.len()).map(|_| BufState::default()).collect();
        Self { bufs, state: Mutex::new(state), cv: Condvar::new() }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<BufState>> {
        // Updates under this lock are single assignments, so a poisoned lock is still sound.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn buf(&self, b: usize) -> &AlignedBuf {
        &self.bufs[b]
    }

    pub(crate) fn unpin(&self, b: usize) {
        let mut st = self.lock();
        if let Some(s) = st.get_mut(b) {
            s.pins = s.pins.saturating_sub(1);
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// The end of one chunk read; runs on drop, so a job that panics or is dropped unrun still
/// ends its chunk.
struct ChunkDone {
    shared: Arc<Shared>,
    buffer: usize,
    generation: u64,
    result: Option<Result<u64, ReadFailure>>,
}

impl ChunkDone {
    fn set(&mut self, r: Result<u64, ReadFailure>) {
        self.result = Some(r);
    }
}

impl Drop for ChunkDone {
    fn drop(&mut self) {
        let sh = &*self.shared;
        let mut st = sh.buffers.lock();
        let s = &mut st[self.buffer];
        s.inflight = s.inflight.saturating_sub(1);
        let current = s.generation == self.generation && s.piece.is_some();
        match self.result.take() {
            Some(Ok(n)) => add(&sh.counters.bytes_read, n),
            Some(Err(f)) if current => {
                s.failure.get_or_insert(f);
            }
            Some(Err(_)) => {}
            None if current => {
                let e = std::io::Error::other("the spine read job ended without reading");
                s.failure.get_or_insert(ReadFailure { file: 0, offset: 0, len: 0, error: e });
            }
            None => {}
        }
        drop(st);
        sh.buffers.cv.notify_all();
    }
}

/// Starts reading `piece` into buffer `b`, which must have no pins and no chunk in flight.
pub(crate) fn start_load(
    sh: &Arc<Shared>,
    pool: &ReaderPool,
    st: &mut [BufState],
    b: usize,
    piece: usize,
) {
    let Some(layout) = sh.index.piece(piece) else { return };
    let s = &mut st[b];
    debug_assert!(s.pins == 0 && s.inflight == 0, "load into a busy stream buffer");
    s.generation += 1;
    s.piece = Some(piece);
    s.failure = None;
    let parts = chunks(layout);
    s.inflight = parts.len();
    add(&sh.counters.piece_reads, 1);
    for (span, chunk) in parts {
        let mut done =
            ChunkDone { shared: sh.clone(), buffer: b, generation: s.generation, result: None };
        pool.submit(Priority::Demand, move || {
            let buf = done.shared.buffers.buf(done.buffer);
            // SAFETY: the chunks of one load are disjoint ranges of buffer `b`; no guard reads
            // it while `inflight > 0`, and no other load starts into it until every chunk of
            // this one has ended (each ends exactly once, when `done` drops).
            let r = unsafe { read_chunk(&*done.shared.reader, &span, &chunk, buf) };
            done.set(r);
        });
    }
}

/// Pins the buffer holding `piece`, waiting for its read. With `load`, a piece in no buffer
/// is read into a free one, and afterwards `next` (the following streamed piece) is started
/// into the other buffer if that one is free. Without `load`, a piece in no buffer, or whose
/// read failed, is an error and nothing starts.
pub(crate) fn pin(
    sh: &Arc<Shared>,
    pool: &ReaderPool,
    piece: usize,
    next: Option<usize>,
    load: bool,
) -> Result<usize, StoreError> {
    let bufs = &sh.buffers;
    let mut st = bufs.lock();
    let b = loop {
        if let Some(b) = st.iter().position(|s| s.piece == Some(piece)) {
            if st[b].failure.is_some() {
                if !load {
                    let f = st[b].failure.as_ref().map(ReadFailure::duplicate);
                    return Err(f.map_or_else(
                        || StoreError::Config("spine read failed".into()),
                        |f| f.into_error(&sh.index, piece),
                    ));
                }
                // Report the failure once and empty the buffer, so the next acquire reads the
                // piece again (chunks still in flight finish before any new load starts).
                let f = st[b].failure.take();
                st[b].piece = None;
                drop(st);
                bufs.cv.notify_all();
                return Err(f.map_or_else(
                    || StoreError::Config("spine read failed".into()),
                    |f| f.into_error(&sh.index, piece),
                ));
            }
            if st[b].inflight == 0 {
                st[b].pins += 1;
                break b;
            }
        } else if !load {
            return Err(StoreError::Config(format!("spine piece {piece} is not in a buffer")));
        } else {
            // Prefer a buffer that does not hold the piece needed next.
            let free = (0..st.len())
                .filter(|&i| st[i].pins == 0 && st[i].inflight == 0)
                .min_by_key(|&i| st[i].piece.is_some() && st[i].piece == next);
            if let Some(i) = free {
                start_load(sh, pool, &mut st, i, piece);
                continue;
            }
        }
        st = bufs.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
    };
    if let (true, Some(nx)) = (load, next) {
        let held = st.iter().any(|s| s.piece == Some(nx));
        if nx != piece && !held {
            if let Some(i) = (0..st.len()).find(|&i| st[i].pins == 0 && st[i].inflight == 0) {
                start_load(sh, pool, &mut st, i, nx);
            }
        }
    }
    Ok(b)
}
