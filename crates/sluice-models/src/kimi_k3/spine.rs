//! Where a Kimi K3 pass finds its spine bytes: mapped in place from the checkpoint (the page
//! cache decides what is resident), or from a [`SpineStore`] that holds each piece resident,
//! streams it through two buffers, or reads the embedding by rows, inside the memory budget.
//!
//! The pieces, in pass order: `0` the embedding, `1..=N` the decoder layers, `N + 1` the head
//! (lm_head). Each piece is the set of its weight matrices; small vectors (norms, biases, conv
//! taps, AttnRes weights) are widened to f32 at load and kept by the model. The same bytes reach
//! the same kernels whatever the placement, so logits are bit-identical across placements.

use super::weights::{Attn, Ffn, K3Weights, LayerWeights, Mat};
use crate::ModelError;
use sluice_checkpoint::{Checkpoint, TensorEntry};
use sluice_store::spine::{PieceGuard, PieceLayout, TensorRange};
use sluice_store::{Placement, SpineIndex, SpineStore};
use std::sync::{Arc, MutexGuard};

/// Something that holds tensor bytes: the mapped checkpoint, or one placed spine piece.
pub trait TensorBytes {
    /// The bytes of tensor `e`, if this source holds them.
    fn tensor_bytes(&self, e: &TensorEntry) -> Option<&[u8]>;
}

impl TensorBytes for Checkpoint {
    fn tensor_bytes(&self, e: &TensorEntry) -> Option<&[u8]> {
        self.try_bytes(e)
    }
}

impl TensorBytes for PieceGuard<'_> {
    fn tensor_bytes(&self, e: &TensorEntry) -> Option<&[u8]> {
        self.tensor(e.shard, e.offset, e.len)
    }
}

/// Piece number of the embedding.
pub const EMBED_PIECE: usize = 0;

/// Piece number of decoder layer `i`.
pub fn layer_piece(i: usize) -> usize {
    i + 1
}

/// Piece number of the head for a model of `layers` layers.
pub fn head_piece(layers: usize) -> usize {
    layers + 1
}

fn range(m: &Mat) -> TensorRange {
    let e = m.entry();
    TensorRange { file: e.shard, offset: e.offset, len: e.len }
}

/// The byte ranges a matrix reads: its data, and a row-int8 matrix's scales.
fn ranges(m: &Mat) -> Vec<TensorRange> {
    let mut v = vec![range(m)];
    if let Some(e) = m.scale_entry() {
        v.push(TensorRange { file: e.shard, offset: e.offset, len: e.len });
    }
    v
}

/// The weight matrices of one decoder layer.
fn layer_mats(l: &LayerWeights) -> Vec<&Mat> {
    let mut v: Vec<&Mat> = Vec::with_capacity(16);
    match &l.attn {
        Attn::Kda(w) => v.extend([
            &w.q_proj, &w.k_proj, &w.v_proj, &w.f_a, &w.f_b, &w.b_proj, &w.g_proj, &w.o_proj,
        ]),
        Attn::Mla(w) => {
            v.extend([&w.q_a, &w.q_b, &w.kv_a, &w.kv_b, &w.o_proj]);
            v.extend(w.g_proj.as_ref());
        }
    }
    match &l.ffn {
        Ffn::Dense(w) => v.extend([&w.gate, &w.up, &w.down]),
        Ffn::Moe(w) => {
            v.push(&w.router);
            v.extend(w.down.as_ref());
            v.extend(w.up.as_ref());
            if let Some(s) = &w.shared {
                v.extend([&s.gate, &s.up, &s.down]);
            }
        }
    }
    v
}

/// The spine pieces of `w` in pass order, with their byte spans in `ckpt`'s shards.
pub fn index(w: &K3Weights, ckpt: &Checkpoint) -> Result<SpineIndex, ModelError> {
    let mut pieces = Vec::with_capacity(w.layers.len() + 2);
    pieces.push(PieceLayout::new("embedding", &ranges(&w.embed)));
    for (i, l) in w.layers.iter().enumerate() {
        let r: Vec<TensorRange> = layer_mats(l).into_iter().flat_map(ranges).collect();
        pieces.push(PieceLayout::new(format!("layer {i}"), &r));
    }
    pieces.push(PieceLayout::new("lm_head", &ranges(&w.lm_head)));
    Ok(SpineIndex::new(pieces, ckpt.shard_paths().to_vec())?)
}

