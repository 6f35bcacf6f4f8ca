//! Stream mode: routed experts that are not on local disk yet come from a remote source, and
//! a persistent on-disk expert cache keeps them for later runs.
//!
//! A stream install (see `sluice pull --stream`) holds every expert shard as a sparse file:
//! the header and spine at their original offsets, holes where the routed experts are. The
//! [`ExpertDiskCache`] fills those holes on demand: a missing expert is fetched from a
//! [`RemoteSource`] with one range request (adjacent missing experts of one pass coalesced
//! into one request), written into its hole with `pwrite`, synced, and only **then** recorded
//! as present in an append-only log (see [`log`]). A crash between the two leaves bytes that
//! are not recorded (fetched again later), never zeros recorded as present. The cache has a
//! disk budget; eviction first records the expert absent, then punches the hole back
//! (`fallocate(PUNCH_HOLE)`).
//!
//! The [`crate::StreamingExperts`] store reads experts from the sparse files as usual; it asks
//! the disk cache to *localize* the experts a pass demands before it reads them. Prefetch
//! never fetches remotely: a guess is read only when its expert is already local. Every read
//! holds a **disk pin** on its expert, so eviction never punches a hole under a read.
//!
//! This crate speaks no HTTP: the hub client implements [`RemoteSource`].

mod disk;
pub mod log;

pub use disk::{DiskCacheConfig, DiskPin, ExpertDiskCache, RemoteStats};

/// The error a [`RemoteSource`] reports for one request (after its own retries).
pub type RemoteError = Box<dyn std::error::Error + Send + Sync>;

/// Where missing expert bytes come from (a hub, in practice). Implementations retry
/// transient failures themselves; an error returned here is final for that request.
pub trait RemoteSource: Send + Sync {
    /// A short description for messages, e.g. `org/name@commit on https://hub`.
    fn describe(&self) -> String;

    /// Fills `buf` with bytes `offset .. offset + buf.len()` of shard `file` (an index into
    /// the expert index's shard paths), exactly: a short or misplaced answer is an error.
    fn fetch(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError>;
}

impl std::fmt::Debug for dyn RemoteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteSource({})", self.describe())
    }
}
