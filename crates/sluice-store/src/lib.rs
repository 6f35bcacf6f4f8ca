//! Getting routed-expert bytes into memory. The model asks for the experts a pass needs through
//! [`ExpertStore`]; how the bytes arrive (mapped in place from the published shards, read from
//! SSD into a cache, fetched over HTTP) is this crate's business, not the model's.
//!
//! The callback form of [`ExpertStore::for_each`] hands experts over in ascending id order while
//! their reads run (a hit or a finished read waits, in its pinned slot, for the lower ids before
//! it): the model adds each expert's output into one running sum per row as it comes, so its
//! rounding is fixed by the row's routing and read completion order never changes a result.
//!
//! Two stores exist: [`MappedExperts`] maps every expert in place (the page cache decides what
//! is resident), and [`StreamingExperts`] reads the experts a layer needs from the shards into
//! a fixed arena of cache slots charged to the memory budget (see the crate README for the
//! design: [`index`] locates experts, [`io`] reads them, [`reader`] keeps many reads in flight,
//! [`cache`] and [`policy`] decide what stays, [`streaming`] ties them together).
//!
//! The spine (everything but routed experts) is placed by [`spine::SpineStore`]: resident
//! pieces read once into budget-charged buffers, the rest streamed layer by layer through two
//! buffers (the next piece read while the current one computes).

pub mod arena;
pub mod backend;
pub mod cache;
pub mod fault;
pub mod hotset;
pub mod index;
pub mod io;
pub mod layout;
pub mod mapped;
pub mod platform;
pub mod policy;
pub mod probe;
pub mod reader;
pub mod remote;
pub mod spine;
pub mod storage_check;
pub mod streaming;
pub mod telemetry;
#[cfg(target_os = "linux")]
pub mod uring;

use std::path::PathBuf;

pub use backend::{IoBackend, Readers};
pub use cache::CacheSize;
pub use fault::FaultyReader;
pub use index::{ExpertIndex, ExpertLoc};
pub use io::{IoMode, ReadAt, ShardFiles};
pub use layout::{ExpertLayout, ExpertPart, ExpertView, MAX_PARTS};
pub use mapped::MappedExperts;
pub use policy::PolicyKind;
pub use reader::ReaderPool;
pub use remote::{
    DiskCacheConfig, DiskPin, ExpertDiskCache, RemoteError, RemoteSource, RemoteStats,
};
pub use spine::{Placement, SpineIndex, SpineStats, SpineStore};
pub use streaming::{LayerPrefetchStats, StreamingConfig, StreamingExperts};
pub use telemetry::{Sample, Telemetry};

