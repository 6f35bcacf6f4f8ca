//! [`SpineStore`]: the spine (everything but routed experts) placed piece by piece as the plan
//! decides, in memory charged to the budget.
//!
//! - **Resident** pieces are read once at open into owned buffers and stay.
//! - **Streamed** pieces share two buffers (one when a single piece streams). Acquiring
//!   streamed piece `j` starts reading the next streamed piece (cyclically: after the last
//!   comes the first of the next pass) into the other buffer, so piece `j + 1` is read while
//!   piece `j` computes, and the first streamed piece of a pass is read while the previous
//!   pass's tail and the resident prefix compute.
//! - **Rows** pieces (the embedding) are never held whole: a pass reads just the rows of its
//!   tokens into a one-row scratch buffer.
//!
//! A read is split into chunks of [`CHUNK`] bytes on a reader pool, so a piece keeps several
//! reads in flight; at open, the chunks of every resident piece are queued together, into
//! buffers that are not zeroed first (the reads write every byte). A chunk already wholly in
//! the page cache is copied from there ([`crate::io::FromCache`]); any other is read uncached,
//! so loading a model grows the page cache by nothing either way. Every read goes through [`ReadAt`], so faults can be injected: a failed
//! read fails the acquire that waited for it with the piece, file and offset named, the buffer
//! is emptied, and the next acquire reads the piece again.

mod layout;

pub use layout::{PieceLayout, SpineIndex, TensorRange, MERGE_GAP};

use crate::index::{Span, ALIGN};
use crate::io::{read_span, FromCache, ReadAt};
use crate::reader::{Priority, ReaderPool};
use crate::StoreError;
use layout::AlignedBuf;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

mod slots;
use slots::{Buffers, ReadFailure};

/// Bytes per read request of a streamed or resident piece.
pub const CHUNK: u64 = 4 << 20;

/// Where one piece lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Read once at open into its own buffer.
    Resident,
    /// Read into one of the two stream buffers each time a pass needs it.
    Streamed,
    /// Only single rows are read, per pass (for the embedding table).
    Rows,
}

/// Spine I/O counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpineStats {
    /// Bytes read from storage since open (resident pieces at open included).
    pub bytes_read: u64,
    /// Bytes read at open for the resident pieces.
    pub resident_bytes_read: u64,
    /// Streamed-piece reads started (whole pieces).
    pub piece_reads: u64,
    /// Embedding rows read.
    pub row_reads: u64,
    /// Nanoseconds callers waited for spine bytes (streamed pieces and rows).
    pub wait_ns: u64,
}

/// Bytes the placement charges to the budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpineFootprint {
    /// Resident buffers.
    pub resident: u64,
    /// Each stream buffer.
    pub buffer: u64,
    /// Stream buffers (0, 1 or 2).
    pub buffers: u64,
    /// The row scratch buffer.
    pub rows: u64,
}

impl SpineFootprint {
    /// Everything charged.
    pub fn total(&self) -> u64 {
        self.resident + self.buffer * self.buffers + self.rows
    }
}

impl SpineFootprint {
    /// What `placements` of `index`'s pieces charge (the store charges exactly this).
    pub fn of(index: &SpineIndex, placements: &[Placement]) -> Self {
        let mut f = Self::default();
        let mut streamed = 0u64;
        for (p, &pl) in index.pieces().iter().zip(placements) {
            match pl {
                Placement::Resident => f.resident += p.buffer_len(),
                Placement::Streamed => {
                    streamed += 1;
                    f.buffer = f.buffer.max(p.buffer_len());
                }
                // The widest row of any tensor of the piece, plus a page of slack either side.
                Placement::Rows => f.rows = f.rows.max(row_scratch(p)),
            }
        }
        f.buffers = streamed.min(2);
        f
    }
}

/// Scratch bytes for reading one row of the largest tensor of a rows piece: rows are assumed
/// no wider than 1 MiB; the scratch holds one aligned row region.
fn row_scratch(_p: &PieceLayout) -> u64 {
    (1 << 20) + 2 * ALIGN
}

