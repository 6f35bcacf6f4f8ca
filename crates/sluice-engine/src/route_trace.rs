//! Route traces (`--trace-routes FILE`): the experts every MoE layer chose for every row of
//! every pass of a run, with their weights, written as JSON lines (docs/FORMATS.md has the
//! format), and read back so that the store's policy simulation
//! ([`sluice_store::policy::simulate`]) replays real routing instead of a synthetic trace.
//!
//! The first line is a header (`"format": "sluice-route-trace"`, a version, the model); each
//! further line is one pass: its phase (`prefill` or `decode`), the position of its first row,
//! its rows (the pending token and its drafts for a decode pass), how many rows it committed,
//! and per MoE layer each row's expert ids (router order) and combination weights. The file is
//! written to a temporary name next to it and renamed into place when the run ends, so a trace
//! is either complete or absent.

use serde::{Deserialize, Serialize};
use sluice_store::policy::{key, Key};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The `format` field of a trace's header line.
pub const FORMAT: &str = "sluice-route-trace";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;

/// Errors writing or reading a route trace.
#[derive(Debug, thiserror::Error)]
pub enum RouteTraceError {
    /// Creating, writing or renaming the file failed.
    #[error("route trace {path}: {source}")]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not what the format says.
    #[error("route trace {path}, line {line}: {reason}")]
    Malformed {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The checkpoint directory the run used.
    pub model: String,
    /// Prompt tokens of the run.
    pub prompt_tokens: usize,
    /// Routed experts per MoE layer (from config.json; 0 when it does not say).
    pub experts_per_layer: usize,
}

/// One MoE layer's routing in a pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerRoutes {
    /// The layer index (0-based, as in the checkpoint's tensor names).
    pub layer: usize,
    /// Per row, the chosen expert ids in router order.
    pub ids: Vec<Vec<u32>>,
    /// Per row, the combination weights aligned with `ids`.
    pub weights: Vec<Vec<f32>>,
}

/// One line after the header: one pass of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracePass {
    /// Pass number in the run, from 0.
    pub pass: usize,
    /// `prefill` or `decode`.
    pub phase: String,
    /// Position of the pass's first row.
    pub start: usize,
    /// Rows the pass ran (prompt chunk, or the pending token and its drafts).
    pub rows: usize,
    /// Rows kept: all of a prefill chunk; the accepted drafts plus one for a decode pass.
    pub committed: usize,
    /// The MoE layers in order.
    pub layers: Vec<LayerRoutes>,
}

impl TracePass {
    /// Builds a pass from a model trace's routes.
    pub fn from_routes(
        pass: usize,
        phase: &str,
        start: usize,
        rows: usize,
        committed: usize,
        routes: &BTreeMap<usize, Vec<sluice_models::kimi_k3::Route>>,
    ) -> Self {
        let layers = routes
            .iter()
            .map(|(&layer, rs)| LayerRoutes {
                layer,
                ids: rs.iter().map(|r| r.ids.clone()).collect(),
                weights: rs.iter().map(|r| r.weights.clone()).collect(),
            })
            .collect();
        Self { pass, phase: phase.into(), start, rows, committed, layers }
    }
}

/// Writes a trace: header at creation, one line per pass, renamed into place by
/// [`RouteTraceWriter::finish`]. Dropping it unfinished removes the temporary file.
#[derive(Debug)]
pub struct RouteTraceWriter {
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    passes: usize,
    error: Option<std::io::Error>,
}

