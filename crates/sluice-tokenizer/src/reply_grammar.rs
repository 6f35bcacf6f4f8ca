//! The grammar of a whole constrained reply, one function per chat format, in `llguidance`'s
//! Lark dialect: the reasoning part when the reply may reason, then either the content holding
//! one JSON value or the format's tool-call markup with each call's arguments valid against its
//! tool's schema. Each grammar spells exactly what that format's reply parser
//! ([`crate::chat_stream`], [`crate::k3_output`]) reads, so a constrained reply parses as an
//! unconstrained one does: the JSON arrives as the content, the calls as tool calls.
//!
//! Markers that are added tokens are named by id (`<[151667]>`): the grammar engine indexes added
//! tokens apart from text, so free text can never hold one. A marker the tokenizer spells as
//! ordinary text (a tiny test tokenizer without `<tool_call>`) is a literal. Free text
//! (reasoning) also excludes the *spelled* markers of its format, since the text parsers read
//! decoded text and would take a spelled `</think>` for the marker.
//! A call's arguments are `%json`, whose strings may spell any marker (`{"s": "</tool_call>"}`):
//! the parsers read a call's body as JSON and count a marker only outside its strings.
//!
//! The end of a reply is the format's end-of-turn token ([`end_marker`]); the grammar stops
//! before it and the grammar engine allows only it once the grammar is complete. Harmony's tool
//! call spells its own end, `<|call|>`.

use serde_json::{json, Value};

use crate::any::AnyTokenizer;
use crate::output::OutputFormat;

/// What a reply is constrained to.
#[derive(Debug, Clone, Copy)]
pub enum ReplyConstraint<'a> {
    /// The content is one JSON value valid against this schema.
    Json(&'a Value),
    /// The reply is tool calls only, each to one of `tools` (name, parameters schema).
    Tools {
        /// Callable tools.
        tools: &'a [(String, Value)],
        /// More than one call allowed (formats whose call ends the turn allow one).
        parallel: bool,
    },
}

/// Whether and how a reply reasons before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// The prompt opened the reasoning: the reply reasons and then closes it.
    Open,
    /// The reply may open a reasoning block first (the model decides).
    Optional,
    /// No reasoning: the prompt closed it, or the request turned thinking off.
    Off,
}

/// Why no grammar can be written for a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The format has no markup for what was asked (tool calls in a plain format).
    #[error("the {format} chat format has no {what}")]
    Unsupported {
        /// The format's name.
        format: &'static str,
        /// What it lacks.
        what: &'static str,
    },
}

/// The spelling of the token that ends a reply in `format`.
pub fn end_marker(format: OutputFormat) -> Option<&'static str> {
    match format {
        OutputFormat::Qwen3 | OutputFormat::KimiK2 => Some("<|im_end|>"),
        OutputFormat::Harmony => Some("<|return|>"),
        OutputFormat::DeepSeek => Some("<｜end▁of▁sentence｜>"),
        OutputFormat::Plain => None,
    }
}

/// The grammar of a whole reply in a text chat `format` over `tok`'s vocabulary.
pub fn text_reply(
    format: OutputFormat,
    tok: &AnyTokenizer,
    c: ReplyConstraint<'_>,
    reasoning: Reasoning,
) -> Result<String, GrammarError> {
    let m = Markers(tok);
    match format {
        OutputFormat::Plain => plain(c),
        OutputFormat::Qwen3 => Ok(qwen3(&m, c, reasoning)),
        OutputFormat::Harmony => Ok(harmony(&m, c, reasoning)),
        OutputFormat::DeepSeek => Ok(deepseek(&m, c, reasoning)),
        OutputFormat::KimiK2 => Ok(kimi_k2(&m, c, reasoning)),
    }
}

/// Kimi K3's XTML: the think channel when the prompt opened it, then the response channel
/// holding the JSON, or an empty response followed by the tools channel with each call's
/// arguments as one raw `json` element. Its markers are K3's special tokens, named by spelling
/// (K3's replies are parsed on ids, so text can never spell one).
pub fn xtml_reply(c: ReplyConstraint<'_>, reasoning: Reasoning) -> String {
    // The think channel is free text up to its closing tag (text can never contain a marker).
    let mut g = String::new();
    let head = if reasoning == Reasoning::Off {
        ""
    } else {
        g.push_str("think: THINK_TEXT <|close|> \"think\" <|sep|> <|open|> \"response\" <|sep|>\n");
        g.push_str("THINK_TEXT: /(?s:.*)/\n");
        "think "
    };
    let tail = "<|close|> \"message\" <|sep|>";
    g.push_str(&answer(c, |i, name| {
        let open = format!("call tool=\"{}\" index=\"", attr(name));
        format!(
            "<|open|> {} INDEX \"\\\"\" <|sep|> <|open|> \"json type=\\\"object\\\"\" <|sep|> \
             args_{i} <|close|> \"json\" <|sep|> <|close|> \"call\" <|sep|>",
            lit(&open)
        )
    }));
    match c {
        ReplyConstraint::Json(_) => {
            g.push_str(&format!("start: {head}body <|close|> \"response\" <|sep|> {tail}\n"))
        }
        ReplyConstraint::Tools { parallel, .. } => {
            let calls = if parallel { "call+" } else { "call" };
            g.push_str(&format!(
                "start: {head}<|close|> \"response\" <|sep|> <|open|> \"tools\" <|sep|> {calls} \
                 <|close|> \"tools\" <|sep|> {tail}\nINDEX: /[0-9]{{1,3}}/\n"
            ));
        }
    }
    g
}

