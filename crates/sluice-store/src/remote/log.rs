//! The expert-cache log: which routed experts of a stream install are present on local disk.
//!
//! A text file beside the install manifest, `sluice-expert-cache.log`, append-only between
//! compactions:
//!
//! ```text
//! sluice-expert-cache 1 9c955951868f781f30b89342058a9472dfda58a9
//! + 3 17 5f56feee…(64 hex) model-00002-of-00064.safetensors.sparse:1073750016:17547264
//! - 3 17
//! ```
//!
//! The first line names the format version and the commit the bytes belong to. `+ L E SHA
//! SPANS` records expert `E` of layer `L` as present: its bytes were written into the sparse
//! shard(s) at the listed `file:offset:len` spans (comma-separated, disk order) and synced
//! **before** the line was appended and synced; `SHA` is the SHA-256 of those bytes in span
//! order. `- L E` records it absent; the hole is punched only **after** that line is synced.
//! The last record of a key wins. Only complete lines count: a torn last line (a crash mid-
//! append) is ignored, so a crash can lose a presence record (the expert is fetched again)
//! but never invent one. Compaction rewrites the log (scratch file, fsync, rename, directory
//! fsync) with only the `+` lines of present experts.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// File name of the log in the model directory.
pub const LOG_FILE: &str = "sluice-expert-cache.log";

/// The format version this crate writes and reads.
pub const LOG_FORMAT: u32 = 1;

/// One span of a present expert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSpan {
    /// The sparse shard's file name, relative to the model directory.
    pub shard: String,
    /// Absolute offset of the first byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A present expert, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Present {
    /// Layer index.
    pub layer: usize,
    /// Expert index within the layer.
    pub expert: u32,
    /// SHA-256 (hex) of the expert's bytes in span order.
    pub sha256: String,
    /// Where the bytes are, in disk order.
    pub spans: Vec<LogSpan>,
}

impl Present {
    /// Bytes of the expert.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// The log line recording this expert present (with its newline).
    pub fn line(&self) -> String {
        let spans: Vec<String> =
            self.spans.iter().map(|s| format!("{}:{}:{}", s.shard, s.offset, s.len)).collect();
        format!("+ {} {} {} {}\n", self.layer, self.expert, self.sha256, spans.join(","))
    }
}

/// The log line recording expert `expert` of `layer` absent (with its newline).
pub fn remove_line(layer: usize, expert: u32) -> String {
    format!("- {layer} {expert}\n")
}

/// What a log says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// The commit of the header line (`None` for a missing or unreadable header).
    pub commit: Option<String>,
    /// Present experts, oldest record first.
    pub present: Vec<Present>,
    /// Experts whose last record is a removal (their holes may still need punching).
    pub removed: Vec<(usize, u32)>,
    /// Complete record lines read (header excluded).
    pub records: usize,
    /// Lines that did not parse (a torn last line, or damage).
    pub bad_lines: usize,
}

impl LogState {
    /// Bytes of all present experts.
    pub fn present_bytes(&self) -> u64 {
        self.present.iter().map(Present::bytes).sum()
    }
}

/// Parses a log's text (see the module docs).
pub fn parse(text: &str) -> LogState {
    let mut st = LogState::default();
    // Only newline-terminated lines are complete.
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    if complete.len() < text.len() {
        st.bad_lines += 1;
    }
    let mut lines = complete.lines();
    st.commit = lines.next().and_then(|h| {
        let mut it = h.split(' ');
        let ok = it.next() == Some("sluice-expert-cache")
            && it.next().and_then(|v| v.parse::<u32>().ok()) == Some(LOG_FORMAT);
        let commit = it.next().filter(|c| !c.is_empty())?.to_owned();
        (ok && it.next().is_none()).then_some(commit)
    });
    let mut last: HashMap<(usize, u32), Option<Present>> = HashMap::new();
    let mut order: Vec<(usize, u32)> = Vec::new();
    for line in lines {
        match parse_record(line) {
            Some((key, rec)) => {
                st.records += 1;
                // Re-adding moves the key to the end (most recent).
                order.retain(|k| *k != key);
                order.push(key);
                last.insert(key, rec);
            }
            None => st.bad_lines += 1,
        }
    }
    for key in order {
        match last.remove(&key) {
            Some(Some(p)) => st.present.push(p),
            Some(None) => st.removed.push(key),
            None => {}
        }
    }
    st
}

