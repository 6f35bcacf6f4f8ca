//! The HTTP side: one configured client for a Hugging Face–compatible hub.
//!
//! [`HubConfig`] gathers everything a user can set — endpoint (`HF_ENDPOINT`), bearer token
//! (`HF_TOKEN`), user agent, connect and read timeouts, retry policy — and [`HubClient`]
//! turns it into a blocking `reqwest` client plus the few request shapes the crate needs.
//!
//! Two details matter for correctness. The read timeout is per read, not per request, so a
//! multi-gigabyte body may take hours while a stalled one fails after seconds. Redirects
//! are followed (the hub answers `resolve` for LFS files with a 302 to a CDN) and `reqwest`
//! drops the `Authorization` header whenever a redirect leaves the endpoint's scheme, host or
//! port, so the token is only ever sent to the hub itself.

use std::sync::Arc;
use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{HeaderMap, AUTHORIZATION, RANGE, RETRY_AFTER};
use reqwest::{StatusCode, Url};

use crate::error::{HubError, Result};

/// The public hub, used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How often and how patiently transient failures are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts per request (or per file) before giving up; at least 1.
    pub max_attempts: u32,
    /// Wait before the first retry; doubles on each further retry.
    pub base_delay: Duration,
    /// Upper bound on one exponential-backoff wait.
    pub max_delay: Duration,
    /// Upper bound on a wait requested by `Retry-After`.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based) after `error`: the hub's
    /// `Retry-After` when it sent one, else exponential backoff with a little jitter.
    pub fn delay(&self, retry: u32, error: &HubError) -> Duration {
        if let Some(after) = error.retry_after() {
            return after.min(self.max_retry_after);
        }
        let exp = self.base_delay.saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        let capped = exp.min(self.max_delay);
        // Up to 1/8 jitter, from the clock, so parallel workers do not retry in lockstep.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        capped + (capped / 8).mul_f64(f64::from(nanos % 1000) / 1000.0)
    }
}

/// Everything that configures a [`HubClient`].
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL of the hub, without a trailing slash.
    pub endpoint: String,
    /// Bearer token sent to the endpoint's host (never to redirect targets elsewhere).
    pub token: Option<String>,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Limit on waiting for response headers and on each read of a body: a stall detector.
    pub read_timeout: Duration,
    /// Retry policy for transient failures.
    pub retry: RetryPolicy,
}

impl HubConfig {
    /// Defaults for `endpoint`, with no token.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into().trim_end_matches('/').to_owned(),
            token: None,
            user_agent: format!("sluice/{}", env!("CARGO_PKG_VERSION")),
            connect_timeout: Duration::from_secs(20),
            read_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
        }
    }

    /// Reads `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]) and `HF_TOKEN` (ignored if empty).
    pub fn from_env() -> Self {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let mut cfg = Self::new(endpoint);
        cfg.token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty());
        cfg
    }
}

/// A configured client for one hub. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct HubClient {
    cfg: Arc<HubConfig>,
    base: Url,
    http: Client,
}

/// A byte range for a `Range` request: `start..end` (exclusive), or `start..` when `end` is
/// `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub start: u64,
    pub end: Option<u64>,
}

