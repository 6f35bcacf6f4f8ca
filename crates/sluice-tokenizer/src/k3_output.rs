//! Kimi K3 assistant output, split into reasoning, content and tool calls (K3.md §4.3, as vLLM's
//! `kimi_k3` reasoning and tool parsers read it).
//!
//! The parser works on **token ids**: the four structural markers are special ids, so text the
//! model writes can never forge them, and a tag is recognised only as `<|open|>` or `<|close|>`,
//! ordinary tokens, `<|sep|>`. The grammar after the generation prefix is
//!
//! ```text
//! [thinking]  REASONING <|close|>think<|sep|> <|open|>response<|sep|>
//!             CONTENT <|close|>response<|sep|>
//!             [ <|open|>tools<|sep|> ( <|open|>call tool="N" index="I"<|sep|>
//!                 ( <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> )*
//!               <|close|>call<|sep|> )+ <|close|>tools<|sep|> ]
//!             <|close|>message<|sep|> <|end_of_msg|>
//! ```
//!
//! Streaming and whole-output parsing are the same code, so they always agree: text is released
//! per token at UTF-8 boundaries, and each tool call once its `<|close|>call<|sep|>` arrives.
//! Where vLLM's text-based parsers and this one could differ: a tag that is not part of the
//! grammar where it appears (e.g. `<|open|>foo<|sep|>` inside the content) is kept as literal text
//! with the markers spelled out; a response opener inside the reasoning ends the reasoning even
//! without `<|close|>think<|sep|>` (the text before it stays reasoning); an incomplete call at the
//! end of generation is dropped. Argument values of type `string` are raw text; other types are
//! parsed as JSON with a raw-string fallback; the arguments object is written as Python's
//! `json.dumps(args, ensure_ascii=False)`. Tool calls are parsed only when the request declared
//! tools; otherwise a tools channel is literal content.

use crate::chat::Marker;
use crate::chat_stream::push_event;
use crate::pyjson::{self, PyValue};
use crate::{StreamDecoder, TokRef, Tokenizer};

/// Longest tag (ordinary tokens between the opening marker and `<|sep|>`) recognised; longer ones
/// are literal text. Bounds the buffering a hostile or broken generation can cause.
const MAX_TAG_TOKENS: usize = 512;

pub use crate::chat_stream::{ChatToolCall as ParsedToolCall, OutputEvent};

/// Where in the grammar the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Reasoning,
    /// After `<|close|>think<|sep|>`, before the response opener.
    AfterThink,
    Content,
    /// After `<|close|>response<|sep|>` (or `<|close|>tools<|sep|>`).
    AfterResponse,
    Tools,
    Call,
    Argument,
    /// A raw `<|open|>json type="object"<|sep|>` arguments element.
    Json,
    /// After `<|close|>message<|sep|>`.
    Done,
}

/// A call being read.
#[derive(Debug, Default)]
struct CallBuf {
    name: String,
    xtml_index: Option<u64>,
    args: Vec<(String, PyValue)>,
    raw: Option<String>,
}

/// An argument being read.
#[derive(Debug, Default)]
struct ArgBuf {
    key: String,
    ty: String,
    value: String,
}

/// A tag being read: its opening marker and the ordinary tokens so far.
#[derive(Debug)]
struct PendingTag {
    open: bool,
    ids: Vec<u32>,
}

/// Incremental parser of one K3 reply.
#[derive(Debug)]
pub struct K3OutputParser<'t> {
    tok: TokRef<'t, Tokenizer>,
    markers: [u32; 4],
    tools: bool,
    channel: Channel,
    tag: Option<PendingTag>,
    decoder: StreamDecoder<'t>,
    call: CallBuf,
    arg: ArgBuf,
    calls: usize,
    reasoning_tokens: usize,
}

impl<'t> K3OutputParser<'t> {
    /// A parser for a reply generated after a thinking (`<|open|>think<|sep|>`) or non-thinking
    /// (`<|open|>response<|sep|>`) generation prefix; `tools`: whether the request declared tools.
    pub fn new(tok: &'t Tokenizer, thinking: bool, tools: bool) -> Result<Self, crate::Error> {
        Self::with(TokRef::Borrowed(tok), thinking, tools)
    }

