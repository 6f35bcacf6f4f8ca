//! Byte ranges of remote files, fetched on demand: the remote source of stream mode.
//!
//! [`RangeFetcher`] is what the expert store will call when a routed expert is not on local
//! disk: `fetch_range(path, offset, len)` returns exactly those bytes of the file at the
//! pinned commit, or an error naming the file and cause. It retries connection failures,
//! stalls, truncated bodies and 5xx with exponential backoff, waits as long as a 429's
//! `Retry-After` asks, and checks the answer's status, `Content-Range` and length, so a short
//! or misplaced body is never returned as data.
//!
//! The hub answers `resolve` for LFS files with a redirect to a signed CDN URL. The fetcher
//! remembers the final URL of each file for a few minutes and sends later ranges straight
//! there (without the token, which only ever goes to the hub's own origin), halving the
//! round trips per expert; any failure on a remembered URL forgets it and goes back through
//! `resolve`.
//!
//! The API is blocking. Call it from ordinary threads (the store's reader pool), not from
//! inside an async runtime.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE};
use reqwest::{StatusCode, Url};

use crate::client::{header_str, parse_content_range, ByteRange, HubClient};
use crate::error::{HubError, Result};
use crate::repo::{is_hex, validate_path, validate_repo};

/// How long a redirect target is reused; signed hub CDN URLs stay valid for longer.
const CDN_URL_TTL: Duration = Duration::from_secs(300);

/// Fetches byte ranges of files of one repository at one commit.
#[derive(Debug)]
pub struct RangeFetcher {
    client: HubClient,
    repo: String,
    commit: String,
    redirects: Mutex<HashMap<String, (Url, Instant)>>,
}

impl RangeFetcher {
    /// A fetcher for `repo` at `commit` (40 hex digits, as pinned in an install manifest).
    pub fn new(client: HubClient, repo: &str, commit: &str) -> Result<Self> {
        validate_repo(repo)?;
        if !is_hex(commit, 40) {
            return Err(HubError::InvalidRevision { revision: commit.to_owned() });
        }
        Ok(Self {
            client,
            repo: repo.to_owned(),
            commit: commit.to_ascii_lowercase(),
            redirects: Mutex::new(HashMap::new()),
        })
    }

    /// The pinned commit.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Returns bytes `offset .. offset + len` of `path`, retrying transient failures.
    pub fn fetch_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let n = usize::try_from(len).map_err(|_| HubError::Protocol {
            url: path.to_owned(),
            reason: format!("range of {len} bytes does not fit in memory"),
        })?;
        let mut buf = vec![0u8; n];
        self.fetch_range_into(path, offset, &mut buf)?;
        Ok(buf)
    }

    /// Fills `buf` with bytes `offset .. offset + buf.len()` of `path` (for callers that own
    /// the destination, such as a cache slot), retrying transient failures.
    pub fn fetch_range_into(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<()> {
        validate_path(path)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.client.with_retries(|_| self.attempt(path, offset, buf), |_, _| {})
    }

    fn attempt(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(cdn) = self.remembered(path) {
            match fetch_into(&self.client, &cdn, path, offset, buf) {
                Ok(_) => return Ok(()),
                // A transient failure goes through the retry loop (which honours
                // `Retry-After`); the next attempt starts again from `resolve`.
                Err(e) if e.is_transient() => {
                    self.forget(path);
                    return Err(e);
                }
                // An expired signature: go back through `resolve` at once.
                Err(_) => self.forget(path),
            }
        }
        let url = self.client.resolve_url(&self.repo, &self.commit, path)?;
        let final_url = fetch_into(&self.client, &url, path, offset, buf)?;
        if final_url != url {
            if let Ok(mut map) = self.redirects.lock() {
                map.insert(path.to_owned(), (final_url, Instant::now()));
            }
        }
        Ok(())
    }

    fn remembered(&self, path: &str) -> Option<Url> {
        let map = self.redirects.lock().ok()?;
        let (url, at) = map.get(path)?;
        (at.elapsed() < CDN_URL_TTL).then(|| url.clone())
    }

    fn forget(&self, path: &str) {
        if let Ok(mut map) = self.redirects.lock() {
            map.remove(path);
        }
    }
}

/// One ranged GET of `url` into `buf`; returns the final URL after redirects.
pub(crate) fn fetch_into(
    client: &HubClient,
    url: &Url,
    file: &str,
    offset: u64,
    buf: &mut [u8],
) -> Result<Url> {
    let len = u64::try_from(buf.len()).map_err(|_| HubError::Protocol {
        url: url.to_string(),
        reason: "buffer length does not fit in u64".into(),
    })?;
    let end = offset.checked_add(len).ok_or_else(|| HubError::Protocol {
        url: url.to_string(),
        reason: format!("range {offset}+{len} overflows"),
    })?;
    let mut resp = client.get(url, Some(ByteRange { start: offset, end: Some(end) }))?;
    let final_url = resp.url().clone();
    let here = final_url.to_string();
    match resp.status() {
        StatusCode::PARTIAL_CONTENT => {
            let cr = header_str(resp.headers(), CONTENT_RANGE.as_str()).unwrap_or_default();
            match parse_content_range(&cr) {
                Some((s, e, _)) if s == offset && e == end => {}
                _ => {
                    return Err(HubError::Protocol {
                        url: here,
                        reason: format!(
                            "{file}: asked for bytes {offset}..{end}, got Content-Range {cr:?}"
                        ),
                    })
                }
            }
        }
        // A server that ignores Range sends the whole file from byte 0: usable only when
        // the range starts there.
        StatusCode::OK if offset == 0 => {}
        status => {
            return Err(HubError::Protocol {
                url: here,
                reason: format!("{file}: range request answered {status} instead of 206"),
            })
        }
    }
    if resp.status() == StatusCode::PARTIAL_CONTENT {
        if let Some(cl) = header_str(resp.headers(), CONTENT_LENGTH.as_str()) {
            if cl.trim().parse::<u64>().ok() != Some(len) {
                return Err(HubError::Protocol {
                    url: here,
                    reason: format!("{file}: Content-Length {cl} for a {len}-byte range"),
                });
            }
        }
    }
    let mut filled = 0usize;
    while filled < buf.len() {
        match resp.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(HubError::Transfer {
                    url: here,
                    file: file.to_owned(),
                    received: u64::try_from(filled).unwrap_or(u64::MAX),
                    expected: len,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                })
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(HubError::Transfer {
                    url: here,
                    file: file.to_owned(),
                    received: u64::try_from(filled).unwrap_or(u64::MAX),
                    expected: len,
                    source: e,
                })
            }
        }
    }
    if resp.status() == StatusCode::PARTIAL_CONTENT {
        let mut probe = [0u8; 1];
        if matches!(resp.read(&mut probe), Ok(n) if n > 0) {
            return Err(HubError::Protocol {
                url: here,
                reason: format!("{file}: more than the {len} bytes asked for"),
            });
        }
    }
    Ok(final_url)
}