/// Errors from the expert store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The checkpoint lacks an expert tensor or it has the wrong type or shape.
    #[error(transparent)]
    Checkpoint(#[from] sluice_checkpoint::CheckpointError),
    /// A layer or expert index outside the model.
    #[error(
        "expert {expert} of layer {layer} does not exist (the layer has {experts} routed experts)"
    )]
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
    /// Reading an expert's bytes failed, or the file ended before the expert did.
    #[error("{path}: reading {len} bytes at offset {offset}: {source}")]
    Read {
        /// The shard file.
        path: PathBuf,
        /// Absolute offset of the expert span being read.
        offset: u64,
        /// Length of that span in bytes.
        len: u64,
        /// The underlying error (`UnexpectedEof` for a file that ended early).
        #[source]
        source: std::io::Error,
    },
    /// Reading a piece of the spine (a layer, the embedding, the head) failed.
    #[error("reading the spine of {piece}: {path}: {len} bytes at offset {offset}: {source}")]
    SpineRead {
        /// The piece (`layer 3`, `lm_head`, `embedding`).
        piece: String,
        /// The shard file.
        path: PathBuf,
        /// Absolute offset of the read that failed.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The underlying error (`UnexpectedEof` for a file that ended early).
        #[source]
        source: std::io::Error,
    },
    /// Opening or inspecting a shard file failed.
    #[error("{path}: {source}")]
    Io {
        /// The shard file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An expert tensor's bytes lie (partly) outside its shard file.
    #[error(
        "{path}: tensor {tensor} spans bytes {offset}..{end} but the file has {file_len} bytes"
    )]
    SpanOutsideFile {
        /// The shard file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// First byte of the tensor.
        offset: u64,
        /// One past its last byte.
        end: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// The memory budget cannot hold even the smallest usable expert cache.
    #[error(
        "memory budget too small for the expert cache: {slots} slots of {slot_bytes} bytes \
         need {needed} bytes, but only {available} of {limit} budget bytes remain"
    )]
    Budget {
        /// Slots asked for (the configured minimum, or an explicit slot count).
        slots: usize,
        /// Bytes of one slot (the largest expert, aligned, plus alignment slack).
        slot_bytes: u64,
        /// `slots × slot_bytes`.
        needed: u64,
        /// Bytes the budget still had free.
        available: u64,
        /// The whole budget.
        limit: u64,
    },
    /// The memory budget cannot hold the spine placement asked for.
    #[error("spine placement: {0}")]
    SpineBudget(sluice_core::BudgetError),
    /// The arena allocation itself failed (the allocator returned nothing).
    #[error("could not allocate the {bytes}-byte expert cache arena")]
    Alloc {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Fetching an expert from the remote source of a stream install failed (after the
    /// source's own retries). Nothing of the request was recorded present.
    #[error("{path}: fetching {len} bytes at offset {offset} from the hub failed: {source}")]
    Remote {
        /// The local sparse shard the bytes were for.
        path: PathBuf,
        /// Absolute offset of the request in the shard.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The remote source's error.
        #[source]
        source: RemoteError,
    },
    /// The disk budget of a stream install's expert cache cannot hold what a pass needs.
    #[error(
        "the expert disk cache budget of {budget} bytes cannot hold an expert of {needed} bytes \
         (raise --disk-cache)"
    )]
    DiskBudget {
        /// The disk budget.
        budget: u64,
        /// Bytes that did not fit.
        needed: u64,
    },
    /// A configuration value that cannot work (zero readers, zero slots, a bad layer list).
    #[error("invalid expert store configuration: {0}")]
    Config(String),
    /// The storage probe was given nothing it can measure (a file smaller than one block, a
    /// device, a FIFO).
    #[error("storage probe: {0}")]
    ProbeInput(String),
}

/// Hit/miss/byte counters a store keeps (all zero for a store that maps everything in place).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Expert requests served.
    pub requests: u64,
    /// Bytes of expert weights handed to the model.
    pub bytes_served: u64,
    /// Bytes read from storage (0 when mapped and already resident). With aligned (O_DIRECT)
    /// reads this includes the alignment padding around each span.
    pub bytes_read: u64,
    /// Expert reads that completed (demand, read-ahead and prefetch): one per expert read.
    pub expert_reads: u64,
    /// Read requests those expert reads made to the disk: one per span (an expert whose parts
    /// [`index::coalesce`] merges into one span is one request; GPT-OSS's stacked tensors make
    /// four). `span_reads / expert_reads` is the requests per expert.
    pub span_reads: u64,
    /// Requested experts that were already ready in the cache.
    pub hits: u64,
    /// Requested experts that were not ready (absent, or still being read).
    pub misses: u64,
    /// Expert reads queued by [`ExpertStore::prefetch`] (cancelled ones included).
    pub prefetch_issued: u64,
    /// Prefetch reads cancelled before they started (wrong guesses, or `cancel_prefetch`).
    pub prefetch_cancelled: u64,
    /// Requested experts that were ready or in flight because of a prefetch.
    pub prefetch_used: u64,
    /// Bytes read by prefetches whose expert was not requested when its layer ran.
    pub prefetch_wasted_bytes: u64,
    /// Nanoseconds [`ExpertStore::for_each`] spent waiting for reads (or for a free slot).
    pub stall_ns: u64,
    /// Nanoseconds reader threads spent reading, summed over threads.
    pub read_ns: u64,
    /// Wall nanoseconds during which at least one read was in flight (the disk worked for
    /// the store); `bytes_read` over it is the bandwidth the store's reads got.
    pub busy_ns: u64,
    /// Expert reads that failed (after the reader's own continuation of short reads). A
    /// failure reaches the requests waiting on that read; a read-ahead or prefetch read that
    /// fails before any request takes it is dropped, and its request reads the expert again.
    pub read_errors: u64,
}

