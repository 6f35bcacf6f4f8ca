//! The chat formats of the families that render with their own Jinja template, and how their
//! replies split into reasoning, answer and tool calls. Family-neutral: the format is chosen once
//! from the checkpoint ([`OutputFormat::detect`]) and the parser only sees decoded text with
//! special tokens spelled out. The parsing itself is [`crate::chat_stream`]'s incremental
//! machine, fed token ids ([`crate::PromptFormat::parse_reply`] for a whole reply,
//! [`crate::PromptFormat::output_parser`] streamed). There is no public whole-text parse: text
//! cannot tell a marker's added token from the same marker spelled in ordinary tokens (a JSON
//! answer holding `"<|im_end|>"`), so a parse of decoded text ended such an answer there.
//!
//! - [`OutputFormat::Qwen3`]: `<think>…</think>` reasoning (the opening tag may be absent: the
//!   prompt can end inside the think block), then the answer, with tool calls as
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (the format Qwen3's template
//!   declares to the model; the template renders history calls the same way).
//! - [`OutputFormat::Harmony`] (gpt-oss): messages `<|channel|>C<|message|>BODY` ended by
//!   `<|end|>`, `<|return|>` or `<|call|>`, each after an optional `<|start|>assistant` header.
//!   `analysis` bodies are reasoning, `final` is the answer, and a message whose header names a
//!   recipient `to=functions.NAME` (before or after the channel) is a tool call whose body is the
//!   JSON arguments.
//! - [`OutputFormat::DeepSeek`] (DeepSeek V3/R1): R1's `…</think>` reasoning (the prompt opens
//!   the think block), then the answer, then tool calls, each `<｜tool▁call▁begin｜>function`
//!   `<｜tool▁sep｜>NAME` plus a fenced `json` block and `<｜tool▁call▁end｜>`, inside
//!   `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>` (the form its template renders history calls
//!   in); `<｜end▁of▁sentence｜>` ends the turn.
//! - [`OutputFormat::KimiK2`]: `<think>…</think>` reasoning (Kimi K2 Thinking), then the answer,
//!   with tool calls in `<|tool_calls_section_begin|>…<|tool_calls_section_end|>` as
//!   `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`;
//!   `<|im_end|>` ends the turn.
//! - [`OutputFormat::Plain`]: everything is the answer.
//!
//! A completion cut off by the token limit parses as far as it goes: an unclosed think block or
//! message still yields its text. Within a call's JSON a marker inside a string is text.

use serde::Serialize;

use crate::chat_stream::OutputEvent;
use crate::pyjson::{self, PyValue};

/// A chat format's output conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// No reasoning or tool-call markup.
    Plain,
    /// Qwen3: `<think>` reasoning and `<tool_call>` JSON.
    Qwen3,
    /// OpenAI harmony (gpt-oss): channels and `<|call|>` tool calls.
    Harmony,
    /// DeepSeek V3/R1: `</think>` reasoning and `<｜tool▁call▁begin｜>` tool calls.
    #[serde(rename = "deepseek")]
    DeepSeek,
    /// Kimi K2: `<think>` reasoning and `<|tool_calls_section_begin|>` tool calls.
    #[serde(rename = "kimi_k2")]
    KimiK2,
}

/// A tool call found in a completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParsedToolCall {
    /// The function name.
    pub name: String,
    /// The arguments as JSON text, as the model wrote them (Qwen3: re-serialised from the
    /// parsed object, Python-style).
    pub arguments: String,
}

/// A completion split into its parts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ParsedOutput {
    /// Reasoning text (`None` when the completion has none).
    pub reasoning: Option<String>,
    /// The answer text.
    pub content: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ParsedOutput {
    /// A reply's events collected: the texts of each channel concatenated, the calls in order.
    pub fn from_events(events: impl IntoIterator<Item = OutputEvent>) -> Self {
        let mut out = Self::default();
        for e in events {
            match e {
                OutputEvent::Reasoning(t) => {
                    out.reasoning.get_or_insert_with(String::new).push_str(&t);
                }
                OutputEvent::Content(t) => out.content.push_str(&t),
                OutputEvent::ToolCall(c) => {
                    out.tool_calls.push(ParsedToolCall { name: c.name, arguments: c.arguments });
                }
            }
        }
        out
    }
}

impl OutputFormat {
    /// The format of a checkpoint from its chat template's text: harmony markers, or Qwen3's
    /// `<tool_call>` / `<think>` conventions.
    pub fn detect(template_source: &str) -> Self {
        // Before Qwen3's test: R1's and Kimi K2 Thinking's templates spell `<think>` too.
        if template_source.contains("<|channel|>") {
            Self::Harmony
        } else if template_source.contains("<｜tool▁calls▁begin｜>")
            || template_source.contains("<｜Assistant｜>")
        {
            Self::DeepSeek
        } else if template_source.contains("<|tool_calls_section_begin|>") {
            Self::KimiK2
        } else if template_source.contains("<tool_call>") || template_source.contains("<think>") {
            Self::Qwen3
        } else {
            Self::Plain
        }
    }

