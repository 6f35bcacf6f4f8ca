//! Where a pass finds its spine bytes, for every family that places its spine piece by piece
//! (`places_spine` in [`crate::family::FAMILIES`]): mapped in place from the checkpoint (the page
//! cache decides what is resident), or from a [`SpineStore`] that holds each piece resident,
//! streams it through two buffers, or reads the embedding by rows, inside the memory budget.
//!
//! The pieces, in pass order: `0` the embedding, `1..=N` the decoder layers, `N + 1` the head
//! (lm_head). Each piece is the set of its weight matrices ([`crate::linear::Linear`] and the
//! families' own quantized handles, listed as [`TensorRange`]s); small vectors (norms, biases)
//! are widened to f32 at load and kept by the model. A family's forward takes piece `i` with
//! [`Spine::piece`] before running layer `i` and reads every matrix of the layer from it, so the
//! same bytes reach the same kernels whatever the placement and logits are bit-identical across
//! placements. Kimi K3's pieces are listed in `kimi_k3::spine`, the others' in their
//! `weights.rs`.

use crate::linear::Linear;
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

impl TensorBytes for Arc<Checkpoint> {
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

/// Where tensor `e` is, as a spine piece lists it.
pub fn range_of(e: &TensorEntry) -> TensorRange {
    TensorRange { file: e.shard, offset: e.offset, len: e.len }
}

/// The byte ranges a matrix reads: its data, and a row-int8 matrix's scales.
pub fn ranges(m: &Linear) -> Vec<TensorRange> {
    m.entries().map(range_of).collect()
}

/// The spine index of a model whose embedding reads `embed`, whose decoder layer `i` reads
/// `layers[i]` and whose head reads `head`, over `ckpt`'s shards.
pub fn index(
    ckpt: &Checkpoint,
    embed: &Linear,
    layers: Vec<Vec<TensorRange>>,
    head: &Linear,
) -> Result<SpineIndex, ModelError> {
    let mut pieces = Vec::with_capacity(layers.len() + 2);
    pieces.push(PieceLayout::new("embedding", &ranges(embed)));
    for (i, r) in layers.iter().enumerate() {
        pieces.push(PieceLayout::new(format!("layer {i}"), r));
    }
    pieces.push(PieceLayout::new("lm_head", &ranges(head)));
    Ok(SpineIndex::new(pieces, ckpt.shard_paths().to_vec())?)
}

/// Where the spine bytes of a pass come from.
#[derive(Debug, Clone, Default)]
pub(crate) enum Spine {
    /// Mapped in place from the checkpoint.
    #[default]
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
    /// The spine placed by `store`, which must have been opened on `index` (the model's own).
    pub(crate) fn placed(store: Arc<SpineStore>, index: &SpineIndex) -> Result<Self, ModelError> {
        if store.index() != index {
            return Err(ModelError::Config(
                "the spine store was opened on another model's spine index".into(),
            ));
        }
        Ok(Self::Placed(store))
    }

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
        embed: &Linear,
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
                range_of(embed.entry()),
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