#[derive(Default)]
pub(crate) struct Counters {
    bytes_read: AtomicU64,
    resident_bytes_read: AtomicU64,
    piece_reads: AtomicU64,
    row_reads: AtomicU64,
    wait_ns: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn nanos(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// State the read jobs share with the store.
pub(crate) struct Shared {
    pub(crate) index: SpineIndex,
    pub(crate) reader: Arc<dyn ReadAt>,
    pub(crate) counters: Counters,
    pub(crate) buffers: Buffers,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("pieces", &self.index.pieces().len()).finish_non_exhaustive()
    }
}

/// The spine, placed (see the module docs).
#[derive(Debug)]
pub struct SpineStore {
    shared: Arc<Shared>,
    placements: Vec<Placement>,
    /// Streamed pieces in pass order.
    streamed: Vec<usize>,
    /// Position of each piece in `streamed`.
    stream_pos: Vec<Option<usize>>,
    resident: Vec<Option<AlignedBuf>>,
    rows: Mutex<Option<AlignedBuf>>,
    pool: ReaderPool,
    pass: Mutex<()>,
    footprint: SpineFootprint,
    _charges: Vec<Charge>,
}

/// A piece held for reading: resident, or a pinned stream buffer (unpinned on drop).
#[derive(Debug)]
pub struct PieceGuard<'a> {
    store: &'a SpineStore,
    piece: usize,
    bytes: &'a [u8],
    buffer: Option<usize>,
}

impl PieceGuard<'_> {
    /// The bytes of the tensor at `file`/`offset`/`len`, if this piece holds it.
    pub fn tensor(&self, file: usize, offset: u64, len: u64) -> Option<&[u8]> {
        let r = self.store.shared.index.piece(self.piece)?.locate(file, offset, len)?;
        self.bytes.get(r)
    }

    /// The piece index.
    pub fn piece(&self) -> usize {
        self.piece
    }
}

impl Drop for PieceGuard<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buffer {
            self.store.shared.buffers.unpin(b);
        }
    }
}

impl SpineStore {
    /// Places `index`'s pieces per `placements` (one per piece), charging `budget`, reads the
    /// resident pieces (with `readers` threads), and starts reading the first streamed pieces.
    pub fn open(
        index: SpineIndex,
        reader: Arc<dyn ReadAt>,
        placements: Vec<Placement>,
        readers: usize,
        budget: &MemoryBudget,
    ) -> Result<Self, StoreError> {
        let n = index.pieces().len();
        if placements.len() != n {
            return Err(StoreError::Config(format!(
                "{} spine placements for {n} pieces",
                placements.len()
            )));
        }
        let footprint = SpineFootprint::of(&index, &placements);
        let charge =
            |what: &str, bytes: u64| budget.charge(what, bytes).map_err(StoreError::SpineBudget);
        let mut charges = Vec::new();
        for (what, bytes) in [
            ("resident spine", footprint.resident),
            ("spine stream buffers", footprint.buffer * footprint.buffers),
            ("embedding row buffer", footprint.rows),
        ] {
            if bytes > 0 {
                charges.push(charge(what, bytes)?);
            }
        }
        let streamed: Vec<usize> =
            (0..n).filter(|&i| placements[i] == Placement::Streamed).collect();
        let mut stream_pos = vec![None; n];
        for (j, &p) in streamed.iter().enumerate() {
            stream_pos[p] = Some(j);
        }
        let nbuf = usize::try_from(footprint.buffers).unwrap_or(2);
        let mut bufs = Vec::with_capacity(nbuf);
        for _ in 0..nbuf {
            bufs.push(AlignedBuf::new(footprint.buffer)?);
        }
        let pool = ReaderPool::new(readers.max(1)).map_err(|e| {
            StoreError::Config(format!("cannot start {readers} spine reader threads: {e}"))
        })?;
        let shared = Arc::new(Shared {
            index,
            reader,
            counters: Counters::default(),
            buffers: Buffers::new(bufs),
        });
        let rows = if footprint.rows > 0 { Some(AlignedBuf::new(footprint.rows)?) } else { None };
        let mut store = Self {
            shared,
            placements,
            streamed,
            stream_pos,
            resident: (0..n).map(|_| None).collect(),
            rows: Mutex::new(rows),
            pool,
            pass: Mutex::new(()),
            footprint,
            _charges: charges,
        };
        store.read_resident()?;
        // Start the first two streamed pieces now, so the first pass does not wait for both.
        if let Some(&first) = store.streamed.first() {
            let sh = &store.shared;
            let mut st = sh.buffers.lock();
            slots::start_load(sh, &store.pool, &mut st, 0, first);
            if let (Some(&second), true) = (store.streamed.get(1), nbuf > 1) {
                slots::start_load(sh, &store.pool, &mut st, 1, second);
            }
        }
        Ok(store)
    }