impl RouteTraceWriter {
    /// Creates `path`'s temporary file and writes the header.
    pub fn create(
        path: &Path,
        model: &str,
        prompt_tokens: usize,
        experts_per_layer: usize,
    ) -> Result<Self, RouteTraceError> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let io = |source| RouteTraceError::Io { path: path.to_path_buf(), source };
        let file = File::create(&tmp).map_err(io)?;
        let mut w = Self {
            out: Some(BufWriter::new(file)),
            tmp,
            path: path.to_path_buf(),
            passes: 0,
            error: None,
        };
        let header = TraceHeader {
            format: FORMAT.into(),
            version: VERSION,
            model: model.into(),
            prompt_tokens,
            experts_per_layer,
        };
        w.line(&header);
        match w.error.take() {
            Some(e) => Err(io(e)),
            None => Ok(w),
        }
    }

    fn line<T: Serialize>(&mut self, v: &T) {
        if self.error.is_some() {
            return;
        }
        let Some(out) = self.out.as_mut() else { return };
        let r = serde_json::to_writer(&mut *out, v)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    /// Appends one pass (its number is the count written so far). A write error is kept and
    /// returned by [`RouteTraceWriter::finish`]; generation is not stopped for it.
    pub fn pass(&mut self, mut p: TracePass) {
        p.pass = self.passes;
        self.passes += 1;
        self.line(&p);
    }

    /// Flushes, syncs and renames the file into place; returns the passes written.
    pub fn finish(mut self) -> Result<usize, RouteTraceError> {
        let io = |source| RouteTraceError::Io { path: self.path.clone(), source };
        if let Some(e) = self.error.take() {
            return Err(io(e));
        }
        let out = self.out.take().ok_or_else(|| io(std::io::Error::other("already finished")))?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(io)?;
        Ok(self.passes)
    }
}

impl Drop for RouteTraceWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Where [`crate::generate`] sends each pass's routes (shared, so the options stay `Clone`).
#[derive(Debug, Clone)]
pub struct RouteTap(pub Arc<Mutex<RouteTraceWriter>>);

impl RouteTap {
    /// Records one pass.
    pub fn record(&self, p: TracePass) {
        // A poisoned lock means a panic elsewhere already ended the run's usefulness.
        if let Ok(mut w) = self.0.lock() {
            w.pass(p);
        }
    }
}

/// Reads a whole trace: its header and passes.
pub fn read(path: &Path) -> Result<(TraceHeader, Vec<TracePass>), RouteTraceError> {
    let io = |source| RouteTraceError::Io { path: path.to_path_buf(), source };
    let bad = |line: usize, reason: String| RouteTraceError::Malformed {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut lines = BufReader::new(File::open(path).map_err(io)?).lines();
    let first = lines.next().ok_or_else(|| bad(1, "empty file (no header line)".into()))?;
    let header: TraceHeader = serde_json::from_str(&first.map_err(io)?)
        .map_err(|e| bad(1, format!("not a route-trace header: {e}")))?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(bad(
            1,
            format!(
                "format {:?} version {}, expected {FORMAT:?} version {VERSION}",
                header.format, header.version
            ),
        ));
    }
    let mut passes = Vec::new();
    for (i, l) in lines.enumerate() {
        let l = l.map_err(io)?;
        if l.trim().is_empty() {
            continue;
        }
        let p: TracePass =
            serde_json::from_str(&l).map_err(|e| bad(i + 2, format!("not a pass: {e}")))?;
        for lr in &p.layers {
            if lr.ids.len() != p.rows || lr.weights.len() != p.rows {
                return Err(bad(
                    i + 2,
                    format!(
                        "layer {} has {} rows of ids for a pass of {}",
                        lr.layer,
                        lr.ids.len(),
                        p.rows
                    ),
                ));
            }
        }
        passes.push(p);
    }
    Ok((header, passes))
}

/// The expert requests a store sees for `passes`: per pass, per MoE layer in order, the
/// distinct experts of its rows in ascending id order (the model asks for a pass's union once).
/// With `per_row`, every row is its own request instead (a one-row-per-pass replay).
pub fn store_keys(passes: &[TracePass], per_row: bool) -> Vec<Key> {
    let mut out = Vec::new();
    let mut union: Vec<u32> = Vec::new();
    for p in passes {
        // Row groups as (first, end): every row alone, or the whole pass.
        let groups: Vec<(usize, usize)> =
            if per_row { (0..p.rows).map(|r| (r, r + 1)).collect() } else { vec![(0, p.rows)] };
        for (a, b) in groups {
            for lr in &p.layers {
                union.clear();
                for row in &lr.ids[a..b] {
                    union.extend_from_slice(row);
                }
                union.sort_unstable();
                union.dedup();
                out.extend(union.iter().map(|&e| key(lr.layer, e)));
            }
        }
    }
    out
}
