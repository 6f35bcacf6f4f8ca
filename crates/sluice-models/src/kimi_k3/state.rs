//! Kimi K3 sequence state with transactions.
//!
//! A pass over T rows stages its changes: KDA layers compute into a working copy of their state
//! (filled from the committed state head by head by the pooled work that first steps each
//! head, not up front) and remember each row's recurrence inputs; MLA layers append T rows
//! past the committed length.
//! [`K3State::commit`]`(n)` publishes exactly the first n rows — the working state as is when
//! n = T, otherwise the committed state advanced by replaying the n rows' recurrence (the same
//! `kda_step` calls in the same order, so bit-identical to having run n rows) — and
//! [`K3State::rollback`] discards the pass. A pass begun whole (a prompt chunk,
//! `LogitRows::Prefill`) keeps no replay rows: at K3's widths they are 345 KB per row per KDA
//! layer (24 MB per row over 69 layers), most of a prompt row's working memory; its `commit(n)`
//! publishes all T rows or, for n < T, nothing. Nothing in the state depends on position except the
//! order of updates (K3 is NoPE and has no rotary embedding).
//!
//! A pass may also **capture** the state after given rows of it ([`K3State::request_captures`],
//! for snapshots inside one prompt pass instead of a pass cut at each): a KDA layer copies its
//! working state as its chunk loop passes each requested row (the recurrence is sequential per
//! row, so that copy is the state after exactly those rows), and an MLA layer needs nothing,
//! since its staged rows are positional and the state after row k is their prefix.

use super::config::{AttnKind, K3Config};
use super::synth::SplitMix;
use sluice_kernels::ops::kda_step;
use sluice_kernels::LineVec;

/// One row's recurrence inputs for every head (kept so `commit(n < T)` can replay them).
#[derive(Debug, Clone, Default)]
pub(crate) struct KdaRow {
    /// Pre-conv projections `[q; k; v]`, 3·P values (the conv window holds pre-conv inputs).
    pub(crate) pre_conv: Vec<f32>,
    /// Normalised q (scaled), normalised k, v: `[H, D]` each.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// Log-decay `[H, D]`.
    pub(crate) g: Vec<f32>,
    /// β per head.
    pub(crate) beta: Vec<f32>,
}

/// KDA recurrent state: `s [H, Dk, Dv]` and the conv window `[kernel − 1, 3·P]`.
#[derive(Debug, Clone)]
pub(crate) struct KdaState {
    pub(crate) s: Vec<f32>,
    pub(crate) conv: Vec<f32>,
}

impl KdaState {
    /// A zero state of `s` recurrent and `conv` window values. Zeroed allocations come from
    /// the allocator's zeroed pages (`vec![0.0; n]`), which are not touched until written,
    /// where `clone` of a zero state would write every byte.
    fn zeroed(s: usize, conv: usize) -> Self {
        Self { s: vec![0.0; s], conv: vec![0.0; conv] }
    }
}

/// A KDA layer's committed state and the staged pass.
#[derive(Debug, Clone)]
pub(crate) struct KdaLayer {
    pub(crate) committed: KdaState,
    /// The staged pass's state, valid only while `live`: [`KdaLayer::begin`] copies nothing
    /// into it, and the layer's first block copies each head's committed state (and window
    /// columns) in inside the pooled work that steps the head (`kimi_k3::kda`), where it is
    /// hot in that core's cache for the step. At K3's widths the eager copy was 6.3 MB per
    /// KDA layer per pass on the engine thread.
    pub(crate) work: KdaState,
    /// Whether `work` holds the staged pass's state (the layer ran in this pass); until then
    /// the pass's state is the committed state ([`KdaLayer::current`]).
    pub(crate) live: bool,
    pub(crate) rows: Vec<KdaRow>,
    /// Whether the staged pass keeps its rows for a partial commit (false in a whole pass).
    pub(crate) keep_rows: bool,
    /// Rows of the pass (ascending) after which the working state is copied into `captured`.
    pub(crate) capture_at: Vec<usize>,
    /// The working state after each row of `capture_at` the pass has passed, in order.
    pub(crate) captured: Vec<KdaState>,
    pub(crate) heads: usize,
    pub(crate) dim: usize,
}

impl KdaLayer {
    fn new(heads: usize, dim: usize, conv_len: usize) -> Self {
        Self::restored(KdaState::zeroed(heads * dim * dim, conv_len), heads, dim)
    }

    /// A layer whose committed state is `committed` (restored from a snapshot). The working
    /// copy is only allocated: each pass overwrites it from the committed state before it
    /// reads it (see `work`), so copying the committed state into it here would be a second
    /// copy of the largest part of a Kimi K3 state (434 MB) for nothing.
    pub(crate) fn restored(committed: KdaState, heads: usize, dim: usize) -> Self {
        let work = KdaState::zeroed(committed.s.len(), committed.conv.len());
        Self {
            committed,
            work,
            live: false,
            rows: Vec::new(),
            keep_rows: true,
            capture_at: Vec::new(),
            captured: Vec::new(),
            heads,
            dim,
        }
    }

