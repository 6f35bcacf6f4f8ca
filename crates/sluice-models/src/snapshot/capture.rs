//! Snapshots of the state after rows inside a staged pass ([`crate::Model::forward_capturing`]):
//! what a state that ran only the pass's first `offset` rows and committed them would snapshot,
//! without cutting the pass there.
//!
//! An append-only cache (MLA latents, keys and values) is positional: the rows a pass staged
//! past the committed length are the rows single passes would have written, so the state after
//! row `offset` holds their first `committed + offset` rows. A Kimi K3 KDA layer's recurrent
//! matrix and conv window change with every row; the layer copied its working state as its
//! chunk loop passed each requested row (`kimi_k3::kda::forward`), and that copy is taken here.
//! Each capture shares the cache rows of the one before it (the first, those of the caller's
//! base), as the snapshots of a cut pass share theirs.

use super::{Family, Rows, SnapLayer, StateSnapshot};
use crate::kimi_k3::state::{K3State, LayerState};
use crate::qwen3::state::Qwen3State;
use std::sync::Arc;

/// The cache rows of layer `i` of `prev` (a Kimi K3 MLA layer's latents and rope keys, or a KV
/// layer's keys and values), for sharing.
fn prev_rows(prev: Option<&StateSnapshot>, i: usize) -> (Option<&Rows>, Option<&Rows>) {
    match prev.and_then(|p| p.layers.get(i)) {
        Some(SnapLayer::Mla { lat, pe, .. }) => (Some(lat), Some(pe)),
        Some(SnapLayer::Kv { k, v, .. }) => (Some(k), Some(v)),
        _ => (None, None),
    }
}

/// The captures of `s`'s staged pass (see the module docs), in offset order; empty when no
/// pass is staged, nothing was requested, or a KDA layer missed a requested row. The request
/// and the copies are cleared either way.
pub(crate) fn captures_k3(
    s: &mut K3State,
    base: Option<&StateSnapshot>,
    owner: &'static str,
) -> Vec<StateSnapshot> {
    let offsets = s.capture_offsets().to_vec();
    let complete = s.layers.iter().all(|l| match l {
        LayerState::Kda(k) => k.captured.len() == offsets.len(),
        LayerState::Mla(_) => true,
    });
    let mut out: Vec<StateSnapshot> = Vec::with_capacity(offsets.len());
    if s.pending().is_some() && complete {
        for (j, &off) in offsets.iter().enumerate() {
            let n = s.len() + off;
            let prev = out.last().or(base);
            let layers = s
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| match l {
                    LayerState::Kda(k) => SnapLayer::Kda {
                        s: Arc::from(k.captured[j].s.as_slice()),
                        conv: Arc::from(k.captured[j].conv.as_slice()),
                        heads: k.heads,
                        dim: k.dim,
                    },
                    LayerState::Mla(m) => {
                        let (bl, bp) = prev_rows(prev, i);
                        SnapLayer::Mla {
                            lat: Rows::capture(&m.lat, n * m.lat_dim, bl),
                            pe: Rows::capture(&m.pe, n * m.pe_dim, bp),
                            lat_dim: m.lat_dim,
                            pe_dim: m.pe_dim,
                        }
                    }
                })
                .collect();
            out.push(StateSnapshot { family: Family::KimiK3, owner, layers, len: n });
        }
    }
    s.clear_captures();
    out
}

/// The captures of `s`'s staged pass (see the module docs), in offset order; empty when no
/// pass is staged or nothing was requested. The request is cleared either way.
pub(crate) fn captures_kv(
    s: &mut Qwen3State,
    base: Option<&StateSnapshot>,
    owner: &'static str,
) -> Vec<StateSnapshot> {
    let offsets = std::mem::take(&mut s.capture_at);
    let mut out: Vec<StateSnapshot> = Vec::with_capacity(offsets.len());
    if s.pending().is_some() {
        for &off in &offsets {
            let n = s.len() + off;
            let prev = out.last().or(base);
            let layers = s
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let (bk, bv) = prev_rows(prev, i);
                    SnapLayer::Kv {
                        k: Rows::capture(&l.k, n * l.width, bk),
                        v: Rows::capture(&l.v, n * l.width, bv),
                        width: l.width,
                    }
                })
                .collect();
            out.push(StateSnapshot { family: Family::Qwen3, owner, layers, len: n });
        }
    }
    out
}
