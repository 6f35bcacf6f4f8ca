//! A grammar engine failure mid-reply, over real HTTP on the tiny K3 fixture. The schema asks
//! for arrays nested without end (every array holds at least one array), so the grammar forces
//! `[` after `[` and llguidance's Earley row grows until it passes its item limit and the
//! engine fails: from then on the mask allows only the end token. Before session 12 the reply
//! then ended as if complete (`finish_reason: "stop"`, a truncated JSON content); now each API
//! answers with its error shape naming the grammar engine's cause, streamed as its error
//! event, and the server logs it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, tiny_a, Server};
use serde_json::{json, Value};

/// Arrays in arrays, at least one each: no finite JSON value matches, and the grammar engine
/// fails on its own limits while forcing the nesting.
fn endless_nesting() -> Value {
    json!({"type": "array", "items": {"$ref": "#"}, "minItems": 1})
}

/// A request that asks for [`endless_nesting`] through `format` (each API names it its own way).
fn nest(stream: bool, format: Value) -> Value {
    let mut body = json!({
        "model": "tiny-a",
        "max_tokens": 200,
        "stream": stream,
        "messages": [{"role": "user", "content": "Nest."}],
    });
    body.as_object_mut().unwrap().extend(format.as_object().unwrap().clone());
    body
}

fn openai(stream: bool) -> Value {
    nest(
        stream,
        json!({
            // Thinking off: a random model's free reasoning would run to `max_tokens`.
            "chat_template_kwargs": {"thinking": false},
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "nest", "schema": endless_nesting()}},
        }),
    )
}

fn anthropic(stream: bool) -> Value {
    nest(
        stream,
        json!({"output_config": {"format": {"type": "json_schema", "schema": endless_nesting()}}}),
    )
}

/// The grammar engine's cause, as the error message carries it.
fn names_the_cause(message: &str) -> bool {
    message.contains("grammar engine failed after") && message.contains("items")
}

#[test]
fn a_grammar_engine_failure_mid_reply_ended_it_as_if_complete() {
    let s = Server::start(&["--model", &tiny_a(), "--queue", "0"]);

    let r = post(s.addr, "/v1/chat/completions", &openai(false));
    let body = r.json();
    assert_eq!(r.status, 500, "{body}");
    let e = &body["error"];
    assert_eq!((&e["type"], &e["code"]), (&json!("server_error"), &json!("grammar_failed")), "{e}");
    assert!(names_the_cause(e["message"].as_str().unwrap()), "{e}");

    let r = post(s.addr, "/v1/chat/completions", &openai(true));
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let err: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "grammar_failed", "{data:?}");
    assert!(names_the_cause(err["error"]["message"].as_str().unwrap()), "{err}");
    // No chunk claimed a normal end.
    assert!(
        data.iter().all(|d| !d.contains("\"finish_reason\":\"stop\"")),
        "a chunk ended the reply as complete: {data:?}"
    );

    let r = post(s.addr, "/v1/messages", &anthropic(false));
    let body = r.json();
    assert_eq!(r.status, 500, "{body}");
    assert_eq!((&body["type"], &body["error"]["type"]), (&json!("error"), &json!("api_error")));
    assert!(names_the_cause(body["error"]["message"].as_str().unwrap()), "{body}");

    let r = post(s.addr, "/v1/messages", &anthropic(true));
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("event: message_stop"), "ended as complete: {text}");
    let err: Value = serde_json::from_str(r.sse_data().last().unwrap()).unwrap();
    assert!(names_the_cause(err["error"]["message"].as_str().unwrap()), "{err}");

    let log = s.log_when(|l| l.matches("the grammar engine failed").count() >= 4);
    assert_eq!(log.matches("the grammar engine failed").count(), 4, "{log}");
}
