//! Tests of [`super::TextMachine`]: known completions of every text format, fed whole, one
//! character at a time and in odd chunks, collect to the same reply; the held-back text never
//! leaks a partial marker; a marker inside a call's JSON string is text; and a tool call
//! rendered in each format with any argument string parses back to that string (proptest).
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
    let whole = format.parse(text, open, true);
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
    // R1 cut off by the token limit: told by the prompt, the reply stays reasoning.
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

/// One tool call to `f` with `args` (compact JSON, as the reply grammar writes it) in `format`,
/// after the answer `Sure.`, as each format's grammar (`crate::reply_grammar`) spells it.
fn render_call(format: OutputFormat, args: &str) -> String {
    match format {
        OutputFormat::Qwen3 => {
            format!("Sure.\n<tool_call>\n{{\"name\": \"f\", \"arguments\": {args}}}\n</tool_call>")
        }
        OutputFormat::Harmony => format!(
            "<|channel|>final<|message|>Sure.<|end|><|start|>assistant<|channel|>commentary \
             to=functions.f <|constrain|>json<|message|>{args}<|call|>"
        ),
        OutputFormat::DeepSeek => format!(
            "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n\
             {args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        ),
        OutputFormat::KimiK2 => format!(
            "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
             <|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        ),
        OutputFormat::Plain => args.to_owned(),
    }
}

const CALL_FORMATS: [OutputFormat; 4] =
    [OutputFormat::Qwen3, OutputFormat::Harmony, OutputFormat::DeepSeek, OutputFormat::KimiK2];

/// Every marker of every text format, and the end-of-turn tokens.
const ALL_MARKERS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜end▁of▁sentence｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "[EOS]",
];

/// Checks that `format`'s rendered call with `args` parses back, at every chunking, to one call
/// of `f` whose arguments are the same JSON value, after the answer `Sure.`.
fn round_trips(format: OutputFormat, args: &serde_json::Value) {
    let text = render_call(format, &args.to_string());
    let out = agrees(format, false, &text);
    assert_eq!(out.content, "Sure.", "{format:?}: {text:?}");
    assert_eq!(out.tool_calls.len(), 1, "{format:?}: {text:?} gave {out:?}");
    assert_eq!(out.tool_calls[0].name, "f", "{format:?}");
    let got: serde_json::Value = serde_json::from_str(&out.tool_calls[0].arguments).unwrap();
    assert_eq!(&got, args, "{format:?}: {text:?}");
}

#[test]
fn a_marker_inside_a_json_string_of_the_arguments_cut_the_call_short() {
    for format in CALL_FORMATS {
        for marker in ALL_MARKERS {
            let args = serde_json::json!({"text": format!("a {marker} b"), "n": 1});
            round_trips(format, &args);
        }
        // Escaped quotes and backslashes do not end the string early.
        let args = serde_json::json!({"q": "say \"</tool_call>\" \\", "r": "\\\"<|call|>"});
        round_trips(format, &args);
    }
}

#[test]
fn a_think_tag_in_the_answer_split_it_as_reasoning() {
    for format in [OutputFormat::Qwen3, OutputFormat::DeepSeek, OutputFormat::KimiK2] {
        for answer in [
            "Close it with `</think>` and go on.",
            "```xml\n<think>\nplan\n</think>\n```",
            "{\"tag\": \"</think>\", \"open\": \"<think>\"}",
        ] {
            let out = agrees(format, false, answer);
            assert_eq!((out.reasoning, out.content.as_str()), (None, answer), "{format:?}");
            // After real reasoning, the answer's tags are still its text.
            let text = format!("<think>why</think>{answer}");
            let out = agrees(format, false, &text);
            assert_eq!(out.reasoning.as_deref(), Some("why"), "{format:?}");
            assert_eq!(out.content, answer, "{format:?}");
        }
    }
}

#[test]
fn a_call_whose_string_never_closes_is_read_again_with_markers_everywhere() {
    // A stray quote: the first call's body is not JSON. Read leniently at the end, the second
    // call and the section end still count, as they did before calls were read as JSON.
    let out = agrees(
        OutputFormat::KimiK2,
        false,
        "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
         <|tool_call_argument_begin|>{\"a\": \"x}<|tool_call_end|><|tool_call_begin|>functions.g:1\
         <|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    );
    let names: Vec<&str> = out.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["f", "g"], "{out:?}");
    let out = agrees(
        OutputFormat::Qwen3,
        false,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x}}\n</tool_call>\nThen more.",
    );
    assert!(out.tool_calls.is_empty(), "{out:?}");
    assert!(out.content.ends_with("</tool_call>\nThen more."), "{out:?}");
}

/// An argument string built from markers, JSON escapes and ordinary text.
fn arg_string() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let piece = prop_oneof![
        proptest::sample::select(ALL_MARKERS).prop_map(str::to_owned),
        proptest::sample::select(
            &["\"", "\\", "\\\"", "\n", "\t", "\u{1}", "{", "}", "```", "<", "|", "é中"][..]
        )
        .prop_map(str::to_owned),
        "[a-z <>|/]{0,6}",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn rendered_calls_parse_back_to_their_arguments(a in arg_string(), b in arg_string()) {
        let args = serde_json::json!({"a": a, "list": [b, 2]});
        for format in CALL_FORMATS {
            round_trips(format, &args);
        }
    }
}
