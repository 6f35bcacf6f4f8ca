//! Test helpers: run the real `sluice serve` binary on a free loopback port, and a minimal
//! HTTP/1.1 client over `TcpStream` that can also send malformed requests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One fixture per chat format besides Kimi K3's (Qwen3-MoE, GPT-OSS's harmony, DeepSeek with
/// R1's template, Kimi K2's tiktoken model and template), as directories under
/// `tests/fixtures`: what `families.rs` and `families_constrained.rs` serve.
pub const FAMILY_FIXTURES: [&str; 4] =
    ["qwen3_moe/tiny-a", "gpt_oss/tiny-a", "deepseek_v3/tiny-a", "deepseek_v3/tiny-b"];

/// The tiny real-layout K3 fixture.
pub fn tiny_a() -> String {
    root().join("tests/fixtures/kimi_k3/tiny-a").display().to_string()
}

/// The newest modification time of the sources the `sluice` binary is built from.
fn newest_source() -> std::time::SystemTime {
    fn walk(p: &std::path::Path, newest: &mut std::time::SystemTime) {
        let Ok(meta) = std::fs::metadata(p) else { return };
        if meta.is_dir() {
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                walk(&e.path(), newest);
            }
        } else if let Ok(m) = meta.modified() {
            *newest = (*newest).max(m);
        }
    }
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for d in [
        "crates/sluice-server/src",
        "crates/sluice-engine/src",
        "crates/sluice-cli/src",
        "crates/sluice-tokenizer/src",
    ] {
        walk(&root().join(d), &mut newest);
    }
    newest
}

/// The `sluice` binary next to this test's executable (target/<profile>/sluice). `cargo test
/// --workspace` builds it (the CLI's own tests need it); when it is missing or older than the
/// server, engine or CLI sources (e.g. after `cargo test -p sluice-server` alone), it is built.
pub fn sluice_bin() -> PathBuf {
    static CHECKED: Mutex<bool> = Mutex::new(false);
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let bin = dir.join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    let mut checked = CHECKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !*checked {
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        if built.is_none_or(|t| t < newest_source()) {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-q", "-p", "sluice-cli", "--bin", "sluice"]).current_dir(root());
            if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
                cmd.arg("--release");
            }
            cmd.env("CARGO_TARGET_DIR", dir.parent().expect("target dir"));
            let st = cmd.status().expect("run cargo build");
            assert!(st.success(), "building the sluice binary failed");
        }
        *checked = true;
    }
    assert!(bin.exists(), "no sluice binary at {}", bin.display());
    bin
}

/// A running `sluice serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
    /// Notified by the stderr reader after each line it appends to `log`.
    log_grew: Arc<Condvar>,
}

impl Server {
    /// Starts `sluice serve --port 0 ARGS` and waits for its address.
    pub fn start(args: &[&str]) -> Server {
        let cache = std::env::temp_dir().join("sluice-server-tests-cache");
        let mut child = Command::new(sluice_bin())
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .env("SLUICE_CACHE", cache)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = Arc::clone(&log);
        let log_grew = Arc::new(Condvar::new());
        let grew = Arc::clone(&log_grew);
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Logged before the address is sent, so the log is complete up to it at start.
                {
                    let mut l = log2.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                grew.notify_all();
                if let Some(rest) = line.split("on http://").nth(1) {
                    let _ = tx.send(rest.trim().to_owned());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a.parse().expect("address"),
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start: {}", log.lock().unwrap());
            }
        };
        Server { child, addr, log, log_grew }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Resident memory of the server process in KiB.
    pub fn rss_kib(&self) -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        st.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the server with SIGTERM and waits for the process to end (it first answers what
    /// is in flight and writes the states queued for its `--state-cache`); returns whether it
    /// exited cleanly.
    pub fn stop(&mut self) -> bool {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}");
        self.child.wait().expect("wait for the server").success()
    }

    /// The server's stderr so far, once `done` holds for it (or after 30 s: the caller's
    /// assertion then shows what was there). Lines the server printed arrive through a pipe
    /// and a reader thread, so they can lag behind the HTTP response they belong to.
    pub fn log_when(&self, done: impl Fn(&str) -> bool) -> String {
        let guard = self.log.lock().unwrap();
        let (log, _) = self
            .log_grew
            .wait_timeout_while(guard, Duration::from_secs(30), |log| !done(log))
            .unwrap();
        log.clone()
    }

    /// The whole /metrics text (for failure messages).
    pub fn metrics_text(&self) -> String {
        String::from_utf8_lossy(&get(self.addr, "/metrics").body).into_owned()
    }

    /// The value of one metric line (`name` or `name{labels}`).
    pub fn metric(&self, name: &str) -> f64 {
        let m = get(self.addr, "/metrics");
        let text = String::from_utf8_lossy(&m.body).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }
}

/// Sends a POST of `body` to `path` and returns the connection unread (the caller reads the
/// reply as it comes, or hangs up).
pub fn send(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let text = body.to_string();
    let mut c = TcpStream::connect(addr).expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        text.len()
    );
    c.write_all(head.as_bytes()).expect("send the head");
    c.write_all(text.as_bytes()).expect("send the body");
    c
}

/// Reads a streamed response from `c` until it holds `n` SSE `data:` events, and returns what
/// was read. The server sends the first (the role) when it queues the job, so a second one
/// means the engine is running the job.
pub fn read_events(c: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&got).matches("data: ").count() < n {
        let k = c.read(&mut buf).expect("read the stream");
        assert!(k > 0, "the stream ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..k]);
    }
    got
}

/// Sends raw bytes and reads the whole response (the request should ask `Connection: close`).
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Option<Resp> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    s.write_all(bytes).ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse_response(&buf)
}

/// Parses status, headers and a (possibly chunked) body.
pub fn parse_response(buf: &[u8]) -> Option<Resp> {
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())))
        .collect();
    let mut body = buf[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Some(Resp { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// A request with `Connection: close`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes).unwrap_or_else(|| panic!("no response to {method} {path}"))
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// Whether `python3` can import `openai`.
pub fn python_openai() -> bool {
    python_has("openai")
}

/// Whether `python3` can import `module`.
pub fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