impl HubClient {
    /// Builds a client for `cfg`.
    pub fn new(cfg: HubConfig) -> Result<Self> {
        let base = Url::parse(&cfg.endpoint).map_err(|e| HubError::InvalidEndpoint {
            endpoint: cfg.endpoint.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(HubError::InvalidEndpoint {
                endpoint: cfg.endpoint.clone(),
                reason: "expected an http:// or https:// URL with a host".into(),
            });
        }
        let http = build_http(&cfg, &base)?;
        Ok(Self { cfg: Arc::new(cfg), base, http })
    }

    /// A client configured from `HF_ENDPOINT` and `HF_TOKEN`.
    pub fn from_env() -> Result<Self> {
        Self::new(HubConfig::from_env())
    }

    /// The configuration in use.
    pub fn config(&self) -> &HubConfig {
        &self.cfg
    }

    /// The endpoint, without a trailing slash.
    pub fn endpoint(&self) -> &str {
        &self.cfg.endpoint
    }

    /// A client with the same configuration and its own connection pool and I/O thread, so
    /// parallel download workers do not share one runtime thread for TLS and socket reads.
    pub(crate) fn fork(&self) -> Self {
        match build_http(&self.cfg, &self.base) {
            Ok(http) => Self { cfg: Arc::clone(&self.cfg), base: self.base.clone(), http },
            Err(_) => self.clone(),
        }
    }

    /// `{endpoint}/{segments…}` with each segment percent-encoded (so a revision such as
    /// `refs/pr/1` stays one segment), plus an optional query.
    pub(crate) fn url(&self, segments: &[&str], query: Option<&str>) -> Result<Url> {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| HubError::InvalidEndpoint {
                endpoint: self.cfg.endpoint.clone(),
                reason: "cannot be a base URL".into(),
            })?;
            path.pop_if_empty();
            path.extend(segments);
        }
        url.set_query(query);
        Ok(url)
    }

    /// The `resolve` URL of a file at a commit; each `/`-separated part of `path` is encoded.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> Result<Url> {
        let mut segments: Vec<&str> = repo.split('/').collect();
        segments.extend(["resolve", commit]);
        segments.extend(path.split('/'));
        self.url(&segments, None)
    }

    /// Sends a GET for `url` (with `range` if given) and maps error statuses to
    /// [`HubError`]s. The answer is 200 or 206 (or another 2xx) on success.
    pub(crate) fn get(&self, url: &Url, range: Option<ByteRange>) -> Result<Response> {
        let mut req = self.http.get(url.clone());
        if let Some(r) = range {
            req = req.header(RANGE, range_header(r));
        }
        self.send(url, req)
    }

    fn send(&self, url: &Url, mut req: RequestBuilder) -> Result<Response> {
        if let Some(token) = &self.cfg.token {
            if same_origin(url, &self.base) {
                req = req.header(AUTHORIZATION, format!("Bearer {token}"));
            }
        }
        let resp = req.send().map_err(|e| HubError::Request { url: url.to_string(), source: e })?;
        check_status(resp, self.cfg.token.is_some())
    }

    /// Runs `op` until it succeeds, fails with a non-transient error, or the retry policy
    /// is spent. `op` receives the 1-based attempt number. `on_retry` is told about each
    /// retry (for progress messages).
    pub(crate) fn with_retries<T>(
        &self,
        mut op: impl FnMut(u32) -> Result<T>,
        mut on_retry: impl FnMut(&HubError, Duration),
    ) -> Result<T> {
        let policy = &self.cfg.retry;
        let mut attempt = 1;
        loop {
            match op(attempt) {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && attempt < policy.max_attempts.max(1) => {
                    let wait = policy.delay(attempt, &e);
                    on_retry(&e, wait);
                    std::thread::sleep(wait);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn build_http(cfg: &HubConfig, base: &Url) -> Result<Client> {
    let mut builder = Client::builder()
        .user_agent(cfg.user_agent.clone())
        .connect_timeout(cfg.connect_timeout)
        .timeout(cfg.read_timeout)
        .redirect(reqwest::redirect::Policy::limited(10));
    // A hub on the loopback interface is a local test or mirror: never route it via a proxy.
    if base.host_str().is_some_and(|h| h == "127.0.0.1" || h == "localhost" || h == "[::1]") {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|e| HubError::Client { source: e })
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

fn range_header(r: ByteRange) -> String {
    match r.end {
        Some(end) => format!("bytes={}-{}", r.start, end.saturating_sub(1)),
        None => format!("bytes={}-", r.start),
    }
}

/// Maps a non-success status to the matching [`HubError`], reading the hub's
/// `X-Error-Code` / `X-Error-Message` headers when present.
fn check_status(resp: Response, token_sent: bool) -> Result<Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let url = resp.url().to_string();
    let headers = resp.headers().clone();
    let message = header_str(&headers, "x-error-message");
    let code = header_str(&headers, "x-error-code");
    let not_found = |what: &str, message| HubError::NotFound {
        url: url.clone(),
        what: what.to_owned(),
        message,
    };
    Err(match status {
        // huggingface.co answers 401 for a repository that does not exist (or is private)
        // when no token is sent, and marks a gated one; the error code tells them apart.
        StatusCode::UNAUTHORIZED if code.as_deref() == Some("RepoNotFound") => {
            not_found("repository not found (or private: set HF_TOKEN)", message)
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
            if code.as_deref() == Some("GatedRepo") =>
        {
            HubError::Forbidden { url, message }
        }
        StatusCode::UNAUTHORIZED => HubError::Unauthorized { url, token_sent, message },
        // The hub answers 401 for a gated repository without a token, 403 once a token
        // without access is sent; `GatedRepo` says which.
        StatusCode::FORBIDDEN => HubError::Forbidden { url, message },
        StatusCode::NOT_FOUND => not_found(
            match code.as_deref() {
                Some("RepoNotFound") => "repository not found (or private: set HF_TOKEN)",
                Some("RevisionNotFound") => "revision not found",
                Some("EntryNotFound") => "file not found at this revision",
                _ => "repository, revision or file not found",
            },
            message,
        ),
        StatusCode::TOO_MANY_REQUESTS => HubError::RateLimited {
            url,
            retry_after: header_str(&headers, RETRY_AFTER.as_str())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        other => HubError::Status { url, status: other.as_u16(), message },
    })
}

pub(crate) fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Parses `Content-Range: bytes START-END/TOTAL` into `(start, end_exclusive, total)`;
/// `TOTAL` may be `*` (then `None`).
pub(crate) fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let last: u64 = b.trim().parse().ok()?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    (last >= start).then_some((start, last + 1, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parses() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 10, Some(100))));
        assert_eq!(parse_content_range("bytes 5-5/*"), Some((5, 6, None)));
        assert_eq!(parse_content_range("bytes 9-5/100"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
    }

    #[test]
    fn urls_encode_revision_and_paths() {
        let c = HubClient::new(HubConfig::new("http://127.0.0.1:9/")).expect("client");
        let u = c.url(&["api", "models", "a", "b", "revision", "refs/pr/1"], None).expect("url");
        assert_eq!(u.as_str(), "http://127.0.0.1:9/api/models/a/b/revision/refs%2Fpr%2F1");
        let u = c.resolve_url("a/b", "abc", "dir/x y.json").expect("url");
        assert_eq!(u.as_str(), "http://127.0.0.1:9/a/b/resolve/abc/dir/x%20y.json");
    }

    #[test]
    fn backoff_grows_and_honours_retry_after() {
        let p = RetryPolicy { base_delay: Duration::from_millis(100), ..RetryPolicy::default() };
        let e = HubError::Status { url: "u".into(), status: 500, message: None };
        assert!(p.delay(1, &e) < Duration::from_millis(120));
        assert!(p.delay(3, &e) >= Duration::from_millis(400));
        let e =
            HubError::RateLimited { url: "u".into(), retry_after: Some(Duration::from_secs(1)) };
        assert_eq!(p.delay(1, &e), Duration::from_secs(1));
    }
}