/// An XTML attribute value, escaped as the renderer escapes it (`&` first, then `"`).
fn attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

/// How a grammar names a format's markers in one tokenizer.
struct Markers<'t>(&'t AnyTokenizer);

impl Markers<'_> {
    /// `marker` as a grammar element: the added token by id, or the literal text.
    fn m(&self, marker: &str) -> String {
        match self.0.added_id(marker) {
            Some(id) => format!("<[{id}]>"),
            None => lit(marker),
        }
    }
}

/// `s` as a Lark string literal (JSON's escaping is a subset Lark reads).
fn lit(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `s` as a regex matching it literally: ASCII punctuation as `\xNN` (no escaping rules of
/// either Lark's `/…/` or the regex dialect to get wrong), other characters as themselves.
fn rx_lit(s: &str) -> String {
    s.chars()
        .map(
            |c| {
                if c.is_ascii_punctuation() {
                    format!("\\x{:02X}", u32::from(c))
                } else {
                    c.into()
                }
            },
        )
        .collect()
}

/// A free-text lexeme `name` that holds none of `markers` spelled out.
fn free_text(name: &str, markers: &[&str]) -> String {
    let any: Vec<String> = markers.iter().map(|m| rx_lit(m)).collect();
    format!("{name}: /(?s:.*)/ & ~/(?s:.*)(?:{})(?s:.*)/\n", any.join("|"))
}

/// `schema` with compact JSON (no free whitespace between tokens): a constrained reply is as
/// short as the schema allows, and a small model cannot wander into endless whitespace.
fn compact(schema: &Value) -> String {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
    }
    s.to_string()
}

/// `body: %json …` for a JSON reply, `call: call_0 | …` with each `args_i` for tool calls;
/// `call_i` is written by `each(i, name)`.
fn answer(c: ReplyConstraint<'_>, each: impl Fn(usize, &str) -> String) -> String {
    match c {
        ReplyConstraint::Json(schema) => format!("body: %json {}\n", compact(schema)),
        ReplyConstraint::Tools { tools, .. } => {
            let alts: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
            let mut g = format!("call: {}\n", alts.join(" | "));
            for (i, (name, params)) in tools.iter().enumerate() {
                g.push_str(&format!(
                    "call_{i}: {}\nargs_{i}: %json {}\n",
                    each(i, name),
                    compact(params)
                ));
            }
            g
        }
    }
}

/// Plain text: the content is the JSON; there is no tool-call markup.
fn plain(c: ReplyConstraint<'_>) -> Result<String, GrammarError> {
    match c {
        ReplyConstraint::Json(_) => Ok(format!("start: body\n{}", answer(c, |_, _| String::new()))),
        ReplyConstraint::Tools { .. } => {
            Err(GrammarError::Unsupported { format: "plain", what: "tool-call markup" })
        }
    }
}

/// The reasoning head of a format whose reasoning is `open … close`, with `markers` kept out of
/// its text: the rule `think` (empty when there is none) and its definitions.
fn think_head(m: &Markers<'_>, open: &str, close: &str, markers: &[&str], r: Reasoning) -> String {
    let text = free_text("THINK_TEXT", markers);
    match r {
        Reasoning::Off => String::new(),
        Reasoning::Open => format!("think: THINK_TEXT {}\n{text}", m.m(close)),
        Reasoning::Optional => format!("think: {} THINK_TEXT {}\n{text}", m.m(open), m.m(close)),
    }
}

/// The `start` rule: the head (optional when the model decides), leading newlines, the answer.
fn start(r: Reasoning, answer: &str) -> String {
    let head = match r {
        Reasoning::Off => "",
        Reasoning::Open => "think ",
        Reasoning::Optional => "think? ",
    };
    format!("start: {head}NL? {answer}\nNL: /\\n{{1,2}}/\n")
}

const QWEN3_MARKERS: &[&str] =
    &["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>"];

/// Qwen3: `<think>…</think>`, then the JSON, or `<tool_call>\n{"name": …, "arguments": …}\n
/// </tool_call>` per call (what its template declares and [`crate::output`] parses).
fn qwen3(m: &Markers<'_>, c: ReplyConstraint<'_>, r: Reasoning) -> String {
    let mut g = think_head(m, "<think>", "</think>", QWEN3_MARKERS, r);
    let (open, close) = (m.m("<tool_call>"), m.m("</tool_call>"));
    g.push_str(&answer(c, |i, name| {
        let head = format!("\n{{\"name\": {}, \"arguments\": ", Value::String(name.to_owned()));
        format!("{open} {} args_{i} \"}}\\n\" {close}", lit(&head))
    }));
    let body = match c {
        ReplyConstraint::Json(_) => "body",
        ReplyConstraint::Tools { parallel: true, .. } => "call (\"\\n\" call)*",
        ReplyConstraint::Tools { parallel: false, .. } => "call",
    };
    g.push_str(&start(r, body));
    g
}

const HARMONY_MARKERS: &[&str] =
    &["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"];

/// Harmony (gpt-oss): an `analysis` message, then a `final` message holding the JSON, or one
/// `commentary to=functions.NAME <|constrain|>json` message whose body is the arguments and
/// whose end, `<|call|>`, ends the turn (so one call per reply).
fn harmony(m: &Markers<'_>, c: ReplyConstraint<'_>, r: Reasoning) -> String {
    let (channel, message) = (m.m("<|channel|>"), m.m("<|message|>"));
    let mut g = String::new();
    let head = match r {
        Reasoning::Off => "",
        Reasoning::Open | Reasoning::Optional => {
            g.push_str(&format!(
                "analysis: {channel} \"analysis\" {message} THINK_TEXT {} {} \"assistant\"\n",
                m.m("<|end|>"),
                m.m("<|start|>")
            ));
            g.push_str(&free_text("THINK_TEXT", HARMONY_MARKERS));
            if r == Reasoning::Open {
                "analysis "
            } else {
                "analysis? "
            }
        }
    };
    let (constrain, call_end) = (m.m("<|constrain|>"), m.m("<|call|>"));
    g.push_str(&answer(c, |i, name| {
        let to = format!("commentary to=functions.{name} ");
        format!("{channel} {} {constrain} \"json\" {message} args_{i} {call_end}", lit(&to))
    }));
    let body = match c {
        ReplyConstraint::Json(_) => format!("{channel} \"final\" {message} body"),
        ReplyConstraint::Tools { .. } => "call".to_owned(),
    };
    g.push_str(&format!("start: {head}{body}\n"));
    g
}

const DEEPSEEK_MARKERS: &[&str] = &[
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜end▁of▁sentence｜>",
];

/// DeepSeek V3/R1: reasoning up to `</think>` (R1's prompt opens it), then the JSON, or the
/// call section `<｜tool▁calls▁begin｜>` with each call `<｜tool▁call▁begin｜>function
/// <｜tool▁sep｜>NAME` and its arguments in a fenced `json` block.
fn deepseek(m: &Markers<'_>, c: ReplyConstraint<'_>, r: Reasoning) -> String {
    let mut g = think_head(m, "<think>", "</think>", DEEPSEEK_MARKERS, r);
    let (begin, sep, end) =
        (m.m("<｜tool▁call▁begin｜>"), m.m("<｜tool▁sep｜>"), m.m("<｜tool▁call▁end｜>"));
    g.push_str(&answer(c, |i, name| {
        let fence = format!("{name}\n```json\n");
        format!("{begin} \"function\" {sep} {} args_{i} \"\\n```\" {end}", lit(&fence))
    }));
    let body = sections(m, c, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
    g.push_str(&start(r, &body));
    g
}

const KIMI_K2_MARKERS: &[&str] = &[
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|im_end|>",
    "[EOS]",
];

/// Kimi K2: `<think>…</think>` (K2 Thinking), then the JSON, or the call section
/// `<|tool_calls_section_begin|>` with each call `<|tool_call_begin|>functions.NAME:INDEX
/// <|tool_call_argument_begin|>ARGS<|tool_call_end|>`.
fn kimi_k2(m: &Markers<'_>, c: ReplyConstraint<'_>, r: Reasoning) -> String {
    let mut g = think_head(m, "<think>", "</think>", KIMI_K2_MARKERS, r);
    let (begin, args, end) =
        (m.m("<|tool_call_begin|>"), m.m("<|tool_call_argument_begin|>"), m.m("<|tool_call_end|>"));
    g.push_str(&answer(c, |i, name| {
        let id = format!("functions.{name}:");
        format!("{begin} {} INDEX {args} args_{i} {end}", lit(&id))
    }));
    g.push_str("INDEX: /[0-9]{1,3}/\n");
    let body = sections(m, c, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>");
    g.push_str(&start(r, &body));
    g
}

/// The answer of a sectioned format: the JSON body, or the calls inside the section markers.
fn sections(m: &Markers<'_>, c: ReplyConstraint<'_>, begin: &str, end: &str) -> String {
    match c {
        ReplyConstraint::Json(_) => "body".to_owned(),
        ReplyConstraint::Tools { parallel, .. } => {
            let calls = if parallel { "call (\"\\n\"? call)*" } else { "call" };
            format!("{} {calls} {}", m.m(begin), m.m(end))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_literals_escape_every_ascii_punctuation() {
        assert_eq!(rx_lit("</think>"), "\\x3Cthink\\x3E".replace("think", "\\x2Fthink"));
        assert_eq!(rx_lit("<｜a▁b｜>"), "\\x3C｜a▁b｜\\x3E");
        let t = free_text("T", &["<|end|>"]);
        assert_eq!(t, "T: /(?s:.*)/ & ~/(?s:.*)(?:\\x3C\\x7Cend\\x7C\\x3E)(?s:.*)/\n");
    }
}