    /// Starts a pass: the pass's state begins as the committed state (copied into the working
    /// state lazily, see `work`); `keep_rows` says whether the pass keeps its rows' recurrence
    /// inputs for a partial commit.
    pub(crate) fn begin(&mut self, keep_rows: bool) {
        self.live = false;
        self.rows.clear();
        self.captured.clear();
        self.keep_rows = keep_rows;
    }

    /// The state after the rows of the staged pass the layer has run: the working state once
    /// it ran, else the committed state.
    pub(crate) fn current(&self) -> &KdaState {
        if self.live {
            &self.work
        } else {
            &self.committed
        }
    }

    /// Discards the staged pass.
    fn rollback(&mut self) {
        self.live = false;
        self.rows.clear();
    }

    /// The next row of the pass whose state is to be captured, at or after row `from`, and
    /// not yet captured.
    pub(crate) fn next_capture(&self, from: usize) -> Option<usize> {
        self.capture_at.get(self.captured.len()).copied().filter(|&r| r >= from)
    }

    /// Forgets the capture request and what was captured.
    fn clear_captures(&mut self) {
        self.capture_at.clear();
        self.captured.clear();
    }

    /// Publishes the first `n` of the `t` staged rows (`n` ≤ `t`): the working state when
    /// n = t, else the committed state advanced by replaying the kept rows (none in a whole
    /// pass, whose partial commit the caller turned into nothing). A pass the layer never ran
    /// in left the committed state as the pass's state, and its stale working copy unpublished.
    fn commit(&mut self, n: usize, t: usize) {
        if n == t {
            if self.live {
                std::mem::swap(&mut self.committed, &mut self.work);
            }
        } else if n > 0 {
            let (h, d) = (self.heads, self.dim);
            let mut o = vec![0.0f32; d];
            for row in &self.rows[..n] {
                for hi in 0..h {
                    let r = hi * d..(hi + 1) * d;
                    kda_step(
                        &mut self.committed.s[hi * d * d..(hi + 1) * d * d],
                        &row.q[r.clone()],
                        &row.k[r.clone()],
                        &row.v[r.clone()],
                        &row.g[r],
                        row.beta[hi],
                        &mut o,
                    );
                }
                let c = row.pre_conv.len();
                let conv = &mut self.committed.conv;
                if !conv.is_empty() {
                    conv.copy_within(c.., 0);
                    let len = conv.len();
                    conv[len - c..].copy_from_slice(&row.pre_conv);
                }
            }
        }
        self.live = false;
        self.rows.clear();
    }
}

/// An MLA layer's latent cache: `lat [len, kv_lora]` (normalised) and `k_pe [len, rope]`.
#[derive(Debug, Clone)]
pub(crate) struct MlaLayer {
    /// From a cache line, as the attention sums stream it (see [`LineVec`]).
    pub(crate) lat: LineVec,
    pub(crate) pe: LineVec,
    pub(crate) lat_dim: usize,
    pub(crate) pe_dim: usize,
}

impl MlaLayer {
    fn truncate(&mut self, len: usize) {
        self.lat.truncate(len * self.lat_dim);
        self.pe.truncate(len * self.pe_dim);
    }
}

/// Per-layer state.
#[derive(Debug, Clone)]
pub(crate) enum LayerState {
    Kda(KdaLayer),
    Mla(MlaLayer),
}

/// Everything a Kimi K3 sequence carries between passes.
#[derive(Debug, Clone)]
pub struct K3State {
    pub(crate) layers: Vec<LayerState>,
    committed: usize,
    pending: Option<usize>,
    /// Whether the pending pass was begun whole (keeps no replay rows).
    whole: bool,
    /// Rows of the next (or staged) pass to capture the state after.
    capture_at: Vec<usize>,
}

/// Shapes needed to build an empty state.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LayerShape {
    Kda { heads: usize, dim: usize, conv_len: usize },
    Mla { lat_dim: usize, pe_dim: usize },
}

impl LayerShape {
    /// The layer shapes of the states of a Kimi K3 model of `cfg` (its KDA and MLA layers).
    pub(crate) fn of_config(cfg: &K3Config) -> Vec<LayerShape> {
        let la = &cfg.linear_attn_config;
        (0..cfg.num_hidden_layers)
            .map(|i| match cfg.attn_kind(i) {
                AttnKind::Kda => LayerShape::Kda {
                    heads: la.num_heads,
                    dim: la.head_dim,
                    conv_len: (la.short_conv_kernel_size - 1) * 3 * cfg.kda_proj(),
                },
                AttnKind::Mla => {
                    LayerShape::Mla { lat_dim: cfg.kv_lora_rank, pe_dim: cfg.qk_rope_head_dim }
                }
            })
            .collect()
    }
}