/// Bytes of the f32 vectors the model keeps whatever the placement (norms, biases, conv taps).
pub fn small_bytes(w: &K3Weights) -> u64 {
    let f = |v: &Vec<f32>| v.len() as u64 * 4;
    let mut n = f(&w.norm) + w.output_res.as_ref().map_or(0, f);
    for l in &w.layers {
        n += f(&l.input_norm) + f(&l.post_norm);
        n += l.attn_res.as_ref().map_or(0, f) + l.mlp_res.as_ref().map_or(0, f);
        match &l.attn {
            Attn::Kda(k) => {
                n += k.conv.iter().map(f).sum::<u64>() + f(&k.a_exp) + f(&k.dt_bias) + f(&k.o_norm);
            }
            Attn::Mla(m) => n += f(&m.q_a_norm) + f(&m.kv_a_norm),
        }
        if let Ffn::Moe(m) = &l.ffn {
            n += f(&m.bias) + m.norm.as_ref().map_or(0, f);
        }
    }
    n
}

/// Where the spine bytes of a pass come from.
#[derive(Debug, Clone)]
pub(crate) enum Spine {
    /// Mapped in place from the checkpoint.
    Mapped,
    /// Placed by a spine store.
    Placed(Arc<SpineStore>),
}

/// One piece for reading.
pub(crate) enum PieceRef<'a> {
    Mapped(&'a Checkpoint),
    Placed(PieceGuard<'a>),
}

impl TensorBytes for PieceRef<'_> {
    fn tensor_bytes(&self, e: &TensorEntry) -> Option<&[u8]> {
        match self {
            Self::Mapped(c) => c.tensor_bytes(e),
            Self::Placed(g) => g.tensor_bytes(e),
        }
    }
}

impl Spine {
    /// Holds the store's pass lock when pieces stream (passes must not interleave their reads).
    pub(crate) fn begin_pass(&self) -> Option<MutexGuard<'_, ()>> {
        match self {
            Self::Placed(s) if s.streams() => Some(s.begin_pass()),
            _ => None,
        }
    }

    /// Piece `i`, waiting for its read if it streams.
    pub(crate) fn piece<'a>(
        &'a self,
        ckpt: &'a Checkpoint,
        i: usize,
    ) -> Result<PieceRef<'a>, ModelError> {
        match self {
            Self::Mapped => Ok(PieceRef::Mapped(ckpt)),
            Self::Placed(s) => Ok(PieceRef::Placed(s.acquire(i)?)),
        }
    }

    /// Piece `i` if it is at hand without starting a read (for optional work: prefetch).
    pub(crate) fn peek<'a>(&'a self, ckpt: &'a Checkpoint, i: usize) -> Option<PieceRef<'a>> {
        match self {
            Self::Mapped => Some(PieceRef::Mapped(ckpt)),
            Self::Placed(s) => s.peek(i).map(PieceRef::Placed),
        }
    }

    /// Embedding rows of `tokens` widened to f32 into `h` (`[T, d]`).
    pub(crate) fn embed(
        &self,
        ckpt: &Checkpoint,
        embed: &Mat,
        tokens: &[u32],
        h: &mut [f32],
    ) -> Result<(), ModelError> {
        let d = h.len() / tokens.len().max(1);
        let rows_placed = matches!(self, Self::Placed(s)
            if s.placements().get(EMBED_PIECE) == Some(&Placement::Rows));
        if let (Self::Placed(_), true, true) = (self, rows_placed, embed.is_int8()) {
            return Err(ModelError::Config(
                "an int8 embedding cannot be read by rows: convert without --embeddings or give \
                 the spine more --memory"
                    .into(),
            ));
        }
        if let (Self::Placed(s), true) = (self, rows_placed) {
            let rows: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
            let mut bad = false;
            s.read_rows(
                EMBED_PIECE,
                range(embed),
                embed.row_bytes(),
                &rows,
                &mut |i, b| match embed.row_matrix(b) {
                    Some(m) => m.row_to_f32(0, &mut h[i * d..(i + 1) * d]),
                    None => bad = true,
                },
            )?;
            if bad {
                return Err(ModelError::Config("embedding row has the wrong byte length".into()));
            }
            return Ok(());
        }
        let p = self.piece(ckpt, EMBED_PIECE)?;
        let m = embed.get(&p);
        for (ti, &id) in tokens.iter().enumerate() {
            m.row_to_f32(id as usize, &mut h[ti * d..(ti + 1) * d]);
        }
        Ok(())
    }

    /// Spine I/O counters (zero when mapped).
    pub(crate) fn stats(&self) -> sluice_store::SpineStats {
        match self {
            Self::Mapped => sluice_store::SpineStats::default(),
            Self::Placed(s) => s.stats(),
        }
    }
}
