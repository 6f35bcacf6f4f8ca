//! Getting routed-expert bytes into memory. The model asks for the experts a pass needs through
//! [`ExpertStore`]; how the bytes arrive (mapped in place from the published shards, read from
//! SSD into a cache, fetched over HTTP) is this crate's business, not the model's.
//!
//! The callback form of [`ExpertStore::for_each`] lets a store hand over experts in whatever order
//! they become ready (cache hits first, misses as their reads complete); the model combines the
//! results per row in router order afterwards, so arrival order never changes a result.

pub mod mapped;

pub use mapped::{ExpertTensorNames, MappedExperts};

/// One expert's three MXFP4 matrices as byte slices (packed nibbles and E8M0 scales).
#[derive(Debug, Clone, Copy)]
pub struct ExpertView<'a> {
    /// `w1` (gate) packed `[inter, latent/2]`.
    pub w1_packed: &'a [u8],
    /// `w1` scales `[inter, latent/32]`.
    pub w1_scale: &'a [u8],
    /// `w2` (down) packed `[latent, inter/2]`.
    pub w2_packed: &'a [u8],
    /// `w2` scales `[latent, inter/32]`.
    pub w2_scale: &'a [u8],
    /// `w3` (up) packed `[inter, latent/2]`.
    pub w3_packed: &'a [u8],
    /// `w3` scales `[inter, latent/32]`.
    pub w3_scale: &'a [u8],
}

/// Errors from the expert store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The checkpoint lacks an expert tensor or it has the wrong type or shape.
    #[error(transparent)]
    Checkpoint(#[from] sluice_checkpoint::CheckpointError),
    /// A layer or expert index outside the model.
    #[error("expert {expert} of layer {layer} does not exist (the layer has {experts} routed experts)")]
    NoSuchExpert {
        /// Layer index.
        layer: usize,
        /// Expert index asked for.
        expert: u32,
        /// Routed experts in that layer.
        experts: usize,
    },
    /// The consumer of an expert failed; the store stops and passes the error on.
    #[error("{0}")]
    Consumer(String),
}

/// Hit/miss/byte counters a store keeps (all zero for a store that maps everything in place).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Expert requests served.
    pub requests: u64,
    /// Bytes of expert weights handed to the model.
    pub bytes_served: u64,
    /// Bytes read from storage (0 when mapped and already resident).
    pub bytes_read: u64,
}

/// A source of routed experts.
pub trait ExpertStore: Send + Sync {
    /// Calls `f(id, view)` once for every expert id in `ids` (distinct ids of one layer), in an
    /// order of the store's choosing. Stops at the first error.
    fn for_each(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// Counters so far.
    fn stats(&self) -> StoreStats;
}
