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

use super::{k3_layers, kv_layers, StateSnapshot};
use crate::kimi_k3::state::{K3State, LayerState};
use crate::qwen3::state::Qwen3State;

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
            let prev = out.last().or(base);
            let snap = k3_layers(s, s.len() + off, |k| &k.captured[j], prev, owner);
            out.push(snap);
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
            let snap = kv_layers(s, s.len() + off, out.last().or(base), owner);
            out.push(snap);
        }
    }
    out
}
