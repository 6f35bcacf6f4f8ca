//! Chunked checksums of a state file's body, computed on the kernel pool while the body moves
//! to or from the disk ([`crate::state_file`]).
//!
//! A Kimi K3 prompt state is 0.5–1.4 GB. One SHA-256 over the whole file runs on one core at
//! 1–2 GB/s, the speed of the disk itself, so a checksum in line with the I/O made a state take
//! 3× a plain write to write and 5× a cold read to restore (PERFORMANCE.md). Here the body is
//! cut into fixed-size chunks, each with its own SHA-256, so the chunks hash on every thread of
//! the pool at once. The chunk size is a property of the file (stored in its header), never of
//! the machine: a file's bytes and checksums are the same whatever the thread count.
//!
//! - Writing ([`write_hashed`]): one thread writes the body's pieces to the file in order, in
//!   large writes straight from the state's own arrays, while the pool hashes the chunks.
//! - Reading ([`read_checked`]): one thread reads the file in order straight into the arrays
//!   the state will keep, and hands each chunk to the pool as soon as all of its bytes have
//!   arrived, so checking overlaps reading; the first chunk whose hash differs is named.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Mutex, PoisonError};

/// Bytes of one chunk in the files this sluice writes: large enough that a chunk's hash
/// dwarfs the cost of handing it to a thread, small enough that a 0.5 GB state is 125 chunks
/// for the pool to share and that checking starts soon after reading does.
pub(crate) const CHUNK_BYTES: usize = 4 << 20;

/// A chunk's checksum.
pub(crate) type ChunkHash = [u8; 32];

/// Chunks of `chunk` bytes in a body of `body` bytes.
pub(crate) fn chunk_count(body: u64, chunk: usize) -> u64 {
    body.div_ceil(chunk as u64)
}

/// One piece of a body being read: bytes already in memory, or a buffer to read into.
pub(crate) enum Piece<'a> {
    /// Already read (the small parts before the state's arrays).
    Done(&'a [u8]),
    /// To be read from the file, in order.
    Fill(&'a mut [u8]),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Done(b) => b.len(),
            Piece::Fill(b) => b.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why [`read_checked`] failed.
#[derive(Debug)]
pub(crate) enum ChunkError {
    /// Reading failed (a short file is `UnexpectedEof`).
    Io(std::io::Error),
    /// The chunk of this index does not match its checksum.
    Mismatch(usize),
}

/// The SHA-256 of the bytes of one chunk, given as its segments.
fn hash(segs: &[&[u8]]) -> ChunkHash {
    let mut h = Sha256::new();
    for s in segs {
        h.update(s);
    }
    h.finalize().into()
}

/// The segments of `pieces` that fall in chunk `k` (`chunk` bytes each).
fn segments<'a>(pieces: &[&'a [u8]], chunk: usize, k: usize) -> Vec<&'a [u8]> {
    let (start, end) = (k * chunk, (k + 1) * chunk);
    let mut out = Vec::new();
    let mut at = 0;
    for p in pieces {
        let (a, b) = (at, at + p.len());
        at = b;
        if b <= start || a >= end {
            continue;
        }
        out.push(&p[start.max(a) - a..end.min(b) - a]);
    }
    out
}

/// Writes `pieces` (the body, in order) to `w` on a helper thread while hashing its chunks of
/// `chunk` bytes on the current kernel pool; returns the chunk hashes, in order.
pub(crate) fn write_hashed(
    w: &mut (dyn Write + Send),
    pieces: &[&[u8]],
    chunk: usize,
) -> std::io::Result<Vec<ChunkHash>> {
    let body: usize = pieces.iter().map(|p| p.len()).sum();
    let chunks = body.div_ceil(chunk);
    std::thread::scope(|sc| {
        let writer = sc.spawn(move || pieces.iter().try_for_each(|p| w.write_all(p)));
        let hashes = sluice_kernels::pool::map(chunks, |k| hash(&segments(pieces, chunk, k)));
        writer.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        Ok(hashes)
    })
}

