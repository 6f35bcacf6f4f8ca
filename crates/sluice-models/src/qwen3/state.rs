//! Qwen3 sequence state: one KV cache per layer, with transactions.
//!
//! Each layer's cache holds, per position, the keys after `k_norm` and RoPE and the values, all KV
//! heads side by side (`[len, kv_heads · head_dim]`, f32), exactly what HF's `DynamicCache`
//! stores, each row padded to [`row_stride`] values in memory (a snapshot keeps the rows
//! unpadded). A pass appends its T rows past the committed length; nothing else in the state changes,
//! so [`Qwen3State::commit`]`(n)` truncates every cache to `committed + n` rows and
//! [`Qwen3State::rollback`] truncates to `committed`. A kept row is bit-identical to the row a
//! one-token pass would have written: keys and values depend only on the token and its position
//! (RoPE uses the absolute position `committed + row`), never on the other rows of the pass.

use sluice_kernels::lines::row_stride;
use sluice_kernels::LineVec;

/// One layer's keys and values.
#[derive(Debug, Clone)]
pub(crate) struct KvCache {
    /// Rotated, normalised keys `[len, stride]` (a position's `width` values, then padding),
    /// from a cache line (so is every row: see [`LineVec`] and [`row_stride`]).
    pub(crate) k: LineVec,
    /// Values `[len, stride]`, as `k`.
    pub(crate) v: LineVec,
    /// `kv_heads · head_dim`.
    pub(crate) width: usize,
    /// Values from one position's row to the next ([`row_stride`] of `width`).
    pub(crate) stride: usize,
}

impl KvCache {
    pub(crate) fn new(width: usize) -> Self {
        Self { k: LineVec::new(), v: LineVec::new(), width, stride: row_stride(width) }
    }

    /// Positions held (committed and staged).
    pub(crate) fn len(&self) -> usize {
        self.k.len() / self.stride
    }

    /// Appends the rows of `k` and `v` (`width` values a position, as many positions each),
    /// each padded to the stride with zeros.
    pub(crate) fn push(&mut self, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        let pad = [0.0f32; 32];
        for (cache, rows) in [(&mut self.k, k), (&mut self.v, v)] {
            for row in rows.chunks_exact(self.width) {
                cache.extend_from_slice(row);
                cache.extend_from_slice(&pad[..self.stride - self.width]);
            }
        }
    }

    fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.stride);
        self.v.truncate(len * self.stride);
    }
}

/// Everything a Qwen3 sequence carries between passes.
#[derive(Debug, Clone)]
pub struct Qwen3State {
    pub(crate) layers: Vec<KvCache>,
    committed: usize,
    pending: Option<usize>,
    /// Rows of the next (or staged) pass to capture the state after (see
    /// `crate::snapshot::capture`): the caches are positional, so nothing is copied during
    /// the pass.
    pub(crate) capture_at: Vec<usize>,
}

impl Qwen3State {
    /// An empty state for `layers` layers of KV width `width`.
    pub(crate) fn new(layers: usize, width: usize) -> Self {
        Self {
            layers: (0..layers).map(|_| KvCache::new(width)).collect(),
            committed: 0,
            pending: None,
            capture_at: Vec::new(),
        }
    }

    /// A state of `committed` positions made of `layers` (restored from a snapshot).
    pub(crate) fn restored(layers: Vec<KvCache>, committed: usize) -> Self {
        Self { layers, committed, pending: None, capture_at: Vec::new() }
    }

    /// Committed positions (the position of the next pass's first row).
    pub fn len(&self) -> usize {
        self.committed
    }

    /// True before any position is committed.
    pub fn is_empty(&self) -> bool {
        self.committed == 0
    }

    /// Rows staged by the last pass and not yet committed or rolled back.
    pub fn pending(&self) -> Option<usize> {
        self.pending
    }

    /// Whether this state was made for a model of `layers` layers of KV width `width`.
    pub(crate) fn fits(&self, layers: usize, width: usize) -> bool {
        self.layers.len() == layers && self.layers.iter().all(|l| l.width == width)
    }

    /// Starts a pass of `t` rows.
    pub(crate) fn begin(&mut self, t: usize) {
        self.pending = Some(t);
    }

    /// Publishes the first `n` rows of the staged pass (clamped to the rows staged); a no-op
    /// when no pass is pending.
    pub fn commit(&mut self, n: usize) {
        let Some(t) = self.pending.take() else { return };
        self.committed += n.min(t);
        for l in &mut self.layers {
            l.truncate(self.committed);
        }
        self.capture_at.clear();
    }

    /// Discards the staged pass.
    pub fn rollback(&mut self) {
        if self.pending.take().is_some() {
            for l in &mut self.layers {
                l.truncate(self.committed);
            }
        }
        self.capture_at.clear();
    }

    /// Forgets every committed position from `len` on (a no-op when `len` is not shorter), and
    /// any staged pass. A KV cache row depends only on its own token and position, so the state
    /// afterwards equals the state of a sequence that stopped at `len`; a draft model uses this
    /// to roll back what the target rejected.
    pub fn truncate(&mut self, len: usize) {
        self.pending = None;
        self.capture_at.clear();
        self.committed = self.committed.min(len);
        for l in &mut self.layers {
            l.truncate(self.committed);
        }
    }

    /// Bytes this state holds (charged to the memory budget by the engine).
    pub fn byte_len(&self) -> usize {
        self.layers.iter().map(|l| 4 * (l.k.capacity() + l.v.capacity())).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stages `t` rows whose values name their position, as a pass would.
    fn stage(s: &mut Qwen3State, t: usize) {
        s.begin(t);
        for l in &mut s.layers {
            let start = l.len();
            for p in start..start + t {
                #[allow(clippy::cast_precision_loss)]
                let v = p as f32;
                let (k, nv) = (vec![v; l.width], vec![-v; l.width]);
                l.push(&k, &nv);
            }
        }
    }

    #[test]
    fn commit_keeps_exactly_the_first_n_rows() {
        let mut s = Qwen3State::new(2, 3);
        stage(&mut s, 4);
        s.commit(4);
        stage(&mut s, 5);
        s.commit(2);
        assert_eq!(s.len(), 6);
        for l in &s.layers {
            assert_eq!(l.len(), 6);
            assert_eq!(l.k[5 * l.stride], 5.0);
            assert_eq!(l.v[5 * l.stride], -5.0);
        }
        stage(&mut s, 1);
        let stride = s.layers[0].stride;
        assert_eq!(
            s.layers[0].k[6 * stride],
            6.0,
            "the next pass continues at the committed length"
        );
    }

    #[test]
    fn rollback_and_overlong_commit() {
        let mut s = Qwen3State::new(1, 2);
        stage(&mut s, 3);
        s.commit(3);
        stage(&mut s, 4);
        assert_eq!(s.pending(), Some(4));
        s.rollback();
        assert_eq!((s.len(), s.layers[0].len(), s.pending()), (3, 3, None));
        stage(&mut s, 2);
        s.commit(99);
        assert_eq!(s.len(), 5);
        s.commit(1);
        s.rollback();
        assert_eq!((s.len(), s.layers[0].len()), (5, 5), "no pass pending: both are no-ops");
        assert!(s.byte_len() >= 4 * 2 * 5 * 2);
        assert!(!s.is_empty());
    }
}