    /// The format's name, as it is serialized (`qwen3`, `harmony`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Qwen3 => "qwen3",
            Self::Harmony => "harmony",
            Self::DeepSeek => "deepseek",
            Self::KimiK2 => "kimi_k2",
        }
    }

    /// Splits a whole reply's `text` (decoded with special tokens spelled out) as the
    /// incremental parser does ([`TextMachine`] fed once): `reasoning_open`, the prompt opened
    /// the think block; `tools`, the request declared tools (else call markup is content).
    /// Tests only: every marker spelled in the text counts, so replies are parsed on ids.
    #[cfg(test)]
    pub(crate) fn parse(self, text: &str, reasoning_open: bool, tools: bool) -> ParsedOutput {
        let mut m = crate::chat_stream::TextMachine::new(self, reasoning_open).with_tools(tools);
        let mut events = m.push_text(text);
        events.extend(m.finish());
        ParsedOutput::from_events(events)
    }
}

/// The markers of a format whose tool calls sit in a section after the answer.
#[derive(Debug)]
pub(crate) struct Sections {
    /// Text after any of these is not part of the turn.
    pub(crate) ends: &'static [&'static str],
    pub(crate) section_begin: &'static str,
    pub(crate) section_end: &'static str,
    pub(crate) call_begin: &'static str,
    pub(crate) call_end: &'static str,
    /// Splits a call body into (name, arguments).
    pub(crate) call: fn(&str) -> Option<(String, String)>,
}

pub(crate) const DEEPSEEK: Sections = Sections {
    ends: &["<｜end▁of▁sentence｜>"],
    section_begin: "<｜tool▁calls▁begin｜>",
    section_end: "<｜tool▁calls▁end｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    call_end: "<｜tool▁call▁end｜>",
    call: deepseek_call,
};

pub(crate) const KIMI_K2: Sections = Sections {
    ends: &["<|im_end|>", "[EOS]"],
    section_begin: "<|tool_calls_section_begin|>",
    section_end: "<|tool_calls_section_end|>",
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
    call: kimi_call,
};

/// `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` (DeepSeek V3/R1).
fn deepseek_call(body: &str) -> Option<(String, String)> {
    let (_, rest) = body.split_once("<｜tool▁sep｜>")?;
    let (name, args) = rest.split_once('\n').unwrap_or((rest, ""));
    let args = args.trim();
    let args = args.strip_prefix("```json").unwrap_or(args);
    let args = args.strip_suffix("```").unwrap_or(args).trim();
    Some((name.trim().to_owned(), if args.is_empty() { "{}".into() } else { args.to_owned() }))
}

/// `functions.NAME:INDEX<|tool_call_argument_begin|>ARGS` (Kimi K2).
fn kimi_call(body: &str) -> Option<(String, String)> {
    let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
    let id = id.trim();
    let name = id.strip_prefix("functions.").unwrap_or(id);
    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
    Some((name.to_owned(), args.trim().to_owned()))
}

/// One `{"name": …, "arguments": …}` object.
pub(crate) fn qwen3_call(body: &str) -> Option<ParsedToolCall> {
    let PyValue::Dict(entries) = PyValue::parse(body.trim())? else { return None };
    let field = |key: &str| entries.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let PyValue::Str(name) = field("name")? else { return None };
    let arguments = match field("arguments") {
        Some(PyValue::Str(s)) => s.clone(),
        Some(v) => pyjson::dumps(v),
        None => "{}".to_owned(),
    };
    Some(ParsedToolCall { name: name.clone(), arguments })
}

#[cfg(test)]
mod tests {
    use super::{OutputFormat, ParsedOutput, ParsedToolCall};

    /// A whole reply to a request that declared tools; `open`: the prompt opened the think block.
    fn parse(format: OutputFormat, open: bool, text: &str) -> ParsedOutput {
        format.parse(text, open, true)
    }

