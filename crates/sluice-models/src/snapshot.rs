//! Compact snapshots of a sequence state: exactly what its committed positions need.
//!
//! A live [`State`] carries more than its committed positions: a Kimi K3 KDA layer keeps a working
//! copy of its recurrent matrix for the staged pass (as large as the committed one) and the staged
//! rows' recurrence inputs, and the append-only caches (MLA latents, Qwen3 keys and values) have
//! spare capacity. Cloning it for conversation reuse copies all of that. A [`StateSnapshot`] keeps
//! only the committed KDA states (recurrent matrix and conv window) and the committed rows of each
//! append-only cache.
//!
//! The cache rows are held as shared segments: a snapshot taken from a state that extends an
//! earlier snapshot (the next checkpoint of the same prompt, the end of a generation) references
//! the earlier snapshot's segments and copies only the rows added since. A conversation's chain of
//! snapshots therefore holds each cache row once. [`StateSnapshot::for_each_part`] names every
//! allocation so that a store of many snapshots counts shared segments once.
//!
//! [`StateSnapshot::restore`] rebuilds a state whose next pass is bit-identical to the next pass
//! of the state it was taken from (tested in `tests/snapshot.rs`). [`StateSnapshot::encode`] and
//! [`StateSnapshot::decode`] (in `codec`) give it a byte form for the engine's on-disk cache.
//!
//! [`reference_state`] and [`crate::State::fill_synthetic`] make states of drawn values, for
//! benchmarks of what a state costs to store and restore (`sluice bench --snapshot-io`).

mod capture;
mod codec;
mod drawn;

pub(crate) use codec::k3_shape_of;
pub use codec::{
    from_le_in_place, le_bytes, SnapshotCodecError, SnapshotLayout, StateShape,
    SNAPSHOT_FORMAT_VERSION,
};
pub use drawn::reference_state;
use drawn::{fill_k3, fill_kv};

use crate::kimi_k3::state::{K3State, KdaLayer, KdaState, LayerState, MlaLayer};
use crate::qwen3::state::{KvCache, Qwen3State};
use crate::state::{FamilyState, State};
use sluice_kernels::LineVec;
use std::any::Any;
use std::sync::Arc;

/// The committed rows of an append-only cache (`[len, width]` f32), as shared segments.
#[derive(Debug, Clone, Default)]
struct Rows {
    segs: Vec<Arc<[f32]>>,
    len: usize,
}

/// Whether `a` and `b` hold the same bits (NaN-safe, unlike `==`).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

impl Rows {
    /// The first `len` values of `data`, sharing `base`'s segments when `base` is a prefix of
    /// them ([`Self::capture_rows`] of rows of one value).
    fn capture(data: &[f32], len: usize, base: Option<&Rows>) -> Self {
        Self::capture_rows(data, (1, 1), len, base)
    }

    /// The values of the first `n` rows of a cache (`width` values a row, rows `stride` apart:
    /// a padded cache's padding is not kept, so a snapshot and the file written from it hold
    /// `n · width` values), sharing `base`'s segments when `base` is a prefix of them. The
    /// check compares `base`'s last segment with the same rows of `data`; earlier segments are
    /// trusted because a chain is only ever built from one growing state.
    fn capture_rows(
        data: &[f32],
        (width, stride): (usize, usize),
        n: usize,
        base: Option<&Rows>,
    ) -> Self {
        if width == 0 {
            return Self::default();
        }
        let n = n.min(data.len() / stride);
        let row = |i: usize| &data[i * stride..][..width];
        let shared = base.filter(|b| {
            b.len <= n * width
                && b.len % width == 0
                && b.segs.last().is_none_or(|last| {
                    let r0 = (b.len - last.len()) / width;
                    last.chunks_exact(width).enumerate().all(|(i, l)| same_bits(l, row(r0 + i)))
                })
        });
        let mut segs = shared.map(|b| b.segs.clone()).unwrap_or_default();
        let start = shared.map_or(0, |b| b.len / width);
        if n > start {
            if stride == width {
                segs.push(Arc::from(&data[start * width..n * width]));
            } else {
                let mut seg = Vec::with_capacity((n - start) * width);
                for i in start..n {
                    seg.extend_from_slice(row(i));
                }
                segs.push(Arc::from(seg));
            }
        }
        Self { segs, len: n * width }
    }

