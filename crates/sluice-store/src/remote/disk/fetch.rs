//! Filling the disk cache: the missing experts of a pass fetched from the remote source in
//! coalesced range requests (several in flight), written into their holes, synced and dropped
//! from the page cache, and hashed (SHA-256) for the log.

use super::{cfg_err, ExpertDiskCache};
use crate::StoreError;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

impl ExpertDiskCache {
    /// Fetches every span of `ids` (coalesced), writes and syncs it; returns each fully
    /// written expert's SHA-256, or those plus the first error.
    #[allow(clippy::type_complexity)]
    pub(super) fn fetch_all(
        &self,
        layer: usize,
        ids: &[u32],
    ) -> Result<Vec<(u32, String)>, (Vec<(u32, String)>, StoreError)> {
        // (file, offset, len, expert) for every span, disk order, then runs of adjacent spans.
        let mut spans: Vec<(usize, u64, u64, u32)> = Vec::new();
        for &id in ids {
            if let Some(loc) = self.index.get(layer, id) {
                spans.extend(loc.stored_spans().iter().map(|s| (s.file, s.offset, s.len, id)));
            }
        }
        spans.sort_unstable();
        let mut groups: VecDeque<Vec<(usize, u64, u64, u32)>> = VecDeque::new();
        for s in spans {
            let extend = groups.back().is_some_and(|g| {
                let (_, first, _, _) = g[0];
                let last = g[g.len() - 1];
                last.0 == s.0
                    && last.1 + last.2 == s.1
                    && s.1 + s.2 - first <= self.config.max_request
            });
            match groups.back_mut() {
                Some(g) if extend => g.push(s),
                _ => groups.push_back(vec![s]),
            }
        }
        let queue = Mutex::new(groups);
        let results: Mutex<Vec<(u32, Option<String>)>> = Mutex::new(Vec::new());
        let first_err: Mutex<Option<StoreError>> = Mutex::new(None);
        let workers = self.config.fetchers.max(1);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let g = queue.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
                    let Some(g) = g else { break };
                    match self.fetch_group(layer, &g) {
                        Ok(shas) => {
                            results.lock().unwrap_or_else(PoisonError::into_inner).extend(shas);
                        }
                        Err(e) => {
                            let mut fe = first_err.lock().unwrap_or_else(PoisonError::into_inner);
                            fe.get_or_insert(e);
                            // Stop taking new requests once one has failed.
                            queue.lock().unwrap_or_else(PoisonError::into_inner).clear();
                        }
                    }
                });
            }
        });
        let results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut shas: HashMap<u32, String> = HashMap::new();
        let mut multi = Vec::new();
        for (id, sha) in results {
            match sha {
                Some(s) => {
                    shas.insert(id, s);
                }
                None => multi.push(id),
            }
        }
        multi.sort_unstable();
        multi.dedup();
        let err = first_err.into_inner().unwrap_or_else(PoisonError::into_inner);
        // Experts in several spans: hashed from disk once all their spans are written.
        if err.is_none() {
            for id in multi {
                match self.hash_from_disk(layer, id) {
                    Ok(s) => {
                        shas.insert(id, s);
                    }
                    Err(e) => return Err((shas.into_iter().collect(), e)),
                }
            }
        }
        let ok: Vec<(u32, String)> = shas.into_iter().collect();
        match err {
            Some(e) => Err((ok, e)),
            None => Ok(ok),
        }
    }

    /// One coalesced request: fetch, write at the original offset, sync, drop the pages from
    /// the page cache. Returns each single-span expert's SHA-256 (`None` for experts with
    /// more spans, hashed later).
    fn fetch_group(
        &self,
        layer: usize,
        g: &[(usize, u64, u64, u32)],
    ) -> Result<Vec<(u32, Option<String>)>, StoreError> {
        let (file, start, _, _) = g[0];
        let last = g[g.len() - 1];
        let end = last.1 + last.2;
        let path = self.index.path(file).to_path_buf();
        let len = end - start;
        let n = usize::try_from(len).map_err(|_| cfg_err(&path, "request too large"))?;
        let mut buf = vec![0u8; n];
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.remote.fetch(file, start, &mut buf).map_err(|source| StoreError::Remote {
            path: path.clone(),
            offset: start,
            len,
            source,
        })?;
        self.counters.bytes_fetched.fetch_add(len, Ordering::Relaxed);
        let f = self.files.get(file).and_then(Option::as_ref).ok_or_else(|| {
            cfg_err(&path, "shard holds no routed experts but a request was made for it")
        })?;
        let io = |source| StoreError::Io { path: path.clone(), source };
        f.write_all_at(&buf, start).map_err(io)?;
        f.sync_data().map_err(io)?;
        crate::telemetry::count_cache_write(len);
        drop_cached(f, start, len);
        let mut out = Vec::with_capacity(g.len());
        for &(_, off, l, id) in g {
            if self.index.get(layer, id).is_some_and(|loc| loc.stored_spans().len() == 1) {
                let a = usize::try_from(off - start).unwrap_or(usize::MAX);
                let b = a.saturating_add(usize::try_from(l).unwrap_or(usize::MAX));
                let sha = buf.get(a..b).map(|s| hex(&Sha256::digest(s)));
                if sha.is_none() {
                    return Err(cfg_err(&path, "invariant: a span lies inside its request"));
                }
                out.push((id, sha));
            } else {
                out.push((id, None));
            }
        }
        Ok(out)
    }

    /// SHA-256 of expert `id` of `layer` read back from its sparse file(s), in span order.
    fn hash_from_disk(&self, layer: usize, id: u32) -> Result<String, StoreError> {
        let mut h = Sha256::new();
        let Some(loc) = self.index.get(layer, id) else {
            return Err(StoreError::Config(format!("expert {id} of layer {layer} not indexed")));
        };
        for s in loc.stored_spans() {
            let path = self.index.path(s.file).to_path_buf();
            let f = self
                .files
                .get(s.file)
                .and_then(Option::as_ref)
                .ok_or_else(|| cfg_err(&path, "shard holds no routed experts"))?;
            let n = usize::try_from(s.len).map_err(|_| cfg_err(&path, "span too large"))?;
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, s.offset)
                .map_err(|source| StoreError::Io { path: path.clone(), source })?;
            h.update(&buf);
        }
        Ok(hex(&h.finalize()))
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Drops the page-cache pages of a range just written and synced (best effort), so filling
/// the disk cache does not grow memory outside the budget.
fn drop_cached(file: &File, offset: u64, len: u64) {
    let _ = crate::platform::advice::drop_range(file, offset, len);
}
