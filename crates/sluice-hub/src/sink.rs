//! Where downloaded bytes are written: a trait, so tests can fill the disk on purpose.
//!
//! Every byte a pull writes goes through a [`Sink`] opened by a [`SinkFactory`]: positional
//! writes (full files are written in order, sparse shards at their original offsets), an
//! explicit `sync` before anything is renamed into place, and `set_len` to truncate a
//! partial file or size a sparse one. [`FsSinks`] is the real file system; tests wrap it to
//! return ENOSPC after a byte budget and check that nothing is published.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

/// An open file being written.
pub trait Sink: Send {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Sets the file length (truncating, or extending with a hole).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Flushes data and metadata to stable storage.
    fn sync(&mut self) -> io::Result<()>;
}

/// Opens [`Sink`]s.
pub trait SinkFactory: Send + Sync {
    /// Opens `path` for writing, creating it if missing and keeping existing bytes.
    fn open(&self, path: &Path) -> io::Result<Box<dyn Sink>>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsSinks;

impl SinkFactory for FsSinks {
    fn open(&self, path: &Path) -> io::Result<Box<dyn Sink>> {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        Ok(Box::new(FileSink { file, pos: None }))
    }
}

/// A [`Sink`] over a [`File`], remembering its position so sequential writes do not seek.
#[derive(Debug)]
pub struct FileSink {
    file: File,
    pos: Option<u64>,
}

impl FileSink {
    /// Wraps an open file.
    pub fn new(file: File) -> Self {
        Self { file, pos: None }
    }
}

impl Sink for FileSink {
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.pos != Some(offset) {
            self.pos = None;
            self.file.seek(SeekFrom::Start(offset))?;
        }
        // On failure the position is unknown (a partial write may have happened).
        self.pos = None;
        self.file.write_all(buf)?;
        let len = u64::try_from(buf.len()).map_err(io::Error::other)?;
        self.pos = Some(offset + len);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positional_writes_and_holes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let mut s = FsSinks.open(&path).expect("open");
        s.set_len(10).expect("len");
        s.write_all_at(6, b"xy").expect("write");
        s.write_all_at(8, b"z").expect("write");
        s.write_all_at(0, b"a").expect("write");
        s.sync().expect("sync");
        assert_eq!(std::fs::read(&path).expect("read"), b"a\0\0\0\0\0xyz\0");
    }
}