    /// The rows, `width` values each, as a padded cache's vector (rows `stride` apart, the
    /// padding zeros).
    fn restore_rows(&self, (width, stride): (usize, usize)) -> LineVec {
        if width == stride || width == 0 {
            return self.restore();
        }
        let mut v = LineVec::with_capacity(self.len / width * stride);
        let pad = vec![0.0f32; stride - width];
        for s in &self.segs {
            for row in s.chunks_exact(width) {
                v.extend_from_slice(row);
                v.extend_from_slice(&pad);
            }
        }
        v
    }

    /// The rows as one vector.
    fn restore(&self) -> LineVec {
        let mut v = LineVec::with_capacity(self.len);
        for s in &self.segs {
            v.extend_from_slice(s);
        }
        v
    }

    fn for_each_part(&self, f: &mut dyn FnMut(usize, usize)) {
        for s in &self.segs {
            f(Arc::as_ptr(s).cast::<f32>() as usize, 4 * s.len());
        }
    }
}

/// One layer of a [`StateSnapshot`].
#[derive(Debug, Clone)]
enum SnapLayer {
    /// K3 KDA: the committed recurrent matrix and conv window.
    Kda { s: Arc<[f32]>, conv: Arc<[f32]>, heads: usize, dim: usize },
    /// K3 MLA: committed latents and rope keys.
    Mla { lat: Rows, pe: Rows, lat_dim: usize, pe_dim: usize },
    /// Qwen3: committed keys and values.
    Kv { k: Rows, v: Rows, width: usize },
}

/// Which family a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    KimiK3,
    Qwen3,
}

/// A compact copy of a [`State`]'s committed positions (see the module docs).
#[derive(Debug, Clone)]
pub struct StateSnapshot {
    family: Family,
    /// The family (table name) of the model whose state this was; a restored state keeps it.
    owner: &'static str,
    layers: Vec<SnapLayer>,
    len: usize,
}

/// The cache rows of layer `i` of `base` (a Kimi K3 MLA layer's latents and rope keys, or a KV
/// layer's keys and values), for the next snapshot to share.
fn base_rows(base: Option<&StateSnapshot>, i: usize) -> (Option<&Rows>, Option<&Rows>) {
    match base.and_then(|b| b.layers.get(i)) {
        Some(SnapLayer::Mla { lat, pe, .. }) => (Some(lat), Some(pe)),
        Some(SnapLayer::Kv { k, v, .. }) => (Some(k), Some(v)),
        _ => (None, None),
    }
}

/// A Kimi K3 snapshot of `n` positions: each KDA layer's recurrent and conv state as `kda`
/// picks it from the layer, each MLA layer's first `n` rows (sharing `base`'s).
fn k3_layers(
    s: &K3State,
    n: usize,
    kda: impl Fn(&KdaLayer) -> &KdaState,
    base: Option<&StateSnapshot>,
    owner: &'static str,
) -> StateSnapshot {
    let layers = s
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| match l {
            LayerState::Kda(k) => SnapLayer::Kda {
                s: Arc::from(kda(k).s.as_slice()),
                conv: Arc::from(kda(k).conv.as_slice()),
                heads: k.heads,
                dim: k.dim,
            },
            LayerState::Mla(m) => {
                let (bl, bp) = base_rows(base, i);
                SnapLayer::Mla {
                    lat: Rows::capture(&m.lat, n * m.lat_dim, bl),
                    pe: Rows::capture(&m.pe, n * m.pe_dim, bp),
                    lat_dim: m.lat_dim,
                    pe_dim: m.pe_dim,
                }
            }
        })
        .collect();
    StateSnapshot { family: Family::KimiK3, owner, layers, len: n }
}