impl K3State {
    pub(crate) fn new(shapes: &[LayerShape]) -> Self {
        let layers = shapes
            .iter()
            .map(|s| match *s {
                LayerShape::Kda { heads, dim, conv_len } => {
                    LayerState::Kda(KdaLayer::new(heads, dim, conv_len))
                }
                LayerShape::Mla { lat_dim, pe_dim } => LayerState::Mla(MlaLayer {
                    lat: LineVec::new(),
                    pe: LineVec::new(),
                    lat_dim,
                    pe_dim,
                }),
            })
            .collect();
        Self { layers, committed: 0, pending: None, whole: false, capture_at: Vec::new() }
    }

    /// A state of `committed` positions made of `layers` (restored from a snapshot).
    pub(crate) fn restored(layers: Vec<LayerState>, committed: usize) -> Self {
        Self { layers, committed, pending: None, whole: false, capture_at: Vec::new() }
    }

    /// Committed positions.
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

    /// Starts a pass of `t` rows; a `whole` pass keeps no rows for a partial commit.
    pub(crate) fn begin(&mut self, t: usize, whole: bool) {
        self.pending = Some(t);
        self.whole = whole;
        for l in &mut self.layers {
            if let LayerState::Kda(k) = l {
                k.begin(!whole);
            }
        }
    }

    /// Publishes the first `n` rows of the staged pass (clamped to the rows staged). A whole
    /// pass (`LogitRows::Prefill`) kept nothing to replay part of it: n < T publishes nothing.
    pub fn commit(&mut self, n: usize) {
        let Some(t) = self.pending.take() else { return };
        let n = n.min(t);
        if self.whole && n < t {
            self.pending = Some(t);
            self.rollback();
            return;
        }
        self.committed += n;
        for l in &mut self.layers {
            match l {
                LayerState::Kda(k) => k.commit(n, t),
                LayerState::Mla(m) => m.truncate(self.committed),
            }
        }
        self.clear_captures();
    }

    /// Discards the staged pass.
    pub fn rollback(&mut self) {
        if self.pending.take().is_some() {
            for l in &mut self.layers {
                match l {
                    LayerState::Kda(k) => k.rollback(),
                    LayerState::Mla(m) => m.truncate(self.committed),
                }
            }
        }
        self.clear_captures();
    }

    /// Asks the next pass to capture the state after each of `offsets` (ascending rows inside
    /// the pass); see the module docs.
    pub(crate) fn request_captures(&mut self, offsets: &[usize]) {
        for l in &mut self.layers {
            if let LayerState::Kda(k) = l {
                k.capture_at.clear();
                k.capture_at.extend_from_slice(offsets);
                k.captured.clear();
            }
        }
        self.capture_at.clear();
        self.capture_at.extend_from_slice(offsets);
    }

    /// The rows the staged pass was asked to capture the state after.
    pub(crate) fn capture_offsets(&self) -> &[usize] {
        &self.capture_at
    }

    /// Forgets the capture request and what was captured (once the captures are taken, or
    /// when the pass is committed or rolled back: captures never outlive their pass).
    pub(crate) fn clear_captures(&mut self) {
        self.capture_at.clear();
        for l in &mut self.layers {
            if let LayerState::Kda(k) = l {
                k.clear_captures();
            }
        }
    }

    /// Bytes this state holds (charged to the memory budget by the engine).
    pub fn byte_len(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(k) => {
                    4 * (k.committed.s.len() + k.work.s.len() + 2 * k.committed.conv.len())
                }
                LayerState::Mla(m) => 4 * (m.lat.capacity() + m.pe.capacity()),
            })
            .sum()
    }
}

impl K3State {
    /// A state of `positions` committed positions with the shapes a Kimi K3 model of `cfg`
    /// gives its states (as `KimiK3::new_state`), filled with values drawn from `seed` instead
    /// of computed by a model. For benchmarks of what a state costs to store and restore at a
    /// configuration too large to run here (the full K3 at 16k tokens): never for generation.
    pub fn synthetic(cfg: &K3Config, positions: usize, seed: u64) -> Self {
        let mut st = Self::new(&LayerShape::of_config(cfg));
        let mut rng = SplitMix::new(seed);
        let mut fill = |v: &mut Vec<f32>, n: usize| {
            v.clear();
            v.extend((0..n).map(|_| rng.uniform()));
        };
        for l in &mut st.layers {
            match l {
                LayerState::Kda(k) => {
                    let (s, c) = (k.committed.s.len(), k.committed.conv.len());
                    fill(&mut k.committed.s, s);
                    fill(&mut k.committed.conv, c);
                }
                LayerState::Mla(m) => {
                    let (mut lat, mut pe) = (Vec::new(), Vec::new());
                    fill(&mut lat, positions * m.lat_dim);
                    fill(&mut pe, positions * m.pe_dim);
                    (m.lat, m.pe) = (lat.into(), pe.into());
                }
            }
        }
        st.committed = positions;
        st
    }
}

#[cfg(test)]
mod tests;