    /// Reads every resident piece: all their chunks are queued at once, so the reader threads
    /// stay busy across piece boundaries, and the buffers are allocated without zeroing.
    fn read_resident(&mut self) -> Result<(), StoreError> {
        let sh = self.shared.clone();
        // The first failure of each piece, by piece.
        let failures: Arc<Mutex<Vec<(usize, ReadFailure)>>> = Arc::new(Mutex::new(Vec::new()));
        let mut reading = Vec::new();
        for (i, &pl) in self.placements.iter().enumerate() {
            if pl != Placement::Resident {
                continue;
            }
            let Some(piece) = sh.index.piece(i) else { continue };
            let chunks = chunks(piece);
            // SAFETY: every byte is written before the buffer is read: the chunks' regions are
            // written by their jobs (their unread tails zeroed by `read_chunk`), and what they
            // do not cover is zeroed here, before any job starts; a piece whose read fails is
            // dropped unread.
            let buf = Arc::new(unsafe { AlignedBuf::uninit(piece.buffer_len())? });
            zero_uncovered(&buf, &chunks);
            let mut handles = Vec::with_capacity(chunks.len());
            for (span, chunk) in chunks {
                let (sh2, buf2, failures2) = (sh.clone(), buf.clone(), failures.clone());
                handles.push(self.pool.submit(Priority::Demand, move || {
                    // SAFETY: the chunks of one piece are disjoint ranges of `buf`, and nobody
                    // reads `buf` until every chunk job has finished (the handles are waited
                    // for below before the buffer is stored).
                    let r = unsafe { read_chunk(&*sh2.reader, &span, &chunk, &buf2) };
                    match r {
                        Ok(n) => add(&sh2.counters.resident_bytes_read, n),
                        Err(e) => {
                            let mut f = failures2.lock().unwrap_or_else(PoisonError::into_inner);
                            if !f.iter().any(|(p, _)| *p == i) {
                                f.push((i, e));
                            }
                        }
                    }
                }));
            }
            reading.push((i, buf, handles));
        }
        let mut read = Vec::with_capacity(reading.len());
        for (i, buf, handles) in reading {
            for h in handles {
                h.wait();
            }
            read.push((i, buf));
        }
        let mut failed =
            std::mem::take(&mut *failures.lock().unwrap_or_else(PoisonError::into_inner));
        failed.sort_by_key(|(p, _)| *p);
        if let Some((i, f)) = failed.into_iter().next() {
            return Err(f.into_error(&sh.index, i));
        }
        for (i, buf) in read {
            let buf = Arc::try_unwrap(buf).map_err(|_| {
                StoreError::Config("invariant: resident read jobs have finished".into())
            })?;
            self.resident[i] = Some(buf);
        }
        let r = sh.counters.resident_bytes_read.load(Ordering::Relaxed);
        add(&sh.counters.bytes_read, r);
        Ok(())
    }

    /// The index the store was opened on.
    pub fn index(&self) -> &SpineIndex {
        &self.shared.index
    }

    /// Placement of every piece.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// What the store charges to the budget.
    pub fn footprint(&self) -> SpineFootprint {
        self.footprint
    }

    /// True when any piece streams or is read by rows (a pass then holds [`Self::begin_pass`]).
    pub fn streams(&self) -> bool {
        self.placements.iter().any(|&p| p != Placement::Resident)
    }