/// What [`ExpertStore::with_all`] hands a layer's experts to: `(id, view)` for each, in
/// ascending id.
pub type AllExperts<'f> = dyn FnMut(&[(u32, ExpertView<'_>)]) -> Result<(), StoreError> + 'f;

/// A source of routed experts.
pub trait ExpertStore: Send + Sync {
    /// Calls `f(id, view)` once for every expert id in `ids` (distinct ids of one layer), in
    /// ascending id order whatever order `ids` lists them in or their reads finish in (the
    /// models add each expert's output into a running sum per row, whose rounding this order
    /// fixes). Stops at the first error.
    fn for_each(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// Calls `f` once with every expert of `ids` (distinct ids of one layer), in ascending id
    /// order, when the store holds them all resident at once (a mapped store), so a caller can
    /// batch a layer's experts into a few kernel calls; `Ok(true)` then. `Ok(false)`, before
    /// anything is counted or `f` runs, when the store does not hand experts over all at once
    /// (the caller uses [`ExpertStore::for_each`] instead): the default, and a streaming store's
    /// answer, whose per-expert path overlaps reads with compute. Counts what `for_each`
    /// would count and fails as it would on an id outside the layer (before `f` runs).
    fn with_all(
        &self,
        layer: usize,
        ids: &[u32],
        f: &mut AllExperts<'_>,
    ) -> Result<bool, StoreError> {
        let _ = (layer, ids, f);
        Ok(false)
    }

    /// Enters every expert this store serves from a mapping into the process's page tables now
    /// (reading from storage what is not cached), so that the first passes do not pay a page
    /// fault per few pages read; returns the bytes covered. Meant for load time, when the plan
    /// has found every expert resident. The default, and a streaming store's answer: `Ok(0)`.
    fn populate(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Counters so far.
    fn stats(&self) -> StoreStats;

    /// A hint that `layer` will soon ask for `ids`: a store may start reading them now, at a
    /// lower priority than demanded reads. A wrong guess costs bandwidth, never correctness;
    /// the guess is dropped (unstarted reads cancelled) when `layer` is demanded. Invalid ids
    /// are ignored. The default does nothing.
    fn prefetch(&self, layer: usize, ids: &[u32]) {
        let _ = (layer, ids);
    }

    /// [`ExpertStore::for_each`] for `layer`, and the guess `next = (later layer, ids)` passed
    /// to [`ExpertStore::prefetch`] at the point where it cannot hurt this call: a store that
    /// caches issues it only once every expert of `ids` holds its slot (so no guess evicts a
    /// demanded expert) and may drop it when the cache is too small. The default prefetches
    /// first, then calls `for_each`.
    fn for_each_then_prefetch(
        &self,
        layer: usize,
        ids: &[u32],
        next: Option<(usize, &[u32])>,
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if let Some((l, guess)) = next {
            self.prefetch(l, guess);
        }
        self.for_each(layer, ids, f)
    }

    /// Streaming accounting per layer (indexed by layer; empty for a store that does not
    /// stream).
    fn layer_stats(&self) -> Vec<LayerPrefetchStats> {
        Vec::new()
    }

    /// `layer` is about to ask for exactly `ids` (the router has chosen them): a store that
    /// reads from storage may submit their reads now, as demanded reads, so the caller can
    /// compute something that does not need them (the shared experts) while they are in flight.
    /// The following [`ExpertStore::for_each`] picks them up; they count as misses, not as
    /// prefetches. Reads start only into free or evictable slots. The default does nothing.
    fn read_ahead(&self, layer: usize, ids: &[u32]) {
        let _ = (layer, ids);
    }

    /// Cancels the not-yet-started prefetch reads of `layer`. The default does nothing.
    fn cancel_prefetch(&self, layer: usize) {
        let _ = layer;
    }
}
