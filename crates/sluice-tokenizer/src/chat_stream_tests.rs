//! Tests of [`super::TextMachine`]: known completions of every text format, fed whole, one
//! character at a time and in odd chunks, collect to what [`OutputFormat::parse`] makes of
//! them; and the held-back text never leaks a partial marker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::output::{ParsedOutput, ParsedToolCall};

/// Every event of `text` fed in pieces of `step` characters (0: whole), collected.
fn collect(format: OutputFormat, open: bool, text: &str, step: usize) -> ParsedOutput {
    let mut m = TextMachine::new(format, open);
    let mut events = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = if step == 0 {
        vec![text.to_owned()]
    } else {
        chars.chunks(step).map(|c| c.iter().collect()).collect()
    };
    for p in &pieces {
        events.extend(m.push_text(p));
    }
    events.extend(m.finish());
    let mut out = ParsedOutput::default();
    for (i, e) in events.into_iter().enumerate() {
        match e {
            OutputEvent::Reasoning(t) => out.reasoning.get_or_insert_with(String::new).push_str(&t),
            OutputEvent::Content(t) => out.content.push_str(&t),
            OutputEvent::ToolCall(c) => {
                assert_eq!(c.index, out.tool_calls.len(), "event {i}: calls are numbered");
                out.tool_calls.push(ParsedToolCall { name: c.name, arguments: c.arguments });
            }
        }
    }
    out
}

/// Streams `text` at several chunkings and checks each against the whole-text parser.
fn agrees(format: OutputFormat, open: bool, text: &str) -> ParsedOutput {
    let whole = format.parse(text);
    for step in [0, 1, 2, 3, 7] {
        let got = collect(format, open, text, step);
        assert_eq!(got, whole, "{format:?}, {step}-character pieces of {text:?}");
    }
    whole
}

#[test]
fn qwen3_streams_as_it_parses() {
    let out = agrees(
        OutputFormat::Qwen3,
        false,
        "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n\
         {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n\
         </tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n\
         </tool_call><|im_end|>",
    );
    assert_eq!(out.tool_calls.len(), 2);
    agrees(OutputFormat::Qwen3, true, "Two plus two.\n</think>\n\nIt is 4.<|im_end|>");
    agrees(OutputFormat::Qwen3, false, "No reasoning here.<|im_end|>");
    agrees(OutputFormat::Qwen3, false, "<tool_call>\nnot json\n</tool_call>");
    agrees(OutputFormat::Qwen3, false, "<think>\nStill thinking about");
    agrees(OutputFormat::Qwen3, false, "A < b and c <tool but not a call.  ");
    // The stop token `<|im_end|>` is not text: a call it cut off still completes.
    let cut =
        agrees(OutputFormat::Qwen3, false, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
    assert_eq!(cut.tool_calls.len(), 1);
}

#[test]
fn harmony_streams_as_it_parses() {
    agrees(
        OutputFormat::Harmony,
        false,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>\
         commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    );
    agrees(
        OutputFormat::Harmony,
        false,
        " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"q\"}<|call|>",
    );
    agrees(
        OutputFormat::Harmony,
        false,
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final\
         <|message|>Paris.<|return|>",
    );
    agrees(OutputFormat::Harmony, false, "<|channel|>final<|message|>Par");
    // `<|call|>` is a stop id, so it never arrives: the call completes at the end.
    let out = agrees(
        OutputFormat::Harmony,
        false,
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}",
    );
    assert_eq!(out.tool_calls[0].name, "f");
    agrees(OutputFormat::Harmony, false, "plain text, no header");
}

#[test]
fn sectioned_formats_stream_as_they_parse() {
    agrees(
        OutputFormat::DeepSeek,
        true,
        "The user wants weather.\n</think>\n\nLet me check.<｜tool▁calls▁begin｜>\
         <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zürich\"}\n```\
         <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n\
         {\"query\": \"x\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    );
    agrees(OutputFormat::DeepSeek, true, "Short.\n</think>\n\nIt is 4.<｜end▁of▁sentence｜>x");
    agrees(OutputFormat::DeepSeek, false, "V3 answers without reasoning.");
    agrees(
        OutputFormat::KimiK2,
        false,
        "<think>Need the weather.</think>Checking.<|tool_calls_section_begin|>\
         <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}\
         <|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>\
         {\"query\": \"x\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
    );
    agrees(OutputFormat::KimiK2, false, "<think>Still thinking");
}

#[test]
fn a_reply_whose_prompt_opened_the_think_block_starts_in_reasoning() {
    // R1 cut off by the token limit: the whole-text parser cannot know the prompt opened the
    // block and calls it an answer; the stream, told by the prompt, keeps it reasoning.
    let out = collect(OutputFormat::DeepSeek, true, "Thinking about it", 1);
    assert_eq!((out.reasoning.as_deref(), out.content.as_str()), (Some("Thinking about it"), ""));
}

#[test]
fn partial_markers_are_held_back_until_they_resolve() {
    let mut m = TextMachine::new(OutputFormat::Qwen3, false);
    assert_eq!(m.push_text("Hi <tool_c"), [OutputEvent::Content("Hi".into())]);
    // Not a marker after all: released with the space held before it.
    assert_eq!(m.push_text("ar"), [OutputEvent::Content(" <tool_car".into())]);
    assert_eq!(partial_marker_len("abc<|chan", HARMONY_MARKERS), 6);
    assert_eq!(partial_marker_len("abc<|x", HARMONY_MARKERS), 0);
    assert_eq!(partial_marker_len("中<", QWEN3_MARKERS), 1);
}
