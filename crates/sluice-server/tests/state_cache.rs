//! `sluice serve --state-cache`: a restarted server restores prompt states the previous process
//! wrote — the whole prompt of a repeated request, and the shared system prompt (a message
//! boundary) of a new conversation — and its output is unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, tiny_a, Server};
use serde_json::{json, Value};

fn chat(server: &Server, user: &str) -> Value {
    let system = "You are a careful assistant who answers in one short sentence. ".repeat(6);
    let body = json!({"model": "tiny-a", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4, "temperature": 0});
    let r = post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["sluice"].clone()
}

#[test]
fn a_restarted_server_restores_the_prompt_and_the_shared_system_prompt_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = ["--model", &tiny_a(), "--state-cache", d, "--state-cache-every", "0"];
    let plain = Server::start(&["--model", &tiny_a(), "--session-memory", "0"]);
    let mut first = Server::start(&args);
    let a = chat(&first, "What is a cache?");
    assert_eq!(a["state_cache_tokens_restored"], 0);
    assert_eq!(first.metric("sluice_state_cache_write_errors_total"), 0.0);
    // The system prompt's end and the prompt's end (and the generation's end, unless the reply
    // was one token); not the user message's end, a few tokens short of the prompt's. A
    // stopped server has written every state it queued.
    assert!(first.stop(), "a clean stop");
    let written = files(dir.path());
    assert!(written.len() >= 2 && written.iter().all(|&(_, b)| b > 0), "{written:?}");

    let second = Server::start(&args);
    let again = chat(&second, "What is a cache?");
    assert_eq!(again["state_cache_tokens_restored"], a["prompt_tokens"], "the whole prompt");
    assert_eq!(again["prefill_tokens"], 0);
    assert_eq!(again["generated_ids"], a["generated_ids"]);
    let other = chat(&second, "Name a prime number.");
    let restored = other["state_cache_tokens_restored"].as_u64().unwrap();
    assert!(
        restored > 0 && restored < other["prompt_tokens"].as_u64().unwrap(),
        "the system prompt's boundary: {other}"
    );
    assert_eq!(other["generated_ids"], chat(&plain, "Name a prime number.")["generated_ids"]);
    assert_eq!(second.metric("sluice_state_cache_refused_total"), 0.0);
    assert!(second.metric("sluice_state_cache_tokens_restored_total") >= restored as f64);
}

/// The prefix length of every state file in `dir`, with its size (the header's token count).
fn files(dir: &std::path::Path) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "state"))
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (u64::from_le_bytes(b[44..52].try_into().unwrap()), b.len() as u64)
        })
        .collect();
    out.sort_unstable();
    out
}

fn chat_messages(server: &Server, messages: &Value) -> Value {
    let body = json!({"model": "tiny-a", "messages": messages, "tool_choice": "none",
        "max_tokens": 4, "temperature": 0});
    let r = post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn a_trailing_tool_choice_message_left_only_states_no_follow_up_restores() {
    // (Also: the prompt's end, after the tool-choice message, was written, 0.6 GB on K3.)
    // With `tool_choice` the format writes a tool-choice message after the last message, and
    // a next request writes it after its own: the prompt's end and the reply's state are no
    // prefix of any follow-up. The message boundaries included that message (so the system
    // prompt's was dropped and the last message's was useless) and the reply's state was
    // written anyway; a restarted server restored nothing of the conversation.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = ["--model", &tiny_a(), "--state-cache", d, "--state-cache-every", "0"];
    let system = "You are a careful assistant who answers in one short sentence. ".repeat(6);
    let mut messages = json!([{"role": "system", "content": system},
                              {"role": "user", "content": "What is a cache?"}]);
    let mut first = Server::start(&args);
    let a = chat_messages(&first, &messages);
    let p1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    // A stopped server has written every state it queued.
    assert!(first.stop(), "a clean stop");
    let written = files(dir.path());
    // The system prompt's end and the user message's end; not the prompt's end (after the
    // tool-choice message) nor anything past it. The bytes the request queued are the files'.
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(written.iter().all(|&(n, _)| n < p1), "a state no follow-up restores: {written:?}");
    let bytes: u64 = written.iter().map(|&(_, b)| b).sum();
    assert_eq!(a["sluice"]["state_cache_bytes_written"].as_u64(), Some(bytes), "{written:?}");
    // The follow-up: the reply as returned, then a new user message.
    let reply = a["choices"][0]["message"].clone();
    let list = messages.as_array_mut().unwrap();
    list.extend([reply, json!({"role": "user", "content": "And a register?"})]);
    let second = Server::start(&args);
    let b = chat_messages(&second, &messages);
    let restored = b["sluice"]["state_cache_tokens_restored"].as_u64().unwrap();
    assert_eq!(restored, written[1].0, "the user message's end, before the tool-choice message");
    let plain = Server::start(&["--model", &tiny_a(), "--session-memory", "0"]);
    let want = chat_messages(&plain, &messages);
    assert_eq!(b["sluice"]["generated_ids"], want["sluice"]["generated_ids"]);
}

#[test]
fn the_last_message_boundary_wrote_a_second_state_a_few_tokens_short_of_the_prompt_end() {
    // Without a trailing message a follow-up starts with the whole prompt: the state at the
    // last message's end (the prompt less its generation prompt) restores nothing the
    // prompt's end does not, and was written besides it.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = ["--model", &tiny_a(), "--state-cache", d, "--state-cache-every", "0"];
    let mut server = Server::start(&args);
    let body = json!({"model": "tiny-a", "max_tokens": 1, "temperature": 0, "messages": [
        {"role": "system", "content": "You are terse. ".repeat(8)},
        {"role": "user", "content": "What is a cache?"}]});
    let r = post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let a = r.json();
    let p1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    // A stopped server has written every state it queued.
    assert!(server.stop(), "a clean stop");
    let written = files(dir.path());
    // One token generated: the state after it holds nothing past the prompt.
    let at: Vec<u64> = written.iter().map(|&(n, _)| n).collect();
    assert_eq!(at.len(), 2, "{written:?}");
    assert!(at[0] < p1 && at[1] == p1, "the system prompt's end and the prompt's end: {at:?}");
    let bytes: u64 = written.iter().map(|&(_, b)| b).sum();
    assert_eq!(a["sluice"]["state_cache_bytes_written"].as_u64(), Some(bytes), "{written:?}");
    // The system prompt's end is captured inside the one prefill pass, not cut at.
    assert_eq!(a["sluice"]["prefill_passes"], 1, "{a}");
    assert_eq!(
        (&a["sluice"]["prefill_captures"], &a["sluice"]["capture_cuts"]),
        (&json!(1), &json!(0))
    );
}