    /// Serialises passes: two passes interleaving their pieces would fight over two buffers.
    pub fn begin_pass(&self) -> MutexGuard<'_, ()> {
        self.pass.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counters so far.
    pub fn stats(&self) -> SpineStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SpineStats {
            bytes_read: g(&c.bytes_read),
            resident_bytes_read: g(&c.resident_bytes_read),
            piece_reads: g(&c.piece_reads),
            row_reads: g(&c.row_reads),
            wait_ns: g(&c.wait_ns),
        }
    }

    /// Piece `piece` for reading, waiting for its read if it streams; starts reading the next
    /// streamed piece into the other buffer. A rows piece cannot be acquired whole.
    pub fn acquire(&self, piece: usize) -> Result<PieceGuard<'_>, StoreError> {
        match self.placements.get(piece) {
            Some(Placement::Resident) => {
                let buf = self.resident.get(piece).and_then(Option::as_ref).ok_or_else(|| {
                    StoreError::Config(format!("resident spine piece {piece} was not read"))
                })?;
                // SAFETY: resident buffers are written only in `open`, before any guard exists.
                let bytes = unsafe { buf.bytes() };
                Ok(PieceGuard { store: self, piece, bytes, buffer: None })
            }
            Some(Placement::Streamed) => self.acquire_streamed(piece, true),
            Some(Placement::Rows) => {
                Err(StoreError::Config(format!("spine piece {piece} is read by rows, not whole")))
            }
            None => Err(StoreError::Config(format!("no spine piece {piece}"))),
        }
    }

    /// Piece `piece` if it is resident or already in (or on its way into) a stream buffer;
    /// `None` otherwise or if its read failed (the failure is reported to whoever acquires
    /// it). Never starts a read: for optional work such as expert prefetch.
    pub fn peek(&self, piece: usize) -> Option<PieceGuard<'_>> {
        match self.placements.get(piece)? {
            Placement::Resident => self.acquire(piece).ok(),
            Placement::Streamed => self.acquire_streamed(piece, false).ok(),
            Placement::Rows => None,
        }
    }

    fn acquire_streamed(&self, piece: usize, load: bool) -> Result<PieceGuard<'_>, StoreError> {
        let sh = &self.shared;
        let pos = self.stream_pos.get(piece).copied().flatten();
        let next = pos.map(|j| self.streamed[(j + 1) % self.streamed.len()]);
        let t0 = Instant::now();
        let b = slots::pin(sh, &self.pool, piece, next, load)?;
        add(&sh.counters.wait_ns, nanos(t0));
        // SAFETY: buffer `b` is ready and pinned: no load starts into a pinned buffer, so
        // nothing writes it until the guard unpins it.
        let bytes = unsafe { sh.buffers.buf(b).bytes() };
        Ok(PieceGuard { store: self, piece, bytes, buffer: Some(b) })
    }

    /// Reads rows `rows` (row `r` is bytes `offset + r·row_bytes ..` of `file`) of rows piece
    /// `piece` one at a time and calls `f(i, bytes)` for the `i`-th.
    pub fn read_rows(
        &self,
        piece: usize,
        tensor: TensorRange,
        row_bytes: u64,
        rows: &[usize],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let sh = &*self.shared;
        let layout = sh
            .index
            .piece(piece)
            .ok_or_else(|| StoreError::Config(format!("no spine piece {piece}")))?;
        let mut guard = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let scratch = guard
            .as_mut()
            .ok_or_else(|| StoreError::Config(format!("spine piece {piece} has no row buffer")))?;
        let t0 = Instant::now();
        for (i, &r) in rows.iter().enumerate() {
            let offset = u64::try_from(r).ok().and_then(|r| r.checked_mul(row_bytes));
            let span = match offset {
                Some(o) if o + row_bytes <= tensor.len => {
                    Span { file: tensor.file, offset: tensor.offset + o, len: row_bytes, region: 0 }
                }
                _ => {
                    return Err(StoreError::Config(format!(
                        "row {r} is outside {} ({} bytes of {row_bytes}-byte rows)",
                        layout.name(),
                        tensor.len
                    )))
                }
            };
            let region = usize::try_from(span.region_len()).unwrap_or(usize::MAX);
            // SAFETY: the row buffer is behind `self.rows`' lock, held here; nothing else
            // refers to it.
            let buf = unsafe { scratch.range_mut(0, region) }.ok_or_else(|| {
                StoreError::Config(format!("a {row_bytes}-byte row is wider than the row buffer"))
            })?;
            let n = read_span(&*sh.reader, &span, buf).map_err(|source| StoreError::SpineRead {
                piece: layout.name().to_string(),
                path: sh.index.path(span.file).to_path_buf(),
                offset: span.offset,
                len: span.len,
                source,
            })?;
            add(&sh.counters.bytes_read, n);
            add(&sh.counters.row_reads, 1);
            let lead = usize::try_from(span.lead()).unwrap_or(0);
            let len = usize::try_from(row_bytes).unwrap_or(usize::MAX);
            f(i, &buf[lead..lead + len]);
        }
        add(&sh.counters.wait_ns, nanos(t0));
        Ok(())
    }
}

