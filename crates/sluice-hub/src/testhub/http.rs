//! Just enough HTTP/1.1 for the test hub: request parsing, responses, ranged bodies.
//!
//! Written by hand over `std::net` so each fault can be placed exactly: a body that stops
//! after K bytes, a stall in the middle, a byte flipped on the wire.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A parsed request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// Decoded path segments (without the leading empty one).
    pub segments: Vec<String>,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// Headers with lowercase names.
    pub headers: Vec<(String, String)>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.as_deref()?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then(|| percent_decode(v))
        })
    }
}

/// Reads one request; `Ok(None)` at a clean end of the connection.
pub(crate) fn read_request(r: &mut BufReader<TcpStream>) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad request line"));
    };
    let method = method.to_owned();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (target, None),
    };
    let segments = path.split('/').skip(1).map(percent_decode).collect();
    let mut headers = Vec::new();
    let mut body_len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            let n = n.trim().to_ascii_lowercase();
            if n == "content-length" {
                body_len = v.trim().parse().unwrap_or(0);
            }
            headers.push((n, v.trim().to_owned()));
        }
    }
    io::copy(&mut r.by_ref().take(u64::try_from(body_len).unwrap_or(0)), &mut io::sink())?;
    Ok(Some(Request { method, segments, query, headers }))
}

/// Decodes `%XX` escapes (and leaves malformed ones as they are).
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hexval = |c: u8| char::from(c).to_digit(16);
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `Range: bytes=a-b` / `bytes=a-` against a body of `len` bytes into `start..end`.
/// `Some(Err(()))` means unsatisfiable.
pub(crate) fn parse_range(v: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = v.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => len,
        e => e.parse::<u64>().ok()?.saturating_add(1).min(len),
    };
    Some(if start < end { Ok((start, end)) } else { Err(()) })
}

/// Writes a status line and headers (plus `Content-Length`).
pub(crate) fn write_head(
    w: &mut impl Write,
    status: u16,
    reason: &str,
    headers: &[(&str, String)],
    content_length: u64,
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {content_length}\r\n\r\n"));
    w.write_all(head.as_bytes())
}

/// Writes a complete small response.
pub(crate) fn respond(
    w: &mut impl Write,
    status: u16,
    reason: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> io::Result<()> {
    write_head(w, status, reason, headers, u64::try_from(body.len()).unwrap_or(0))?;
    w.write_all(body)?;
    w.flush()
}

/// How a body should misbehave.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BodyFaults {
    /// Close the connection after this many body bytes.
    pub drop_after: Option<u64>,
    /// Stop sending for `.1` after `.0` body bytes, then close.
    pub stall: Option<(u64, Duration)>,
    /// Send at most this many bytes per second.
    pub throttle: Option<u64>,
}

/// Writes `body` honouring `faults`, adding each chunk to `counter` before sending it (so a
/// client never holds bytes the counter has not seen); returns whether the connection may be
/// kept open.
pub(crate) fn write_body(
    stream: &mut TcpStream,
    body: &[u8],
    faults: BodyFaults,
    counter: &AtomicU64,
) -> io::Result<bool> {
    const CHUNK: usize = 256 * 1024;
    let started = Instant::now();
    let mut sent = 0u64;
    let limit = |cut: Option<u64>| cut.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
    let cut = match (limit(faults.drop_after), limit(faults.stall.map(|s| s.0))) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let end = cut.map_or(body.len(), |c| c.min(body.len()));
    let chunk = if faults.throttle.is_some() { 16 * 1024 } else { CHUNK };
    for piece in body[..end].chunks(chunk) {
        let n = u64::try_from(piece.len()).unwrap_or(0);
        counter.fetch_add(n, Ordering::SeqCst);
        stream.write_all(piece)?;
        sent += n;
        if let Some(rate) = faults.throttle.filter(|r| *r > 0) {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    stream.flush()?;
    if end < body.len() {
        if let Some((_, d)) = faults.stall {
            std::thread::sleep(d);
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(parse_range("bytes=90-", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=90-200", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(parse_range("items=1-2", 100), None);
    }

    #[test]
    fn decode() {
        assert_eq!(percent_decode("refs%2Fpr%2F1"), "refs/pr/1");
        assert_eq!(percent_decode("a%20b%"), "a b%");
    }
}