type Record = ((usize, u32), Option<Present>);

fn parse_record(line: &str) -> Option<Record> {
    let mut it = line.split(' ');
    let op = it.next()?;
    let layer: usize = it.next()?.parse().ok()?;
    let expert: u32 = it.next()?.parse().ok()?;
    match op {
        "-" => it.next().is_none().then_some(((layer, expert), None)),
        "+" => {
            let sha256 = it.next().filter(|s| is_hex64(s))?.to_owned();
            let spans = it
                .next()?
                .split(',')
                .map(|s| {
                    let mut p = s.rsplitn(3, ':');
                    let len = p.next()?.parse().ok()?;
                    let offset = p.next()?.parse().ok()?;
                    let shard = p.next().filter(|n| !n.is_empty())?.to_owned();
                    Some(LogSpan { shard, offset, len })
                })
                .collect::<Option<Vec<_>>>()?;
            if it.next().is_some() || spans.is_empty() {
                return None;
            }
            Some(((layer, expert), Some(Present { layer, expert, sha256, spans })))
        }
        _ => None,
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads the log at `path`; `Ok(None)` when there is none.
pub fn read(path: &Path) -> io::Result<Option<LogState>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(parse(&String::from_utf8_lossy(&bytes)))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The header line for `commit` (with its newline).
pub fn header(commit: &str) -> String {
    format!("sluice-expert-cache {LOG_FORMAT} {commit}\n")
}

/// Replaces the log at `path` with the header and `present` only: scratch file, fsync,
/// rename, directory fsync. A crash leaves either the old or the new log.
pub fn rewrite(path: &Path, commit: &str, present: &[Present]) -> io::Result<()> {
    let tmp = scratch_path(path);
    let mut text = header(commit);
    for p in present {
        text.push_str(&p.line());
    }
    {
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn scratch_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// An open log for appending records.
#[derive(Debug)]
pub struct LogWriter {
    file: File,
    path: PathBuf,
}

impl LogWriter {
    /// Opens `path` for appending (it must exist: see [`rewrite`]).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Self { file, path: path.to_path_buf() })
    }

    /// Appends `text` (whole lines) and syncs it to disk before returning.
    pub fn append(&mut self, text: &str) -> io::Result<()> {
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(layer: usize, expert: u32) -> Present {
        Present {
            layer,
            expert,
            sha256: "ab".repeat(32),
            spans: vec![LogSpan { shard: "m-1.safetensors.sparse".into(), offset: 4096, len: 100 }],
        }
    }

    #[test]
    fn last_record_wins_and_torn_lines_are_ignored() {
        let mut text = header("c0ffee");
        text.push_str(&present(1, 2).line());
        text.push_str(&present(1, 3).line());
        text.push_str(&remove_line(1, 2));
        text.push_str(&present(2, 0).line());
        // A torn append: no newline, so it does not count even though it would parse.
        text.push_str(present(4, 4).line().trim_end());
        let st = parse(&text);
        assert_eq!(st.commit.as_deref(), Some("c0ffee"));
        assert_eq!(st.present, vec![present(1, 3), present(2, 0)]);
        assert_eq!(st.removed, vec![(1, 2)]);
        assert_eq!((st.records, st.bad_lines), (4, 1));
        assert_eq!(st.present_bytes(), 200);
    }

    #[test]
    fn damaged_lines_do_not_count_as_present() {
        let good = present(0, 1).line();
        let text = format!(
            "{}{}\n+ 0 2 {} x:1:2\n+ 0 3 nothex m:1:2\n",
            header("c"),
            &good[..good.len() - 8],
            "ab".repeat(32)
        );
        let st = parse(&format!("{text}\n"));
        assert_eq!(st.present.len(), 1, "{st:?}");
        assert_eq!(st.present[0].expert, 2);
    }

    #[test]
    fn rewrite_keeps_only_present_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE);
        rewrite(&path, "abc", &[present(0, 0)]).expect("rewrite");
        let mut w = LogWriter::open(&path).expect("open");
        w.append(&present(0, 1).line()).expect("append");
        let st = read(&path).expect("read").expect("exists");
        assert_eq!(st.present, vec![present(0, 0), present(0, 1)]);
        assert!(read(&dir.path().join("none")).expect("read").is_none());
    }
}
