//! Malformed and hostile clients: truncated and invalid JSON, wrong types, huge numbers, deep
//! nesting, invalid UTF-8, oversize bodies (declared and chunked), lying Content-Length, slow
//! bodies, garbage request lines, disconnects mid-stream and mid-request. The server must answer
//! each with an OpenAI-shaped 4xx (or drop the connection), keep answering `/health`, cancel
//! abandoned generations, and keep its resident memory bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{get, post, raw, request, tiny_a, Server};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";

fn assert_error(r: &common::Resp, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", String::from_utf8_lossy(&r.body));
    let e = &r.json()["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{what}: not OpenAI-shaped: {e}");
}

fn hostile_bodies() -> Vec<(Vec<u8>, &'static str)> {
    let m = r#""model":"tiny-a""#;
    let mut v: Vec<(Vec<u8>, &str)> = vec![
        (br#"{"model":"tiny-a","messages":[{"role":"user","con"#.to_vec(), "truncated JSON"),
        (b"".to_vec(), "empty body"),
        (b"null".to_vec(), "null body"),
        (b"[]".to_vec(), "array body"),
        (b"\xff\xfe\x00garbage".to_vec(), "invalid UTF-8"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"\ud800"}}]}}"#).into_bytes(), "lone surrogate"),
        (format!(r#"{{{m},"messages":"hi"}}"#).into_bytes(), "messages wrong type"),
        (format!(r#"{{{m},"messages":[]}}"#).into_bytes(), "empty messages"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"max_tokens":1e400}}"#).into_bytes(), "huge float"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"max_tokens":99999999999999999999999}}"#).into_bytes(), "huge int"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"max_tokens":-5}}"#).into_bytes(), "negative"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"temperature":"hot"}}"#).into_bytes(), "string temperature"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"temperature":NaN}}"#).into_bytes(), "NaN literal"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"seed":1.5}}"#).into_bytes(), "fractional seed"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"stop":{{}}}}"#).into_bytes(), "stop object"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"tools":[{{"type":"function"}}]}}"#).into_bytes(), "tool without function"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":[{{"type":"input_audio"}}]}}]}}"#).into_bytes(), "audio part"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"n":3}}"#).into_bytes(), "n=3"),
        (br#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.to_vec(), "unknown model"),
        (format!(r#"{{{m},"messages":[{{"role":"tool","content":"orphan"}}]}}"#).into_bytes(), "tool result without call"),
        (format!(r#"{{{m},"messages":[{{"role":"user","content":"x"}}],"max_tokens":40000}}"#).into_bytes(), "over the context"),
    ];
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    v.push((format!(r#"{{{m},"messages":{deep}}}"#).into_bytes(), "deep nesting"));
    let deep_obj = r#"{"a":"#.repeat(5000) + "1" + &"}".repeat(5000);
    v.push((format!(r#"{{{m},"metadata":{deep_obj},"messages":[]}}"#).into_bytes(), "deep object"));
    v
}

#[test]
fn hostile_requests_get_errors_and_the_server_stays_up_and_bounded() {
    let mut s = Server::start(&[
        "--model",
        &tiny_a(),
        "--max-request-bytes",
        "65536",
        "--body-timeout-s",
        "2",
        "--queue",
        "1",
    ]);
    let warm = post(
        s.addr,
        CHAT,
        &json!({"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 2, "reasoning_effort": "none"}),
    );
    assert_eq!(warm.status, 200);
    let rss0 = s.rss_kib();
    for round in 0..20 {
        for (body, what) in hostile_bodies() {
            let r = request(s.addr, "POST", CHAT, &[], &body);
            let want = match what {
                "unknown model" => 404,
                "deep nesting" | "deep object" if body.len() > 65536 => 413,
                _ => 400,
            };
            if round == 0 {
                assert_error(&r, want, what);
            }
        }
        // Oversize, declared and chunked.
        let big = vec![b' '; 70_000];
        assert_error(&request(s.addr, "POST", CHAT, &[], &big), 413, "declared oversize");
        let mut chunked = format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
        for _ in 0..20 {
            chunked.extend_from_slice(format!("{:x}\r\n", 8192).as_bytes());
            chunked.extend_from_slice(&[b'a'; 8192]);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        if let Some(r) = raw(s.addr, &chunked) {
            assert_error(&r, 413, "chunked oversize");
        }
        // Garbage that is not HTTP, an unknown path, a wrong method, a header bomb.
        let _ = raw(s.addr, b"\x00\x01\x02 GARBAGE\r\n\r\n");
        let _ =
            raw(s.addr, b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_error(&get(s.addr, "/v2/everything"), 404, "unknown path");
        assert_error(&request(s.addr, "DELETE", "/v1/models", &[], b""), 405, "wrong method");
        let bomb: String = (0..2000).map(|i| format!("X-H{i}: {}\r\n", "v".repeat(40))).collect();
        let _ = raw(
            s.addr,
            format!("GET /health HTTP/1.1\r\nHost: x\r\n{bomb}Connection: close\r\n\r\n")
                .as_bytes(),
        );
        // A lying Content-Length: the connection is dropped before the body completes.
        if let Ok(mut c) = TcpStream::connect(s.addr) {
            let _ = c.write_all(
                format!(
                    "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{{\"model\""
                )
                .as_bytes(),
            );
        }
        assert_eq!(get(s.addr, "/health").status, 200, "health after round {round}");
    }
    assert!(s.alive(), "the server died");
    let rss1 = s.rss_kib();
    println!("RSS before {rss0} KiB, after {rss1} KiB");
    assert!(rss1 < rss0 + 64 * 1024, "RSS grew from {rss0} KiB to {rss1} KiB");
}

#[test]
fn slow_bodies_time_out_while_others_are_served() {
    let s = Server::start(&["--model", &tiny_a(), "--body-timeout-s", "1"]);
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(
        format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .unwrap();
    let t = Instant::now();
    assert_eq!(get(s.addr, "/health").status, 200, "served while a body trickles");
    // The client under test trickles its body: a pause, then one byte more. The sleep is that
    // slow client itself, not a wait for an event.
    std::thread::sleep(Duration::from_millis(300));
    let _ = slow.write_all(b" ");
    let mut buf = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = slow.read_to_end(&mut buf);
    let r = common::parse_response(&buf).expect("a response");
    assert_error(&r, 408, "slow body");
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_connection_that_never_finished_its_header_was_held_forever() {
    let s = Server::start(&["--model", &tiny_a(), "--body-timeout-s", "1"]);
    let mut silent = TcpStream::connect(s.addr).unwrap();
    let mut partial = TcpStream::connect(s.addr).unwrap();
    partial.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    for c in [&mut silent, &mut partial] {
        // The event waited on is the server closing the connection (EOF or a reset); the read
        // timeout only keeps a regression from hanging the suite.
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = Vec::new();
        match c.read_to_end(&mut buf) {
            Ok(_) => assert!(buf.is_empty(), "no response is possible before a header"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    assert_eq!(get(s.addr, "/health").status, 200, "a prompt client is still served");
}

#[test]
fn disconnects_cancel_generation_and_free_the_slot() {
    // Greedy on tiny-a never emits the stop token: 30000 tokens run for well over a minute, so
    // the generation is still running when the hang-up is noticed, even on a loaded machine
    // where the HTTP side lags the engine. (A sampled reply may end by itself first.) The
    // `--stats` line of a job is printed once it has freed its slot and been counted: the event
    // each hang-up is waited on by. Checkpoints every 8 positions cap a pass at a few of them
    // (the serve rule), so a long prompt's prefill takes several passes and its end is logged:
    // the event of the engine running a job that streams nothing.
    let s = Server::start(&[
        "--model",
        &tiny_a(),
        "--queue",
        "0",
        "--max-tokens",
        "30000",
        "--stats",
        "--checkpoint-every",
        "8",
    ]);
    let long = json!({"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000,
                      "reasoning_effort": "none", "temperature": 0.0});
    // Streaming: read the first token's event (the engine runs the job), then hang up.
    let mut body = long.clone();
    body["stream"] = json!(true);
    let mut c = common::send(s.addr, CHAT, &body);
    common::read_events(&mut c, 2);
    let busy = post(s.addr, CHAT, &long);
    assert_eq!(busy.status, 429, "busy while streaming");
    assert!(busy.header("retry-after").is_some());
    drop(c);
    let log = s.log_when(|l| cancelled_jobs(l) >= 1);
    assert_eq!(cancelled_jobs(&log), 1, "{log}");
    assert_eq!(s.metric("sluice_generations_cancelled_total"), 1.0, "{}", s.metrics_text());
    // Non-streaming: send the request and hang up once its prefill has ended.
    let prefills = prefills_ended(&log);
    let mut long = long;
    long["messages"][0]["content"] = json!(
        "The keeper opened the gate and the water ran down the old stone channel. ".repeat(8)
    );
    let c = common::send(s.addr, CHAT, &long);
    let log = s.log_when(|l| prefills_ended(l) > prefills);
    assert!(prefills_ended(&log) > prefills, "the long prompt's prefill never ended: {log}");
    drop(c);
    let log = s.log_when(|l| cancelled_jobs(l) >= 2);
    assert_eq!(cancelled_jobs(&log), 2, "{log}");
    assert_eq!(s.metric("sluice_generations_cancelled_total"), 2.0, "{}", s.metrics_text());
    let ok = post(
        s.addr,
        CHAT,
        &json!({"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 1, "reasoning_effort": "none"}),
    );
    assert_eq!(ok.status, 200, "the slot is free again");
}

/// The `--stats` lines of jobs that ended cancelled.
fn cancelled_jobs(log: &str) -> usize {
    log.lines().filter(|l| l.starts_with("stats: job ") && l.contains(", finish cancelled")).count()
}

/// The log lines of multi-pass prefills that ended (`prefill N/N positions`).
fn prefills_ended(log: &str) -> usize {
    log.lines()
        .filter_map(|l| l.split(": prefill ").nth(1)?.split(' ').next()?.split_once('/'))
        .filter(|(done, total)| done == total)
        .count()
}

#[test]
fn api_key_is_required_when_set() {
    let s = Server::start(&["--model", &tiny_a(), "--api-key", "sekret"]);
    assert_error(&get(s.addr, "/v1/models"), 401, "no key");
    assert_error(
        &request(s.addr, "GET", "/v1/models", &[("Authorization", "Bearer wrong")], b""),
        401,
        "wrong key",
    );
    assert_eq!(
        request(s.addr, "GET", "/v1/models", &[("Authorization", "Bearer sekret")], b"").status,
        200
    );
    assert_eq!(get(s.addr, "/health").status, 200, "health stays open");
}
