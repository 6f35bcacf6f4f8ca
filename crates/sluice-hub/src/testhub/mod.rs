//! A small Hugging Face–compatible hub on 127.0.0.1, for tests, examples and benches.
//!
//! It answers the routes `sluice pull` uses the way huggingface.co does: the model API
//! (`/api/models/{repo}/revision/{rev}`), the paginated recursive tree API with `Link`
//! headers, and `/{repo}/resolve/{rev}/{path}` — serving small (non-LFS) files directly and
//! answering LFS files with a 302 to a separate "CDN" listener on another port, which serves
//! the bytes with `Range` support and records whether an `Authorization` header reached it.
//! A bearer token and a gated flag can be required.
//!
//! [`Faults`] switch misbehaviour on for the next requests that serve file bytes: 500s, 429
//! with `Retry-After: 1`, a connection dropped after K bytes, a stall past the client's read
//! timeout, a flipped byte, a server that ignores `Range`, and a bandwidth throttle.
//! [`Stats`] count requests and bytes so tests can assert, for example, that a reused cache
//! caused zero downloads. [`install`] pulls a repository from it as `sluice pull` does, and
//! [`k3_tiny_hub`] serves the committed tiny Kimi K3 fixture. Enabled by the `test-hub`
//! feature; never part of a release build.

mod http;
mod install;

pub use install::{install, k3_tiny_fixture, k3_tiny_hub, quick_retries, K3_TINY_REPO};

use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::download::hex;
use http::{parse_range, read_request, respond, write_body, write_head, BodyFaults, Request};

/// One file served by the hub; its hashes are computed once, when it is made.
#[derive(Debug, Clone)]
pub struct HubFile {
    /// Repository path.
    pub path: String,
    /// Content.
    pub data: Arc<Vec<u8>>,
    /// Whether the file is stored in LFS (served through the CDN redirect).
    pub lfs: bool,
    sha256: String,
    git_oid: String,
}

impl HubFile {
    /// A file; `lfs` decides whether it gets a SHA-256 and a CDN redirect.
    pub fn new(path: &str, data: Vec<u8>, lfs: bool) -> Self {
        let sha256 = hex(&Sha256::digest(&data));
        let blob = if lfs {
            format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {}\n",
                data.len()
            )
            .into_bytes()
        } else {
            data.clone()
        };
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", blob.len()).as_bytes());
        h.update(&blob);
        let git_oid = hex(&h.finalize());
        Self { path: path.to_owned(), data: Arc::new(data), lfs, sha256, git_oid }
    }

    /// SHA-256 of the content, hex.
    pub fn sha256(&self) -> String {
        self.sha256.clone()
    }

    /// The git blob id: of the content, or of the LFS pointer file for LFS files.
    pub fn git_oid(&self) -> String {
        self.git_oid.clone()
    }
}

/// One repository at one commit.
#[derive(Debug, Clone)]
pub struct HubRepo {
    /// `ORG/NAME`.
    pub id: String,
    /// The commit every revision name resolves to.
    pub commit: String,
    /// Branch or tag names that resolve to `commit` (e.g. `main`).
    pub revisions: Vec<String>,
    /// The files.
    pub files: Vec<HubFile>,
}

impl HubRepo {
    /// A repository whose commit is derived from its content; `main` resolves to it.
    pub fn new(id: &str, files: Vec<HubFile>) -> Self {
        let mut h = Sha1::new();
        for f in &files {
            h.update(f.path.as_bytes());
            h.update(f.git_oid().as_bytes());
        }
        Self {
            id: id.to_owned(),
            commit: hex(&h.finalize()),
            revisions: vec!["main".into()],
            files,
        }
    }