/// A Qwen3-style snapshot of `n` positions: each layer's first `n` key and value rows (sharing
/// `base`'s).
fn kv_layers(
    s: &Qwen3State,
    n: usize,
    base: Option<&StateSnapshot>,
    owner: &'static str,
) -> StateSnapshot {
    let layers = s
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (bk, bv) = base_rows(base, i);
            SnapLayer::Kv {
                k: Rows::capture_rows(&l.k, (l.width, l.stride), n, bk),
                v: Rows::capture_rows(&l.v, (l.width, l.stride), n, bv),
                width: l.width,
            }
        })
        .collect();
    StateSnapshot { family: Family::Qwen3, owner, layers, len: n }
}

/// A snapshot of a Kimi K3 state (KDA and MLA layers).
fn snapshot_k3(s: &K3State, base: Option<&StateSnapshot>, owner: &'static str) -> StateSnapshot {
    k3_layers(s, s.len(), |k| &k.committed, base, owner)
}

/// A snapshot of a Qwen3-style state (keys and values).
fn snapshot_kv(s: &Qwen3State, base: Option<&StateSnapshot>, owner: &'static str) -> StateSnapshot {
    kv_layers(s, s.len(), base, owner)
}

impl FamilyState for K3State {
    fn commit(&mut self, n: usize) {
        K3State::commit(self, n);
    }
    fn rollback(&mut self) {
        K3State::rollback(self);
    }
    fn len(&self) -> usize {
        K3State::len(self)
    }
    fn byte_len(&self) -> usize {
        K3State::byte_len(self)
    }
    fn clone_box(&self) -> Box<dyn FamilyState> {
        Box::new(self.clone())
    }
    fn snapshot(&self, base: Option<&StateSnapshot>, family: &'static str) -> StateSnapshot {
        snapshot_k3(self, base, family)
    }
    fn snapshot_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(k) => 4 * (k.committed.s.len() + k.committed.conv.len()),
                LayerState::Mla(m) => 4 * self.len() * (m.lat_dim + m.pe_dim),
            })
            .sum()
    }
    fn shape(&self, family: &'static str) -> StateShape {
        codec::k3_shape(self, family)
    }
    fn fill_synthetic(&mut self, positions: usize, seed: u64) {
        fill_k3(self, positions, seed);
    }
    fn can_capture(&self) -> bool {
        true
    }
    fn request_captures(&mut self, offsets: &[usize]) -> bool {
        K3State::request_captures(self, offsets);
        true
    }
    fn take_captures(
        &mut self,
        base: Option<&StateSnapshot>,
        family: &'static str,
    ) -> Vec<StateSnapshot> {
        capture::captures_k3(self, base, family)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl FamilyState for Qwen3State {
    fn commit(&mut self, n: usize) {
        Qwen3State::commit(self, n);
    }
    fn rollback(&mut self) {
        Qwen3State::rollback(self);
    }
    fn len(&self) -> usize {
        Qwen3State::len(self)
    }
    fn byte_len(&self) -> usize {
        Qwen3State::byte_len(self)
    }
    fn clone_box(&self) -> Box<dyn FamilyState> {
        Box::new(self.clone())
    }
    fn snapshot(&self, base: Option<&StateSnapshot>, family: &'static str) -> StateSnapshot {
        snapshot_kv(self, base, family)
    }
    fn snapshot_bytes(&self) -> usize {
        self.layers.iter().map(|l| 8 * self.len() * l.width).sum()
    }
    fn shape(&self, family: &'static str) -> StateShape {
        codec::kv_shape(self, family)
    }
    fn fill_synthetic(&mut self, positions: usize, seed: u64) {
        fill_kv(self, positions, seed);
    }
    fn can_capture(&self) -> bool {
        true
    }
    fn request_captures(&mut self, offsets: &[usize]) -> bool {
        self.capture_at.clear();
        self.capture_at.extend_from_slice(offsets);
        true
    }
    fn take_captures(
        &mut self,
        base: Option<&StateSnapshot>,
        family: &'static str,
    ) -> Vec<StateSnapshot> {
        capture::captures_kv(self, base, family)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl StateSnapshot {
    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a snapshot of an empty state.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A live state equal to the one this snapshot was taken from (no pass staged). Its
    /// layers are copied in parallel on the current kernel pool: a Kimi K3 state is 0.5–1.4 GB
    /// of copies, which one core does no faster than a fast disk reads them.
    pub fn restore(&self) -> State {
        match self.family {
            Family::KimiK3 => {
                let layers =
                    sluice_kernels::pool::map(self.layers.len(), |i| match &self.layers[i] {
                        SnapLayer::Kda { s, conv, heads, dim } => {
                            // One copy: the snapshot stays shared (a session's chain, the base
                            // of the next snapshot), and the working copy is only allocated.
                            let st = KdaState { s: s.to_vec(), conv: conv.to_vec() };
                            Some(LayerState::Kda(KdaLayer::restored(st, *heads, *dim)))
                        }
                        SnapLayer::Mla { lat, pe, lat_dim, pe_dim } => {
                            Some(LayerState::Mla(MlaLayer {
                                lat: lat.restore(),
                                pe: pe.restore(),
                                lat_dim: *lat_dim,
                                pe_dim: *pe_dim,
                            }))
                        }
                        SnapLayer::Kv { .. } => None,
                    });
                State::new(
                    self.owner,
                    K3State::restored(layers.into_iter().flatten().collect(), self.len),
                )
            }
            Family::Qwen3 => {
                let layers =
                    sluice_kernels::pool::map(self.layers.len(), |i| match &self.layers[i] {
                        SnapLayer::Kv { k, v, width } => {
                            let mut cache = KvCache::new(*width);
                            let rows = (*width, cache.stride);
                            (cache.k, cache.v) = (k.restore_rows(rows), v.restore_rows(rows));
                            Some(cache)
                        }
                        _ => None,
                    });
                State::new(
                    self.owner,
                    Qwen3State::restored(layers.into_iter().flatten().collect(), self.len),
                )
            }
        }
    }

    /// Calls `f(id, bytes)` for every allocation this snapshot references; an allocation shared
    /// with another snapshot has the same id in both.
    pub fn for_each_part(&self, f: &mut dyn FnMut(usize, usize)) {
        for l in &self.layers {
            match l {
                SnapLayer::Kda { s, conv, .. } => {
                    f(Arc::as_ptr(s).cast::<f32>() as usize, 4 * s.len());
                    f(Arc::as_ptr(conv).cast::<f32>() as usize, 4 * conv.len());
                }
                SnapLayer::Mla { lat, pe, .. } => {
                    lat.for_each_part(f);
                    pe.for_each_part(f);
                }
                SnapLayer::Kv { k, v, .. } => {
                    k.for_each_part(f);
                    v.for_each_part(f);
                }
            }
        }
    }

    /// Bytes this snapshot references that `base` does not (what taking it cost when `base` was
    /// already held).
    pub fn bytes_beyond(&self, base: Option<&StateSnapshot>) -> usize {
        let mut held = std::collections::HashSet::new();
        if let Some(b) = base {
            b.for_each_part(&mut |id, _| {
                held.insert(id);
            });
        }
        let mut total = 0;
        self.for_each_part(&mut |id, b| {
            if !held.contains(&id) {
                total += b;
            }
        });
        total
    }

    /// Bytes this snapshot references, shared segments included.
    pub fn byte_len(&self) -> usize {
        let mut total = 0;
        self.for_each_part(&mut |_, b| total += b);
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kimi_k3::state::LayerShape;

    #[test]
    fn restore_copied_the_kda_state_twice() {
        let shapes = [
            LayerShape::Kda { heads: 2, dim: 4, conv_len: 6 },
            LayerShape::Mla { lat_dim: 3, pe_dim: 2 },
        ];
        let mut live = K3State::new(&shapes);
        fill_k3(&mut live, 5, 7);
        let snap = snapshot_k3(&live, None, "kimi_k3");
        let restored = snap.restore();
        let r = restored.family_ref::<K3State>("kimi_k3").expect("a K3 state");
        assert_eq!(r.len(), 5);
        let LayerState::Kda(k) = &r.layers[0] else { panic!("layer 0 is KDA") };
        let LayerState::Kda(want) = &live.layers[0] else { panic!("layer 0 is KDA") };
        assert!(same_bits(&k.committed.s, &want.committed.s));
        assert!(same_bits(&k.committed.conv, &want.committed.conv));
        // The working copy has its size but was not copied into: `begin` fills it per pass.
        assert_eq!((k.work.s.len(), k.work.conv.len()), (8 * 4, 6));
        assert!(k.work.s.iter().chain(&k.work.conv).all(|&x| x == 0.0), "copied twice");
        let LayerState::Mla(m) = &r.layers[1] else { panic!("layer 1 is MLA") };
        assert_eq!((m.lat.len(), m.pe.len()), (5 * 3, 5 * 2));
    }

    #[test]
    fn padded_cache_rows_are_snapshotted_and_written_unpadded_and_restored_padded() {
        // Rows of 256 values are kept 272 apart in memory; a snapshot, its file bytes and its
        // restore see the rows alone, and a later snapshot shares the earlier one's rows.
        let mut live = Qwen3State::new(2, 256);
        assert_eq!(live.layers[0].stride, 272);
        fill_kv(&mut live, 5, 9);
        let first = snapshot_kv(&live, None, "qwen3");
        for l in &first.layers {
            let SnapLayer::Kv { k, v, .. } = l else { panic!("KV layers") };
            assert_eq!((k.len, v.len), (5 * 256, 5 * 256), "the rows alone");
        }
        let mut file = Vec::new();
        first.encode(&mut file).expect("encode");
        assert_eq!(file.len(), first.encoded_len());
        let shape = codec::kv_shape(&live, "qwen3");
        let back =
            StateSnapshot::decode(&mut file.as_slice(), &shape, file.len() as u64).expect("decode");
        for snap in [&first, &back] {
            let restored = snap.restore();
            let r = restored.family_ref::<Qwen3State>("qwen3").expect("a Qwen3 state");
            for (a, b) in r.layers.iter().zip(&live.layers) {
                assert_eq!((a.len(), a.stride), (5, 272));
                assert!(same_bits(&a.k, &b.k) && same_bits(&a.v, &b.v), "rows and zero pads");
            }
        }
        // Two more positions: the first five rows are shared, the two new ones copied.
        live.begin(2);
        for l in &mut live.layers {
            let row: Vec<f32> = (0..2 * 256u16).map(f32::from).collect();
            l.push(&row, &row);
        }
        live.commit(2);
        let second = snapshot_kv(&live, Some(&first), "qwen3");
        let (SnapLayer::Kv { k: a, .. }, SnapLayer::Kv { k: b, .. }) =
            (&first.layers[0], &second.layers[0])
        else {
            panic!("KV layers")
        };
        assert!(Arc::ptr_eq(&a.segs[0], &b.segs[0]), "the earlier rows are shared");
        assert_eq!((b.segs.len(), b.len), (2, 7 * 256));
        let restored = second.restore();
        let r = restored.family_ref::<Qwen3State>("qwen3").expect("a Qwen3 state");
        assert!(same_bits(&r.layers[1].v, &live.layers[1].v));
    }

    #[test]
    fn rows_share_a_verified_prefix_and_copy_the_rest() {
        let data: Vec<f32> = (0..12u8).map(f32::from).collect();
        let a = Rows::capture(&data, 4, None);
        let b = Rows::capture(&data, 10, Some(&a));
        assert_eq!(b.segs.len(), 2);
        assert!(Arc::ptr_eq(&a.segs[0], &b.segs[0]), "the prefix is shared");
        assert_eq!(&b.restore()[..], &data[..10]);
        // A base that is not a prefix of the data is not shared.
        let other: Vec<f32> = (0..12u8).map(|x| f32::from(x) + 0.5).collect();
        let c = Rows::capture(&other, 10, Some(&a));
        assert_eq!(c.segs.len(), 1);
        assert_eq!(&c.restore()[..], &other[..10]);
        // A base longer than the data is not shared either.
        let d = Rows::capture(&data, 2, Some(&b));
        assert_eq!(&d.restore()[..], &data[..2]);
        let e = Rows::capture(&data, 4, Some(&a));
        assert_eq!((e.segs.len(), e.len), (1, 4), "nothing new: only the shared segment");
    }
}
