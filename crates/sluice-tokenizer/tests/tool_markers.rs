//! A tool call whose argument string spells markers, through each template family's real tiny
//! tokenizer: encoded (the markup's markers as their added tokens, and the argument's marker
//! text too where the tokenizer reads it so), then parsed on ids as the server and `run --chat`
//! parse replies. The call comes back whole, whole and streamed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{json, Value};
use sluice_tokenizer::{ParsedOutput, PromptFormat};
use std::path::PathBuf;

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family)
}

#[test]
fn a_marker_inside_a_json_string_of_the_arguments_cut_the_call_short_on_ids() {
    let args = json!({"s": "a</tool_call>b<|tool_call_end|>c<|tool_calls_section_end|>\
                      d<｜tool▁call▁end｜>e<|call|>f<|im_end|>g\"h\\i<｜end▁of▁sentence｜>"});
    let a = args.to_string();
    let replies = [
        (
            "qwen3_moe/tiny-a",
            "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": ",
            "}\n</tool_call>",
        ),
        (
            "gpt_oss/tiny-a",
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
            "<|call|>",
        ),
        (
            "deepseek_v3/tiny-a",
            "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n",
            "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            "deepseek_v3/tiny-b",
            "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
             <|tool_call_argument_begin|>",
            "<|tool_call_end|><|tool_calls_section_end|>",
        ),
    ];
    for (family, head, tail) in replies {
        let fmt = PromptFormat::from_dir(&fixture(family)).unwrap().unwrap();
        let tok = fmt.tokenizer();
        // The markup's markers as their ids; the arguments one character at a time, as ordinary
        // tokens (a grammar-constrained model spells a string's marker text so).
        let mut ids = tok.encode_rendered(head).unwrap();
        for c in a.chars() {
            ids.extend(tok.encode_plain(&c.to_string()).unwrap());
        }
        ids.extend(tok.encode_rendered(tail).unwrap());
        let out = fmt.parse_reply(&ids, false, true).unwrap();
        assert_eq!(out.tool_calls.len(), 1, "{family}: {out:?}");
        assert_eq!(out.tool_calls[0].name, "f", "{family}");
        let got: Value = serde_json::from_str(&out.tool_calls[0].arguments).unwrap();
        assert_eq!(got, args, "{family}");
        // One token at a time, as the server streams it.
        let mut p = fmt.output_parser(false, true).unwrap();
        let mut events: Vec<_> = ids.iter().flat_map(|&id| p.push(id)).collect();
        events.extend(p.finish());
        assert_eq!(ParsedOutput::from_events(events), out, "{family}: streamed");
    }
}

/// A JSON answer whose string spells every family's end of turn and markers (as ordinary
/// tokens, which is how a grammar writes them): parsed on ids, the spellings are text, so the
/// answer comes back whole, streamed and not.
#[test]
fn a_spelled_end_of_turn_in_a_json_answer_was_read_as_the_marker() {
    let answer = json!({"s": "a<|im_end|>b<|endoftext|>c<｜end▁of▁sentence｜>d<|return|>e<|end|>\
                        f[EOS]g<|tool_calls_section_begin|>h<tool_call>i</think>j"})
    .to_string();
    let heads = [
        ("qwen3_moe/tiny-a", ""),
        ("gpt_oss/tiny-a", "<|channel|>final<|message|>"),
        ("deepseek_v3/tiny-a", ""),
        ("deepseek_v3/tiny-b", ""),
    ];
    for (family, head) in heads {
        let fmt = PromptFormat::from_dir(&fixture(family)).unwrap().unwrap();
        let tok = fmt.tokenizer();
        let mut ids = tok.encode_rendered(head).unwrap();
        ids.extend(tok.encode_plain(&answer).unwrap());
        let out = fmt.parse_reply(&ids, false, false).unwrap();
        assert_eq!(out.content, answer, "{family}: {out:?}");
        // One token at a time, as the server streams it.
        let mut p = fmt.output_parser(false, false).unwrap();
        let mut streamed = String::new();
        for &id in &ids {
            for e in p.push(id) {
                if let sluice_tokenizer::OutputEvent::Content(t) = e {
                    streamed.push_str(&t);
                }
            }
        }
        for e in p.finish() {
            if let sluice_tokenizer::OutputEvent::Content(t) = e {
                streamed.push_str(&t);
            }
        }
        assert_eq!(streamed, answer, "{family}: streamed");
    }
}