/// One read request: the span piece of the piece's span it covers, and where it lands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    /// Buffer offset of the chunk's region.
    start: usize,
    /// Region bytes (a multiple of [`ALIGN`]).
    region: usize,
}

/// The piece's spans cut into [`CHUNK`]-sized aligned requests: `(sub-span, chunk)`.
pub(crate) fn chunks(piece: &PieceLayout) -> Vec<(Span, Chunk)> {
    let mut out = Vec::new();
    for s in piece.spans() {
        let base = s.read_offset();
        let needed = s.needed();
        let mut at = 0u64;
        while at < needed {
            let len = CHUNK.min(needed - at);
            let sub = Span { file: s.file, offset: base + at, len, region: s.region + at };
            let (Ok(start), Ok(region)) =
                (usize::try_from(sub.region), usize::try_from(sub.region_len()))
            else {
                break;
            };
            out.push((sub, Chunk { start, region }));
            at += len;
        }
    }
    out
}

/// Zeroes the bytes of `buf` that no chunk of `chunks` covers (none for a piece's own layout,
/// whose regions lie end to end, but the buffer is at least a page even for an empty piece).
fn zero_uncovered(buf: &AlignedBuf, chunks: &[(Span, Chunk)]) {
    let mut covered: Vec<(usize, usize)> =
        chunks.iter().map(|(_, c)| (c.start, c.start.saturating_add(c.region))).collect();
    covered.sort_unstable();
    let mut at = 0usize;
    for (start, end) in covered.into_iter().chain([(buf.len(), buf.len())]) {
        let gap_end = start.min(buf.len());
        if gap_end > at {
            // SAFETY: called before any read job of `buf` starts: nothing else refers to it.
            if let Some(gap) = unsafe { buf.range_mut(at, gap_end - at) } {
                gap.fill(0);
            }
        }
        at = at.max(end);
    }
}

/// Reads one chunk into its range of `buf`; returns the bytes transferred.
///
/// # Safety
///
/// No other reference to the chunk's range of `buf` may exist during the call.
pub(crate) unsafe fn read_chunk(
    reader: &dyn ReadAt,
    span: &Span,
    chunk: &Chunk,
    buf: &AlignedBuf,
) -> Result<u64, ReadFailure> {
    // SAFETY: forwarded from this function's contract.
    let Some(region) = (unsafe { buf.range_mut(chunk.start, chunk.region) }) else {
        return Err(ReadFailure::new(span, std::io::Error::other("chunk outside its buffer")));
    };
    let n = read_span(&FromCache(reader), span, region).map_err(|e| ReadFailure::new(span, e))?;
    // The region past the end of the file (its last page's tail) is never read: zero it, so
    // that a buffer allocated uninitialised has every byte of the chunk written.
    if let Some(tail) = region.get_mut(usize::try_from(n).unwrap_or(usize::MAX)..) {
        tail.fill(0);
    }
    Ok(n)
}
