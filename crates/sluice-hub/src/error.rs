//! The one error type of the crate.
//!
//! Every variant names what it concerns — the URL that answered, the repository file being
//! pulled, or the local path being written — so a message alone says where a pull went wrong.
//! [`HubError::is_transient`] is the single place that decides what the retry loop may try
//! again: connection failures, stalls, truncated bodies, 5xx, 429 and checksum mismatches.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

/// Everything that can go wrong talking to a hub or installing what it serves.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The endpoint (from `HF_ENDPOINT` or the caller) is not an `http(s)://` URL.
    #[error("invalid hub endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A repository id that is not `NAME` or `ORG/NAME` of safe characters.
    #[error("invalid repository id {repo:?}: expected ORG/NAME (letters, digits, '-', '_', '.')")]
    InvalidRepo {
        /// The id as given.
        repo: String,
    },
    /// A revision name that cannot be used safely (empty, `..`, control characters).
    #[error("invalid revision {revision:?}")]
    InvalidRevision {
        /// The revision as given.
        revision: String,
    },
    /// The HTTP client could not be built (TLS backend, bad header value).
    #[error("building the HTTP client: {source}")]
    Client {
        /// The underlying error.
        source: reqwest::Error,
    },
    /// 401: the hub wants a token, or the token given was rejected.
    #[error("{url}: authentication failed (401): {}{}", hint_token(*.token_sent), detail(.message))]
    Unauthorized {
        /// The URL that answered.
        url: String,
        /// Whether a bearer token was sent.
        token_sent: bool,
        /// The hub's `X-Error-Message`, when it sent one.
        message: Option<String>,
    },
    /// 403: the repository is gated or the token lacks access to it.
    #[error("{url}: access denied (403): the repository is gated or your token lacks access; accept its terms on the hub and use a token with read access{}", detail(.message))]
    Forbidden {
        /// The URL that answered.
        url: String,
        /// The hub's `X-Error-Message`, when it sent one.
        message: Option<String>,
    },
    /// 404: repository, revision or file not found.
    #[error("{url}: not found (404): {what}{}", detail(.message))]
    NotFound {
        /// The URL that answered.
        url: String,
        /// What was missing, from the hub's `X-Error-Code` when present.
        what: String,
        /// The hub's `X-Error-Message`, when it sent one.
        message: Option<String>,
    },
    /// 429 on every attempt.
    #[error("{url}: rate limited (429){}", retry_hint(.retry_after))]
    RateLimited {
        /// The URL that answered.
        url: String,
        /// The wait the hub asked for (`Retry-After`, seconds).
        retry_after: Option<Duration>,
    },
    /// Any other unexpected HTTP status (5xx is transient).
    #[error("{url}: HTTP {status}{}", detail(.message))]
    Status {
        /// The URL that answered.
        url: String,
        /// The status code.
        status: u16,
        /// The hub's `X-Error-Message`, when it sent one.
        message: Option<String>,
    },
    /// The request could not be sent or its answer not received (connect, TLS, timeout).
    #[error("{url}: request failed: {source}")]
    Request {
        /// The URL being requested.
        url: String,
        /// The underlying error.
        source: reqwest::Error,
    },
    /// The body broke off: connection dropped, or no data within the read timeout.
    #[error("{url}: transfer of {file} broke off after {received} of {expected} bytes: {}", io_cause(.source))]
    Transfer {
        /// The URL being read.
        url: String,
        /// The repository file.
        file: String,
        /// Bytes of this response received before the failure.
        received: u64,
        /// Bytes this response should have carried.
        expected: u64,
        /// The read error.
        source: io::Error,
    },
    /// The hub's answer does not follow the protocol (bad `Content-Range`, wrong length, …).
    #[error("{url}: unexpected answer: {reason}")]
    Protocol {
        /// The URL that answered.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// A JSON answer that does not parse into what the API promises.
    #[error("{url}: malformed JSON answer: {reason}")]
    Json {
        /// The URL that answered.
        url: String,
        /// The parse error or missing field.
        reason: String,
    },
    /// A file path from the hub that could escape the install directory.
    #[error("refusing unsafe file path from the hub: {path:?}")]
    UnsafePath {
        /// The path as the hub sent it.
        path: String,
    },
    /// A finished file whose length differs from the hub's size.
    #[error("{file}: size mismatch: expected {expected} bytes, got {got}")]
    SizeMismatch {
        /// The repository file.
        file: String,
        /// Size from the tree API.
        expected: u64,
        /// Size on disk.
        got: u64,
    },
    /// A finished file whose hash differs from the hub's; the partial file was deleted.
    #[error("{file}: {algo} mismatch: expected {expected}, got {got} (partial download deleted)")]
    HashMismatch {
        /// The repository file.
        file: String,
        /// `SHA-256` for LFS files, `git SHA-1` for the others.
        algo: &'static str,
        /// Hash from the hub.
        expected: String,
        /// Hash of the bytes received.
        got: String,
    },
    /// A safetensors shard header that cannot be trusted.
    #[error("{file}: invalid safetensors header: {reason}")]
    BadHeader {
        /// The repository file.
        file: String,
        /// What was wrong.
        reason: String,
    },
    /// A local I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The local path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The target volume filled up while writing.
    #[error("{}: disk full while writing {file}; nothing was published under the final name (the partial file is kept for resume — free space and run the pull again)", path.display())]
    DiskFull {
        /// The partial file being written.
        path: PathBuf,
        /// The repository file.
        file: String,
    },
    /// Another process holds the lock on this partial file.
    #[error("{}: another sluice pull is writing {file} (lock held: {source})", path.display())]
    Busy {
        /// The partial file.
        path: PathBuf,
        /// The repository file.
        file: String,
        /// The lock error.
        source: io::Error,
    },
    /// The capacity plan does not fit the target volume.
    #[error("not enough free space on {} for a {mode} install: need {} (incl. headroom), {} free — short by {}", volume.display(), bytes(*.required), bytes(*.free), bytes(*.shortfall))]
    InsufficientSpace {
        /// The target directory (or its nearest existing ancestor).
        volume: PathBuf,
        /// `full` or `stream`.
        mode: String,
        /// Bytes to download plus headroom.
        required: u64,
        /// Free bytes on the volume.
        free: u64,
        /// `required - free`.
        shortfall: u64,
    },
    /// The install manifest could not be read or written.
    #[error("{}: install manifest: {reason}", path.display())]
    Manifest {
        /// The manifest path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The pull was stopped because another file hit a fatal error.
    #[error("{file}: cancelled after a fatal error in another file")]
    Cancelled {
        /// The repository file.
        file: String,
    },
    /// Some files failed; every failure is listed.
    #[error("{} file(s) failed:{}", failures.len(), list(.failures))]
    Incomplete {
        /// The failed files and their errors.
        failures: Vec<FileFailure>,
    },
}

/// One failed file of a pull.
#[derive(Debug)]
pub struct FileFailure {
    /// The repository file.
    pub file: String,
    /// Why it failed.
    pub error: HubError,
}

impl HubError {
    /// Whether trying again can help: connection and stall errors, truncated bodies, 5xx,
    /// 429 and hash mismatches (the bytes are fetched afresh).
    pub fn is_transient(&self) -> bool {
        match self {
            // A malformed request or a redirect loop will fail the same way again.
            Self::Request { source, .. } => !(source.is_builder() || source.is_redirect()),
            Self::Transfer { .. } | Self::RateLimited { .. } => true,
            Self::HashMismatch { .. } => true,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// Whether this error should stop every other file of the pull too (a full disk or a
    /// rejected token will fail them all).
    pub fn is_fatal_for_all(&self) -> bool {
        matches!(self, Self::DiskFull { .. } | Self::Unauthorized { .. } | Self::Forbidden { .. })
    }

    /// The wait the hub asked for, if this is a 429 with `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// An [`HubError::Io`] for `path`, or [`HubError::DiskFull`] when the error is ENOSPC.
    pub(crate) fn write(path: impl Into<PathBuf>, file: &str, source: io::Error) -> Self {
        if is_disk_full(&source) {
            Self::DiskFull { path: path.into(), file: file.to_owned() }
        } else {
            Self::Io { path: path.into(), source }
        }
    }

    /// An [`HubError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}

/// Whether an I/O error means the volume is full (ENOSPC or EDQUOT).
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(28 | 122))
}

fn hint_token(sent: bool) -> &'static str {
    if sent {
        "the token in HF_TOKEN was rejected; check that it is valid"
    } else {
        "this repository needs a token; set HF_TOKEN"
    }
}

fn detail(message: &Option<String>) -> String {
    message.as_ref().map(|m| format!(" (hub says: {m})")).unwrap_or_default()
}

fn retry_hint(after: &Option<Duration>) -> String {
    after.map(|d| format!("; the hub asked to wait {}s", d.as_secs())).unwrap_or_default()
}

fn io_cause(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::TimedOut || e.to_string().contains("timed out") {
        format!("stalled: no data within the read timeout ({e})")
    } else {
        e.to_string()
    }
}

fn list(failures: &[FileFailure]) -> String {
    failures.iter().fold(String::new(), |mut s, f| {
        s.push_str(&format!("\n  {}: {}", f.file, f.error));
        s
    })
}

/// Formats a byte count with binary units (`1.50 GiB`), for plans, reports and errors.
pub fn bytes(n: u64) -> impl fmt::Display {
    ByteCount(n)
}

struct ByteCount(u64);

impl fmt::Display for ByteCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut unit = 0;
        let mut whole = self.0;
        while whole >= 1024 && unit + 1 < UNITS.len() {
            whole /= 1024;
            unit += 1;
        }
        if unit == 0 {
            return write!(f, "{} B", self.0);
        }
        // Exact integer arithmetic for the two decimals avoids float casts of u64.
        let div = 1u128 << (10 * unit);
        let hundredths = u128::from(self.0) * 100 / div;
        write!(f, "{}.{:02} {}", hundredths / 100, hundredths % 100, UNITS[unit])
    }
}