    /// A repository with every regular file of `dir`; `*.safetensors` and `*.model` go to
    /// LFS, as in the `.gitattributes` the hub creates.
    pub fn from_dir(id: &str, dir: &Path) -> io::Result<Self> {
        let mut files = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(dir)?.flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            if e.file_type()?.is_file() {
                let name = e.file_name().to_string_lossy().into_owned();
                let lfs = name.ends_with(".safetensors") || name.ends_with(".model");
                files.push(HubFile::new(&name, std::fs::read(e.path())?, lfs));
            }
        }
        Ok(Self::new(id, files))
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&HubFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// Misbehaviour for the next requests that serve file bytes. Counters count down per use.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Answer 500 to this many requests.
    pub status_500: u32,
    /// Answer 429 with `Retry-After: 1` to this many requests.
    pub status_429: u32,
    /// Close the connection after `drop_after` body bytes, this many times.
    pub drops: u32,
    /// Body bytes sent before a drop or stall.
    pub drop_after: u64,
    /// Stall (then close) after `drop_after` bytes, this many times.
    pub stalls: u32,
    /// How long a stall lasts.
    pub stall_for: Duration,
    /// Flip one byte in this many bodies.
    pub corrupt: u32,
    /// Answer 200 with the whole file to this many `Range` requests.
    pub ignore_range: u32,
    /// Answer this many `Range` requests with a body one byte short of the range, with a
    /// matching `Content-Length` (a wrong-length answer, not a dropped connection).
    pub short_ranges: u32,
    /// Serve at most this many bytes per second (stays on).
    pub throttle: Option<u64>,
    /// Apply faults only to this file (all files when `None`).
    pub only_path: Option<String>,
}

/// Counters of what the hub served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Model and tree API requests.
    pub api_requests: u64,
    /// Requests that served (or were to serve) file bytes.
    pub content_requests: u64,
    /// Of those, requests with a `Range` header.
    pub range_requests: u64,
    /// Range requests starting past byte 0 (resumes and spine ranges).
    pub ranges_past_zero: u64,
    /// File bytes sent.
    pub content_bytes: u64,
    /// Requests that reached the CDN with an `Authorization` header (must stay 0).
    pub cdn_auth_headers: u64,
    /// Resolve requests that carried the expected bearer token.
    pub authorized_requests: u64,
}

#[derive(Default)]
struct Counters {
    api: AtomicU64,
    content: AtomicU64,
    range: AtomicU64,
    past_zero: AtomicU64,
    bytes: AtomicU64,
    cdn_auth: AtomicU64,
    authorized: AtomicU64,
}

struct State {
    repos: Vec<HubRepo>,
    token: Mutex<Option<String>>,
    gated: AtomicBool,
    faults: Mutex<Faults>,
    page_size: AtomicU64,
    counters: Counters,
    endpoint: String,
    cdn: String,
}

