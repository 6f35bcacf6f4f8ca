//! Pulling checkpoints from a Hugging Face–compatible hub: `sluice pull`.
//!
//! The flow is resolve → plan → pull:
//!
//! 1. [`HubClient::resolve`] turns `REPO@REVISION` into a pinned commit and every file's
//!    size and hashes (model API + paginated tree API).
//! 2. [`HubClient::plan`] reads shard headers by range request, finds what is already local
//!    (the install target, `.part` files, the Hugging Face cache) and checks the need of
//!    each mode — full, or stream (everything but the routed experts) — plus headroom
//!    against free space. It moves no file content and prints as a human-readable plan.
//! 3. [`HubClient::pull`] carries the plan out with N workers: resumable, SHA-256 verified,
//!    fsynced and renamed into place, recorded in `sluice-install.json`.
//!
//! [`RangeFetcher`] is the remote source for stream mode: byte ranges of a pinned file with
//! retries, backoff, `Retry-After` and length checks. [`hf_cache`] reads and writes the
//! standard cache layout so sluice shares one copy with other tools.
//!
//! Every fault ends in a verified file or an [`HubError`] naming the file and cause; a file
//! never appears under its final name unverified. With the `test-hub` feature, `testhub`
//! serves a tiny hub on 127.0.0.1 with switchable faults, for tests and benchmarks.

mod client;
pub mod doctor;
mod download;
pub mod error;
mod fetcher;
pub mod hf_cache;
pub mod layout;
pub mod manifest;
pub mod plan;
pub mod progress;
mod pull;
mod remote;
mod repo;
pub mod shard;
pub mod sink;
mod stream;
#[cfg(feature = "test-hub")]
pub mod testhub;
pub mod verify;

pub use client::{HubClient, HubConfig, RetryPolicy, DEFAULT_ENDPOINT};
pub use error::{bytes, FileFailure, HubError, Result};
pub use fetcher::RangeFetcher;
pub use hf_cache::HfCache;
pub use layout::{InstallTarget, Layout, MANIFEST_FILE};
pub use manifest::{FileState, InstallManifest, ManifestFile, RangeRecord, Source, StreamShard};
pub use plan::{
    FreeSpace, InstallPlan, LocalState, Mode, ModeNeeds, ModeRequest, PlanOptions, PlannedFile,
    StatvfsFreeSpace, Verdict,
};
pub use progress::{Bars, NoProgress, Progress};
pub use pull::{FileOutcome, FileReport, InstallReport, LinkKind, PullOptions};
pub use remote::{HubRemote, Install};
pub use repo::{validate_path, validate_repo, validate_revision, RemoteFile, RepoInfo};
pub use shard::{RoutedTensors, ShardHeader, Span};
pub use sink::{FsSinks, Sink, SinkFactory};
