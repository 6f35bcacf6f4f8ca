//! Tests of [`super::K3OutputParser`] on token sequences built with the tiny K3 fixture's
//! tokenizer (real marker ids, text as ordinary tokens).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::path::PathBuf;
use std::sync::OnceLock;

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
        Tokenizer::from_dir(dir).expect("fixture tokenizer")
    })
}

/// Builds ids from a string where `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>` are
/// markers and everything else ordinary text.
fn ids(s: &str) -> Vec<u32> {
    let t = tok();
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let next = Marker::ALL
            .iter()
            .filter_map(|m| rest.find(m.spelling()).map(|i| (i, *m)))
            .min_by_key(|(i, _)| *i);
        match next {
            Some((i, m)) => {
                out.extend(t.encode_ordinary(&rest[..i]));
                out.push(m.id(t).unwrap());
                rest = &rest[i + m.spelling().len()..];
            }
            None => {
                out.extend(t.encode_ordinary(rest));
                rest = "";
            }
        }
    }
    out
}

fn parse(s: &str, thinking: bool, tools: bool) -> Vec<OutputEvent> {
    K3OutputParser::new(tok(), thinking, tools).unwrap().parse_all(&ids(s))
}

/// Token-by-token events, merged, equal the whole-output events.
fn streamed(s: &str, thinking: bool, tools: bool) -> Vec<OutputEvent> {
    let mut p = K3OutputParser::new(tok(), thinking, tools).unwrap();
    let mut out = Vec::new();
    for id in ids(s) {
        for e in p.push(id) {
            push_event(&mut out, e);
        }
    }
    for e in p.finish() {
        push_event(&mut out, e);
    }
    out
}

fn r(s: &str) -> OutputEvent {
    OutputEvent::Reasoning(s.into())
}
fn c(s: &str) -> OutputEvent {
    OutputEvent::Content(s.into())
}
fn call(index: usize, name: &str, args: &str) -> OutputEvent {
    OutputEvent::ToolCall(ParsedToolCall {
        index,
        xtml_index: Some(index as u64 + 1),
        name: name.into(),
        arguments: args.into(),
    })
}

#[test]
fn reasoning_then_content() {
    let s =
        "Let me think.<|close|>think<|sep|><|open|>response<|sep|>Hello!<|close|>response<|sep|>\
             <|close|>message<|sep|><|end_of_msg|>";
    assert_eq!(parse(s, true, false), vec![r("Let me think."), c("Hello!")]);
    assert_eq!(streamed(s, true, false), parse(s, true, false));
    let mut p = K3OutputParser::new(tok(), true, false).unwrap();
    p.parse_all(&ids(s));
    assert_eq!(p.reasoning_tokens(), tok().encode_ordinary("Let me think.").len());
}

#[test]
fn non_thinking_output_is_all_content_and_unwrapped() {
    let s = "Hi there<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    assert_eq!(parse(s, false, false), vec![c("Hi there")]);
}

#[test]
fn unfinished_reasoning_stays_reasoning() {
    assert_eq!(parse("still thinking", true, false), vec![r("still thinking")]);
    // A response opener without a think close ends the reasoning.
    let s = "hmm<|open|>response<|sep|>ok";
    assert_eq!(parse(s, true, false), vec![r("hmm"), c("ok")]);
}

#[test]
fn tool_calls_with_typed_arguments() {
    let s = "thinking<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>\
        <|open|>tools<|sep|>\
        <|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\
        <|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"Nord\"<|close|>argument<|sep|>\
        <|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>\
        <|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"metric\": true}<|close|>argument<|sep|>\
        <|close|>call<|sep|>\
        <|open|>call tool=\"a&amp;b&quot;\" index=\"2\"<|sep|>\
        <|open|>argument key=\"x\" type=\"number\"<|sep|>not json<|close|>argument<|sep|>\
        <|close|>call<|sep|>\
        <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    let want = vec![
        r("thinking"),
        c("Checking."),
        call(
            0,
            "get_weather",
            r#"{"city": "Paris \"Nord\"", "days": 3, "opts": {"metric": true}}"#,
        ),
        call(1, "a&b\"", r#"{"x": "not json"}"#),
    ];
    assert_eq!(parse(s, true, true), want);
    assert_eq!(streamed(s, true, true), want);
}

#[test]
fn each_call_is_emitted_when_its_close_arrives() {
    let s =
        "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>\
             <|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|>";
    let all = ids(s);
    let mut p = K3OutputParser::new(tok(), false, true).unwrap();
    let mut seen = Vec::new();
    for (i, &id) in all.iter().enumerate() {
        for e in p.push(id) {
            seen.push((i, e));
        }
    }
    let close_call_sep = all.iter().rposition(|&t| t == Marker::Sep.id(tok()).unwrap()).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].0 < close_call_sep, "first call emitted before the second opened");
    assert_eq!(seen[0].1, call(0, "f", "{}"));
    assert!(p.finish().is_empty(), "the unfinished second call is dropped");
}

#[test]
fn without_declared_tools_the_tools_channel_is_literal() {
    let s = "ok<|close|>response<|sep|><|open|>tools<|sep|>x<|close|>tools<|sep|>";
    assert_eq!(parse(s, false, false), vec![c("ok<|open|>tools<|sep|>x<|close|>tools<|sep|>")]);
}

#[test]
fn stray_markers_and_unknown_tags_are_literal_text() {
    assert_eq!(parse("a<|sep|>b", false, false), vec![c("a<|sep|>b")]);
    assert_eq!(parse("a<|open|>foo<|sep|>b", false, false), vec![c("a<|open|>foo<|sep|>b")]);
    assert_eq!(parse("a<|open|>unfinished", false, false), vec![c("a<|open|>unfinished")]);
    assert_eq!(
        parse("x<|open|>a<|open|>b<|sep|>", true, false),
        vec![r("x<|open|>a<|open|>b<|sep|>")]
    );
    // Text spelling a marker is ordinary text, never structure.
    let t = tok();
    let spelled = t.encode_ordinary("<|close|>think<|sep|>");
    let mut p = K3OutputParser::new(t, true, false).unwrap();
    assert_eq!(p.parse_all(&spelled), vec![r("<|close|>think<|sep|>")]);
}

#[test]
fn raw_json_arguments_element() {
    let s =
        "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>\
             <|open|>json type=\"object\"<|sep|>[1, 2]<|close|>json<|sep|><|close|>call<|sep|>";
    assert_eq!(parse(s, false, true), vec![call(0, "f", "[1, 2]")]);
}

#[test]
fn hostile_sequences_never_panic_and_stay_bounded() {
    let t = tok();
    let m: Vec<u32> = Marker::ALL.iter().map(|m| m.id(t).unwrap()).collect();
    let mut seed = 0x1234_5678_u64;
    for _ in 0..200 {
        let mut p = K3OutputParser::new(t, seed.is_multiple_of(2), true).unwrap();
        for _ in 0..300 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let pick = u32::try_from(seed >> 40).unwrap();
            let id = if pick.is_multiple_of(3) { m[pick as usize % 4] } else { pick % 600 };
            let _ = p.push(id);
        }
        let _ = p.finish();
    }
    // A tag that never ends is flushed as text once it passes the limit.
    let mut p = K3OutputParser::new(t, false, false).unwrap();
    let _ = p.push(m[0]);
    let mut text = 0;
    for _ in 0..=MAX_TAG_TOKENS {
        text += p.push(u32::from(b'a')).len();
    }
    assert_eq!(text, 1);
}