/// A running hub; stops accepting when dropped.
pub struct TestHub {
    state: Arc<State>,
    addrs: [SocketAddr; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl TestHub {
    /// Starts the hub and its CDN on ephemeral ports of 127.0.0.1.
    pub fn start(repos: Vec<HubRepo>) -> io::Result<Self> {
        let api = TcpListener::bind("127.0.0.1:0")?;
        let cdn = TcpListener::bind("127.0.0.1:0")?;
        let addrs = [api.local_addr()?, cdn.local_addr()?];
        let state = Arc::new(State {
            repos,
            token: Mutex::new(None),
            gated: AtomicBool::new(false),
            faults: Mutex::new(Faults::default()),
            page_size: AtomicU64::new(3),
            counters: Counters::default(),
            endpoint: format!("http://{}", addrs[0]),
            cdn: format!("http://{}", addrs[1]),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [(api, false), (cdn, true)]
            .into_iter()
            .map(|(listener, is_cdn)| {
                let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
                std::thread::spawn(move || accept_loop(&listener, &state, &stop, is_cdn))
            })
            .collect();
        Ok(Self { state, addrs, stop, threads })
    }

    /// The endpoint to put in `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        self.state.endpoint.clone()
    }

    /// Requires `Authorization: Bearer {token}` on API and resolve requests.
    pub fn require_token(&self, token: Option<&str>) {
        if let Ok(mut t) = self.state.token.lock() {
            *t = token.map(str::to_owned);
        }
    }

    /// Makes every repository gated: 403 with `X-Error-Code: GatedRepo`.
    pub fn set_gated(&self, gated: bool) {
        self.state.gated.store(gated, Ordering::SeqCst);
    }

    /// Entries per tree page (default 3, to exercise pagination).
    pub fn set_tree_page_size(&self, n: u64) {
        self.state.page_size.store(n.max(1), Ordering::SeqCst);
    }

    /// Replaces the active faults.
    pub fn set_faults(&self, faults: Faults) {
        if let Ok(mut f) = self.state.faults.lock() {
            *f = faults;
        }
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        let c = &self.state.counters;
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        Stats {
            api_requests: get(&c.api),
            content_requests: get(&c.content),
            range_requests: get(&c.range),
            ranges_past_zero: get(&c.past_zero),
            content_bytes: get(&c.bytes),
            cdn_auth_headers: get(&c.cdn_auth),
            authorized_requests: get(&c.authorized),
        }
    }

    /// Resets the counters to zero.
    pub fn reset_stats(&self) {
        let c = &self.state.counters;
        for a in [&c.api, &c.content, &c.range, &c.past_zero, &c.bytes, &c.cdn_auth, &c.authorized]
        {
            a.store(0, Ordering::SeqCst);
        }
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for a in self.addrs {
            let _ = TcpStream::connect(a);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>, stop: &AtomicBool, is_cdn: bool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let state = Arc::clone(state);
        std::thread::spawn(move || {
            let _ = serve_connection(conn, &state, is_cdn);
        });
    }
}

fn serve_connection(conn: TcpStream, state: &State, is_cdn: bool) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.set_nodelay(true)?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    while let Some(req) = read_request(&mut r)? {
        let keep =
            if is_cdn { route_cdn(&mut w, state, &req)? } else { route(&mut w, state, &req)? };
        if !keep {
            return Ok(());
        }
    }
    Ok(())
}

type Keep = io::Result<bool>;

fn error(w: &mut TcpStream, status: u16, reason: &str, code: Option<&str>, msg: &str) -> Keep {
    let mut headers = vec![("Content-Type", "application/json".to_owned())];
    if let Some(c) = code {
        headers.push(("X-Error-Code", c.to_owned()));
    }
    headers.push(("X-Error-Message", msg.to_owned()));
    let body = serde_json::json!({ "error": msg }).to_string();
    respond(w, status, reason, &headers, body.as_bytes())?;
    Ok(true)
}

fn route(w: &mut TcpStream, state: &State, req: &Request) -> Keep {
    let segs: Vec<&str> = req.segments.iter().map(String::as_str).collect();
    if let Some(expected) = state.token.lock().ok().and_then(|t| t.clone()) {
        match req.header("authorization") {
            Some(v) if v == format!("Bearer {expected}") => {
                state.counters.authorized.fetch_add(1, Ordering::SeqCst);
            }
            Some(_) => {
                return error(
                    w,
                    401,
                    "Unauthorized",
                    None,
                    "Invalid credentials in Authorization header",
                )
            }
            None => return error(w, 401, "Unauthorized", None, "Authentication required"),
        }
    }
    if state.gated.load(Ordering::SeqCst) {
        return error(w, 403, "Forbidden", Some("GatedRepo"), "Access to this model is restricted");
    }
    match segs.as_slice() {
        ["api", "models", org, name, "revision", rev] => {
            state.counters.api.fetch_add(1, Ordering::SeqCst);
            let Some(repo) = find_repo(state, org, name) else { return not_found_repo(w) };
            if !resolves(repo, rev) {
                return error(w, 404, "Not Found", Some("RevisionNotFound"), "Invalid rev id");
            }
            let siblings: Vec<_> =
                repo.files.iter().map(|f| serde_json::json!({ "rfilename": f.path })).collect();
            let body = serde_json::json!({
                "_id": "0", "id": repo.id, "modelId": repo.id, "sha": repo.commit,
                "private": false, "gated": false, "siblings": siblings,
            });
            respond(
                w,
                200,
                "OK",
                &[("Content-Type", "application/json".into())],
                body.to_string().as_bytes(),
            )?;
            Ok(true)
        }
        ["api", "models", org, name, "tree", rev] => {
            state.counters.api.fetch_add(1, Ordering::SeqCst);
            let Some(repo) = find_repo(state, org, name) else { return not_found_repo(w) };
            if !resolves(repo, rev) {
                return error(w, 404, "Not Found", Some("RevisionNotFound"), "Invalid rev id");
            }
            tree_page(w, state, repo, rev, req)
        }
        [org, name, "resolve", rev, path @ ..] if !path.is_empty() => {
            let Some(repo) = find_repo(state, org, name) else { return not_found_repo(w) };
            if !resolves(repo, rev) {
                return error(w, 404, "Not Found", Some("RevisionNotFound"), "Invalid rev id");
            }
            let Some(file) = repo.file(&path.join("/")) else {
                return error(w, 404, "Not Found", Some("EntryNotFound"), "Entry not found");
            };
            let commit = ("X-Repo-Commit", repo.commit.clone());
            if file.lfs {
                let location = format!("{}/cdn/{}?sig=test", state.cdn, file.sha256());
                let headers = [
                    ("Location", location),
                    ("X-Linked-Etag", format!("\"{}\"", file.sha256())),
                    ("X-Linked-Size", file.data.len().to_string()),
                    commit,
                ];
                respond(w, 302, "Found", &headers, b"")?;
                return Ok(true);
            }
            serve_bytes(w, state, req, file, &[("ETag", format!("\"{}\"", file.git_oid())), commit])
        }
        _ => error(w, 404, "Not Found", None, "no such route"),
    }
}

fn route_cdn(w: &mut TcpStream, state: &State, req: &Request) -> Keep {
    if req.header("authorization").is_some() {
        state.counters.cdn_auth.fetch_add(1, Ordering::SeqCst);
    }
    let segs: Vec<&str> = req.segments.iter().map(String::as_str).collect();
    let ["cdn", sha] = segs.as_slice() else {
        return error(w, 404, "Not Found", None, "no such object");
    };
    let file = state.repos.iter().flat_map(|r| &r.files).find(|f| f.lfs && f.sha256 == *sha);
    match file {
        Some(f) => serve_bytes(w, state, req, f, &[("ETag", format!("\"{sha}\""))]),
        None => error(w, 404, "Not Found", None, "no such object"),
    }
}

fn find_repo<'a>(state: &'a State, org: &str, name: &str) -> Option<&'a HubRepo> {
    state.repos.iter().find(|r| r.id == format!("{org}/{name}"))
}

fn resolves(repo: &HubRepo, rev: &str) -> bool {
    rev == repo.commit || repo.revisions.iter().any(|r| r == rev)
}

fn not_found_repo(w: &mut TcpStream) -> Keep {
    error(w, 404, "Not Found", Some("RepoNotFound"), "Repository not found")
}

fn tree_page(w: &mut TcpStream, state: &State, repo: &HubRepo, rev: &str, req: &Request) -> Keep {
    let mut entries = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for f in &repo.files {
        let mut parts: Vec<&str> = f.path.split('/').collect();
        parts.pop();
        for i in 1..=parts.len() {
            dirs.insert(parts[..i].join("/"));
        }
    }
    for d in dirs {
        entries.push(
            serde_json::json!({ "type": "directory", "oid": "0".repeat(40), "size": 0, "path": d }),
        );
    }
    for f in &repo.files {
        let mut e = serde_json::json!({
            "type": "file", "oid": f.git_oid(), "size": f.data.len(), "path": f.path,
        });
        if f.lfs {
            e["lfs"] =
                serde_json::json!({ "oid": f.sha256(), "size": f.data.len(), "pointerSize": 134 });
        }
        entries.push(e);
    }
    let page = usize::try_from(state.page_size.load(Ordering::SeqCst)).unwrap_or(3);
    let from: usize = req.query_param("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let to = (from + page).min(entries.len());
    let body =
        serde_json::Value::Array(entries.get(from..to).map(<[_]>::to_vec).unwrap_or_default());
    let mut headers = vec![("Content-Type", "application/json".to_owned())];
    if to < entries.len() {
        let next = format!(
            "{}/api/models/{}/tree/{rev}?recursive=true&cursor={to}",
            state.endpoint, repo.id
        );
        headers.push(("Link", format!("<{next}>; rel=\"next\"")));
    }
    respond(w, 200, "OK", &headers, body.to_string().as_bytes())?;
    Ok(true)
}

/// Serves `file`'s bytes (whole or ranged), applying and consuming the active faults.
fn serve_bytes(
    w: &mut TcpStream,
    state: &State,
    req: &Request,
    file: &HubFile,
    extra: &[(&str, String)],
) -> Keep {
    let c = &state.counters;
    c.content.fetch_add(1, Ordering::SeqCst);
    let len = u64::try_from(file.data.len()).unwrap_or(0);
    let range = req.header("range").and_then(|v| parse_range(v, len));
    if range.is_some() {
        c.range.fetch_add(1, Ordering::SeqCst);
    }
    if matches!(range, Some(Ok((s, _))) if s > 0) {
        c.past_zero.fetch_add(1, Ordering::SeqCst);
    }
    let mut f = state.faults.lock().map_err(|_| io::Error::other("faults lock poisoned"))?;
    let applies = f.only_path.as_ref().is_none_or(|p| *p == file.path);
    let take = |n: &mut u32| {
        applies && *n > 0 && {
            *n -= 1;
            true
        }
    };
    if take(&mut f.status_500) {
        drop(f);
        return error(w, 500, "Internal Server Error", None, "injected failure");
    }
    if take(&mut f.status_429) {
        drop(f);
        respond(w, 429, "Too Many Requests", &[("Retry-After", "1".into())], b"slow down")?;
        return Ok(true);
    }
    let ignore_range = range.is_some() && take(&mut f.ignore_range);
    let corrupt = take(&mut f.corrupt);
    let short = matches!(range, Some(Ok((s, e))) if e > s + 1) && take(&mut f.short_ranges);
    let faults = BodyFaults {
        drop_after: take(&mut f.drops).then_some(f.drop_after),
        stall: take(&mut f.stalls).then_some((f.drop_after, f.stall_for)),
        throttle: f.throttle,
    };
    drop(f);
    let mut headers = extra.to_vec();
    headers.push(("Accept-Ranges", "bytes".into()));
    let (status, reason, start, end) = match range {
        Some(Err(())) if !ignore_range => {
            headers.push(("Content-Range", format!("bytes */{len}")));
            respond(w, 416, "Range Not Satisfiable", &headers, b"")?;
            return Ok(true);
        }
        Some(Ok((s, e))) if !ignore_range => {
            headers.push(("Content-Range", format!("bytes {s}-{}/{len}", e - 1)));
            (206, "Partial Content", s, e)
        }
        _ => (200, "OK", 0, len),
    };
    let end = if short && !ignore_range { end - 1 } else { end };
    let (s, e) = (usize::try_from(start).unwrap_or(0), usize::try_from(end).unwrap_or(0));
    write_head(w, status, reason, &headers, end - start)?;
    if req.method == "HEAD" {
        return Ok(true);
    }
    let mut body = std::borrow::Cow::Borrowed(&file.data[s..e]);
    if corrupt && !body.is_empty() {
        let mid = body.len() / 2;
        body.to_mut()[mid] ^= 0xff;
    }
    write_body(w, &body, faults, &c.bytes)
}

/// Deterministic pseudo-random bytes (xorshift64*), for synthetic checkpoints.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A safetensors file of `U8` tensors with the given names and lengths, filled with
/// pseudo-random bytes from `seed`.
pub fn safetensors_bytes(tensors: &[(&str, usize)], seed: u64) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0usize;
    for (name, len) in tensors {
        header.insert(
            (*name).to_owned(),
            serde_json::json!({ "dtype": "U8", "shape": [len], "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    // Pad the header with spaces to a multiple of 8, as the reference writer does.
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = u64::try_from(json.len()).unwrap_or(0).to_le_bytes().to_vec();
    out.extend(json);
    out.extend(pseudo_random(offset, seed));
    out
}