/// Cuts `pieces` at every multiple of `chunk` bytes: the segments of each chunk, in order.
fn cut(pieces: Vec<Piece<'_>>, chunk: usize) -> Vec<Vec<Piece<'_>>> {
    let mut chunks: Vec<Vec<Piece<'_>>> = vec![Vec::new()];
    let mut room = chunk;
    for mut p in pieces {
        while !p.is_empty() {
            if room == 0 {
                chunks.push(Vec::new());
                room = chunk;
            }
            let n = room.min(p.len());
            let (head, tail) = match p {
                Piece::Done(b) => {
                    let (h, t) = b.split_at(n);
                    (Piece::Done(h), Piece::Done(t))
                }
                Piece::Fill(b) => {
                    let (h, t) = b.split_at_mut(n);
                    (Piece::Fill(h), Piece::Fill(t))
                }
            };
            chunks.last_mut().expect("invariant: starts with one chunk").push(head);
            room -= n;
            p = tail;
        }
    }
    chunks.retain(|c| !c.is_empty());
    chunks
}

/// Reads the `Fill` pieces of the body from `r` (positioned where the first of them starts;
/// `Done` pieces are skipped, being in memory already) and checks every chunk of `chunk`
/// bytes against `table`. Reading runs on a helper thread, chunk by chunk; each complete
/// chunk is hashed on the current kernel pool while the next ones are read. Returns the first
/// chunk (lowest index) whose hash differs, if any; reading stops soon after a mismatch.
pub(crate) fn read_checked(
    r: &mut (dyn Read + Send),
    pieces: Vec<Piece<'_>>,
    chunk: usize,
    table: &[ChunkHash],
) -> Result<(), ChunkError> {
    let chunks = cut(pieces, chunk);
    if chunks.len() != table.len() {
        // The caller sized the table from the same body length; a difference is a bad file.
        return Err(ChunkError::Mismatch(chunks.len().min(table.len())));
    }
    let bad = AtomicUsize::new(usize::MAX);
    let stop = AtomicBool::new(false);
    let (tx, rx) = channel::<(usize, Vec<&[u8]>)>();
    let rx = Mutex::new(rx);
    std::thread::scope(|sc| {
        let stop = &stop;
        let reader = sc.spawn(move || -> std::io::Result<()> {
            for (k, segs) in chunks.into_iter().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut done = Vec::with_capacity(segs.len());
                for s in segs {
                    done.push(match s {
                        Piece::Done(b) => b,
                        Piece::Fill(b) => {
                            r.read_exact(b)?;
                            &*b
                        }
                    });
                }
                if tx.send((k, done)).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let workers = sluice_kernels::pool::with_current(sluice_kernels::pool::Pool::threads);
        sluice_kernels::pool::map(workers, |_| loop {
            let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
            let Ok((k, segs)) = next else { return };
            if hash(&segs) != table[k] {
                bad.fetch_min(k, Ordering::Relaxed);
                stop.store(true, Ordering::Relaxed);
            }
        });
        let read = reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        match bad.load(Ordering::Relaxed) {
            usize::MAX => read.map_err(ChunkError::Io),
            k => Err(ChunkError::Mismatch(k)),
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cut_and_segments_agree_at_awkward_sizes() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for chunk in [1, 3, 7, 64, 999, 1000, 1001] {
            for split in [0, 1, 17, 500, 999] {
                let (a, b) = data.split_at(split);
                let want: Vec<ChunkHash> = (0..1000usize.div_ceil(chunk))
                    .map(|k| hash(&segments(&[a, b], chunk, k)))
                    .collect();
                let mut buf = b.to_vec();
                let pieces = vec![Piece::Done(a), Piece::Fill(&mut buf)];
                let got: Vec<ChunkHash> = cut(pieces, chunk)
                    .iter()
                    .map(|c| {
                        let segs: Vec<&[u8]> = c
                            .iter()
                            .map(|p| match p {
                                Piece::Done(b) => *b,
                                Piece::Fill(b) => &**b,
                            })
                            .collect();
                        hash(&segs)
                    })
                    .collect();
                assert_eq!(got, want, "chunk {chunk}, split {split}");
                let whole: Vec<u8> = data.chunks(chunk).flat_map(|c| hash(&[c])).collect();
                assert_eq!(want.concat(), whole, "chunk {chunk}, split {split}");
            }
        }
    }

    #[test]
    fn a_body_reads_back_and_a_bad_chunk_is_named() {
        let data: Vec<u8> = (0..70_000u32).map(|i| u8::try_from(i * 7 % 251).unwrap()).collect();
        let (a, b) = data.split_at(123);
        let mut file = Vec::new();
        let table = write_hashed(&mut file, &[a, b], 4096).unwrap();
        assert_eq!(file, data);
        assert_eq!(table.len(), 70_000usize.div_ceil(4096));
        let mut back = vec![0u8; b.len()];
        let pieces = vec![Piece::Done(a), Piece::Fill(&mut back)];
        read_checked(&mut &file[123..], pieces, 4096, &table).unwrap();
        assert_eq!(back, b);
        for k in [0usize, 5, 17] {
            let mut bad = file.clone();
            bad[k * 4096 + 200] ^= 1;
            let mut back = vec![0u8; b.len()];
            let pieces = vec![Piece::Done(a), Piece::Fill(&mut back)];
            match read_checked(&mut &bad[123..], pieces, 4096, &table) {
                Err(ChunkError::Mismatch(got)) => assert_eq!(got, k),
                other => panic!("chunk {k}: {other:?}"),
            }
        }
        let mut back = vec![0u8; b.len()];
        let pieces = vec![Piece::Done(a), Piece::Fill(&mut back)];
        match read_checked(&mut &file[123..60_000], pieces, 4096, &table) {
            Err(ChunkError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("short file: {other:?}"),
        }
    }
}