    fn call(name: &str, arguments: &str) -> ParsedToolCall {
        ParsedToolCall { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn qwen3_reasoning_answer_and_tool_calls() {
        let out = parse(
            OutputFormat::Qwen3,
            false,
            "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n\
             {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n\
             </tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n\
             </tool_call><|im_end|>",
        );
        assert_eq!(out.reasoning.as_deref(), Some("The user wants weather."));
        assert_eq!(out.content, "Let me check.");
        assert_eq!(
            out.tool_calls,
            [
                call("get_weather", r#"{"city": "Zürich", "days": 2}"#),
                call("search", r#"{"query": "x"}"#)
            ]
        );
    }

    #[test]
    fn qwen3_prompt_opened_think_and_cut_off_outputs() {
        // The prompt ended with `<think>\n`: the completion holds only the closing tag.
        let out = parse(OutputFormat::Qwen3, true, "Two plus two.\n</think>\n\nIt is 4.<|im_end|>");
        assert_eq!(out.reasoning.as_deref(), Some("Two plus two."));
        assert_eq!(out.content, "It is 4.");
        let cut = parse(OutputFormat::Qwen3, false, "<think>\nStill thinking about");
        assert_eq!(cut.reasoning.as_deref(), Some("Still thinking about"));
        assert_eq!(cut.content, "");
        let plain = parse(OutputFormat::Qwen3, false, "No reasoning here.<|im_end|>");
        assert_eq!((plain.reasoning, plain.content.as_str()), (None, "No reasoning here."));
        // A malformed call stays in the answer rather than vanishing.
        let bad = parse(OutputFormat::Qwen3, false, "<tool_call>\nnot json\n</tool_call>");
        assert!(bad.tool_calls.is_empty() && bad.content.contains("not json"), "{bad:?}");
    }

    #[test]
    fn harmony_channels_and_calls() {
        let out = parse(OutputFormat::Harmony, false,
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>\
             commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        );
        assert_eq!(out.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(out.tool_calls, [call("get_weather", r#"{"city": "Paris"}"#)]);
        assert_eq!(out.content, "");
        // The recipient may also stand before the channel, as the template renders history.
        let out = parse(
            OutputFormat::Harmony,
            false,
            " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"q\"}<|call|>",
        );
        assert_eq!(out.tool_calls, [call("search", r#"{"query": "q"}"#)]);
        let out = parse(
            OutputFormat::Harmony,
            false,
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final\
             <|message|>Paris.<|return|>",
        );
        assert_eq!((out.reasoning.as_deref(), out.content.as_str()), (Some("Easy."), "Paris."));
        let cut = parse(OutputFormat::Harmony, false, "<|channel|>final<|message|>Par");
        assert_eq!(cut.content, "Par");
    }

    #[test]
    fn format_is_detected_from_the_template() {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let qwen = std::fs::read_to_string(fixtures.join("qwen3_moe/tiny-a/tokenizer_config.json"));
        let harmony = std::fs::read_to_string(fixtures.join("gpt_oss/tiny-a/chat_template.jinja"));
        assert_eq!(OutputFormat::detect(&qwen.unwrap_or_default()), OutputFormat::Qwen3);
        assert_eq!(OutputFormat::detect(&harmony.unwrap_or_default()), OutputFormat::Harmony);
        assert_eq!(OutputFormat::detect("{{ messages }}"), OutputFormat::Plain);
        assert_eq!(
            OutputFormat::detect("{{'<｜Assistant｜><think>\\n'}}"),
            OutputFormat::DeepSeek,
            "R1's template spells <think> but is not Qwen3's"
        );
        assert_eq!(
            OutputFormat::detect("<think></think><|tool_calls_section_begin|>"),
            OutputFormat::KimiK2
        );
    }

    #[test]
    fn deepseek_r1_reasoning_answer_and_tool_calls() {
        // R1's prompt ends with `<｜Assistant｜><think>\n`: the completion closes the block.
        let out = parse(OutputFormat::DeepSeek, true,
            "The user wants weather.\n</think>\n\nLet me check.<｜tool▁calls▁begin｜>\
             <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zürich\"}\n```\
             <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n\
             {\"query\": \"x\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        );
        assert_eq!(out.reasoning.as_deref(), Some("The user wants weather."));
        assert_eq!(out.content, "Let me check.");
        assert_eq!(
            out.tool_calls,
            [call("get_weather", r#"{"city": "Zürich"}"#), call("search", r#"{"query": "x"}"#)]
        );
        let plain = parse(
            OutputFormat::DeepSeek,
            true,
            "Short.\n</think>\n\nIt is 4.<｜end▁of▁sentence｜>x",
        );
        assert_eq!(
            (plain.reasoning.as_deref(), plain.content.as_str()),
            (Some("Short."), "It is 4.")
        );
    }

    #[test]
    fn kimi_k2_reasoning_answer_and_sectioned_tool_calls() {
        let out = parse(OutputFormat::KimiK2, false,
            "<think>Need the weather.</think>Checking.<|tool_calls_section_begin|>\
             <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}\
             <|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>\
             {\"query\": \"x\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
        );
        assert_eq!(out.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(out.content, "Checking.");
        assert_eq!(
            out.tool_calls,
            [call("get_weather", r#"{"city": "Zürich"}"#), call("search", r#"{"query": "x"}"#)]
        );
        let cut = parse(OutputFormat::KimiK2, false, "<think>Still thinking");
        assert_eq!((cut.reasoning.as_deref(), cut.content.as_str()), (Some("Still thinking"), ""));
    }
}