    /// [`Self::new`] over a borrowed or shared tokenizer.
    pub fn with(
        tok: TokRef<'t, Tokenizer>,
        thinking: bool,
        tools: bool,
    ) -> Result<Self, crate::Error> {
        let markers = [
            Marker::Open.id(&tok)?,
            Marker::Close.id(&tok)?,
            Marker::Sep.id(&tok)?,
            Marker::EndOfMsg.id(&tok)?,
        ];
        Ok(Self {
            decoder: StreamDecoder::with(tok.clone()),
            tok,
            markers,
            tools,
            channel: if thinking { Channel::Reasoning } else { Channel::Content },
            tag: None,
            call: CallBuf::default(),
            arg: ArgBuf::default(),
            calls: 0,
            reasoning_tokens: 0,
        })
    }

    /// Tokens generated inside the think channel (its closing tag excluded).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// Tool calls parsed so far.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Feeds one generated token; returns the events it completed.
    pub fn push(&mut self, id: u32) -> Vec<OutputEvent> {
        let mut out = Vec::new();
        if self.channel == Channel::Reasoning {
            self.reasoning_tokens += 1;
        }
        let [open, close, sep, end_of_msg] = self.markers;
        if id == open || id == close {
            self.flush_tag(&mut out);
            self.flush_text(&mut out);
            self.tag = Some(PendingTag { open: id == open, ids: Vec::new() });
        } else if id == sep {
            match self.tag.take() {
                Some(tag) => self.finish_tag(&tag, &mut out),
                None => self.literal(Marker::Sep.spelling(), &mut out),
            }
        } else if id == end_of_msg {
            // The stop token ends the message; it is never text.
            self.flush_tag(&mut out);
            self.flush_text(&mut out);
        } else if let Some(tag) = self.tag.as_mut() {
            tag.ids.push(id);
            if tag.ids.len() > MAX_TAG_TOKENS {
                self.flush_tag(&mut out);
            }
        } else {
            let text = self.decoder.push(id).unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.into());
            self.text(&text, &mut out);
        }
        out
    }

    /// Ends the reply: releases buffered text; an incomplete tool call is dropped.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        let mut out = Vec::new();
        self.flush_tag(&mut out);
        self.flush_text(&mut out);
        out
    }

    /// Parses a whole reply.
    pub fn parse_all(&mut self, ids: &[u32]) -> Vec<OutputEvent> {
        let mut out = Vec::new();
        for &id in ids {
            for e in self.push(id) {
                push_event(&mut out, e);
            }
        }
        for e in self.finish() {
            push_event(&mut out, e);
        }
        out
    }

    /// Releases the decoder's incomplete UTF-8 tail (as U+FFFD) into the current channel.
    fn flush_text(&mut self, out: &mut Vec<OutputEvent>) {
        let rest =
            std::mem::replace(&mut self.decoder, StreamDecoder::with(self.tok.clone())).finish();
        self.text(&rest, out);
    }

    /// An unfinished tag becomes literal text.
    fn flush_tag(&mut self, out: &mut Vec<OutputEvent>) {
        if let Some(tag) = self.tag.take() {
            let text = self.tag_literal(&tag, false);
            self.literal(&text, out);
        }
    }

    fn tag_literal(&self, tag: &PendingTag, with_sep: bool) -> String {
        let m = if tag.open { Marker::Open } else { Marker::Close };
        let mut s = m.spelling().to_owned();
        s.push_str(&self.tok.decode_lossy(&tag.ids).unwrap_or_default());
        if with_sep {
            s.push_str(Marker::Sep.spelling());
        }
        s
    }

    /// Literal text (spelled markers, unrecognised tags) into the current channel.
    fn literal(&mut self, text: &str, out: &mut Vec<OutputEvent>) {
        self.flush_text(out);
        self.text(text, out);
    }

    /// Text into the current channel.
    fn text(&mut self, text: &str, out: &mut Vec<OutputEvent>) {
        if text.is_empty() {
            return;
        }
        match self.channel {
            Channel::Reasoning => push_event(out, OutputEvent::Reasoning(text.to_owned())),
            Channel::AfterThink | Channel::Content | Channel::AfterResponse | Channel::Done => {
                push_event(out, OutputEvent::Content(text.to_owned()));
            }
            Channel::Argument => self.arg.value.push_str(text),
            Channel::Json => self.call.raw.get_or_insert_with(String::new).push_str(text),
            // Whitespace between calls and arguments carries nothing.
            Channel::Tools | Channel::Call => {}
        }
    }

    /// A complete `<|open|>…<|sep|>` or `<|close|>…<|sep|>`: a transition, or literal text.
    fn finish_tag(&mut self, tag: &PendingTag, out: &mut Vec<OutputEvent>) {
        use Channel as C;
        let body = self.tok.decode_lossy(&tag.ids).unwrap_or_default();
        let Some((name, attrs)) = parse_tag(&body) else {
            let text = self.tag_literal(tag, true);
            return self.literal(&text, out);
        };
        let next = match (self.channel, tag.open, name.as_str()) {
            (C::Reasoning, false, "think") => {
                // The closing tag's own tokens (marker, name, sep) are not reasoning.
                self.reasoning_tokens = self.reasoning_tokens.saturating_sub(tag.ids.len() + 2);
                C::AfterThink
            }
            (C::Reasoning, true, "response") => {
                self.reasoning_tokens = self.reasoning_tokens.saturating_sub(tag.ids.len() + 2);
                C::Content
            }
            (C::AfterThink, true, "response") => C::Content,
            (C::Content, false, "response") => C::AfterResponse,
            (C::Content | C::AfterResponse, true, "tools") if self.tools => C::Tools,
            (C::Tools, false, "tools") => C::AfterResponse,
            (C::Tools, true, "call") => {
                self.call = CallBuf {
                    name: attr(&attrs, "tool").unwrap_or_default(),
                    xtml_index: attr(&attrs, "index").and_then(|v| v.trim().parse().ok()),
                    ..CallBuf::default()
                };
                C::Call
            }
            (C::Call, true, "argument") => {
                self.arg = ArgBuf {
                    key: attr(&attrs, "key").unwrap_or_default(),
                    ty: attr(&attrs, "type").unwrap_or_else(|| "string".into()),
                    value: String::new(),
                };
                C::Argument
            }
            (C::Argument, false, "argument") => {
                self.flush_text(out);
                let arg = std::mem::take(&mut self.arg);
                let value = typed_value(&arg.ty, arg.value);
                // Python dict semantics: a repeated key keeps its first position, last value.
                match self.call.args.iter_mut().find(|(k, _)| *k == arg.key) {
                    Some(slot) => slot.1 = value,
                    None => self.call.args.push((arg.key, value)),
                }
                C::Call
            }
            (C::Call, true, "json") => C::Json,
            (C::Json, false, "json") => C::Call,
            (C::Call, false, "call") => {
                let call = std::mem::take(&mut self.call);
                let arguments = match call.raw {
                    Some(raw) if call.args.is_empty() => raw,
                    _ => pyjson::dumps(&PyValue::Dict(call.args)),
                };
                let index = self.calls;
                self.calls += 1;
                out.push(OutputEvent::ToolCall(ParsedToolCall {
                    index,
                    xtml_index: call.xtml_index,
                    name: call.name,
                    arguments,
                }));
                C::Tools
            }
            (_, false, "message") => C::Done,
            _ => {
                let text = self.tag_literal(tag, true);
                return self.literal(&text, out);
            }
        };
        self.flush_text(out);
        self.channel = next;
    }
}

/// An argument value by its XTML `type`: `string` is raw text, anything else JSON (raw text when
/// it does not parse), as vLLM's parser does.
fn typed_value(ty: &str, raw: String) -> PyValue {
    if ty == "string" {
        return PyValue::Str(raw);
    }
    PyValue::parse(&raw).unwrap_or(PyValue::Str(raw))
}

/// Splits a tag body `name k="v" …` into its name and unescaped attributes; `None` when it is not
/// of that shape.
fn parse_tag(body: &str) -> Option<(String, Vec<(String, String)>)> {
    let (name, mut rest) = body.split_once(' ').unwrap_or((body, ""));
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    let mut attrs = Vec::new();
    loop {
        rest = rest.trim_start_matches(' ');
        if rest.is_empty() {
            return Some((name.to_owned(), attrs));
        }
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        // Encode escapes `&` then `"`; decode reverses in the opposite order.
        attrs.push((key.to_owned(), value.replace("&quot;", "\"").replace("&amp;", "&")));
        rest = after;
    }
}

fn attr(attrs: &[(String, String)], key: &str) -> Option<String> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

#[cfg(test)]
#[path = "k3_output_tests.rs"]
mod tests;
