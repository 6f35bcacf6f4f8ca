//! Incremental output parsing for the chat formats of [`OutputFormat`]: a reply is split into
//! reasoning deltas, content deltas and tool calls **as it is generated**, so a server can
//! stream it. [`TextMachine`] works on decoded text (special tokens spelled out) fed in any
//! chunking; [`TextOutputParser`] feeds it token ids. Streaming and whole-reply parsing in the
//! server are this same code, so the concatenated deltas always equal the collected reply.
//!
//! A whole reply ([`crate::PromptFormat::parse_reply`]) is this machine fed once, so every path —
//! streamed SSE deltas, a collected reply, `sluice run --chat --json` — splits a reply the same
//! way. A reply whose prompt opened the think block (R1, Qwen3 thinking templates) starts in the
//! reasoning, so a think block cut off by the token limit is reasoning; once the answer has begun,
//! `<think>` and `</think>` are its text (a code block or a JSON string in the answer may spell
//! them); trailing newlines of a cut-off think block are dropped. Text that could be the start of
//! a marker (`<tool_c…`) and trailing whitespace of the answer are held back until the next text
//! shows what they are. Tool calls are released once their closing marker arrives (or at the end
//! of generation, if they parse then).
//!
//! Fed token ids ([`crate::TextOutputParser`]), a marker that is an added token of the
//! tokenizer counts only when it arrives as that token; its spelling in text (several ordinary
//! tokens, as a grammar writes `"<|im_end|>"` inside a JSON string) is text, so the split
//! between answer, calls and end of turn follows the ids where the ids tell it.
//!
//! A call's body is JSON text (Qwen3's `{"name": …, "arguments": …}`, the arguments of the other
//! formats, whose name and fence before them hold no quote), and a marker counts there only
//! outside a JSON string: an argument value may spell `</tool_call>`, `<|tool_call_end|>`,
//! `<|call|>` or an end of turn, which would otherwise cut the call short. A string still open at
//! the end of generation means the body was not JSON: the call is then read again with markers
//! counted everywhere, as a model that wrote a stray quote meant it.

use crate::output::{qwen3_call, OutputFormat, Sections, DEEPSEEK, KIMI_K2};

/// A tool call parsed from a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatToolCall {
    /// Position among this reply's calls (0-based, the OpenAI `index`).
    pub index: usize,
    /// The index the model wrote, when its format has one and it was a number (K3's XTML).
    pub xtml_index: Option<u64>,
    /// Function name.
    pub name: String,
    /// Arguments as JSON object text.
    pub arguments: String,
}

/// One piece of parsed output, in generation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    /// Reasoning (think channel, harmony analysis) text.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A complete tool call.
    ToolCall(ChatToolCall),
}

const QWEN3_MARKERS: &[&str] =
    &["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>"];
const HARMONY_MARKERS: &[&str] =
    &["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"];
const HARMONY_ENDS: &[&str] = &["<|end|>", "<|return|>", "<|call|>"];

/// Where in the reply the machine is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet (held in `buf`): a `<think>` may still open reasoning.
    Start,
    Reasoning,
    Content,
    /// Inside `<tool_call>` (Qwen3); the body is in `buf`.
    Call,
    /// Inside a tool-call section, between calls.
    Section,
    /// Inside one call of a section; the body is in `buf`.
    SectionCall,
    /// A harmony message header, in `buf`.
    Header,
    /// A harmony message body: reasoning, answer, or a call to the named function (in `buf`).
    Body(Body),
    /// The turn ended: the rest is not part of it.
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call(String),
}

/// Text released into one channel, trimmed as a whole reply's parse trims it: leading
/// newlines dropped, trailing whitespace (or only newlines) held until more text follows.
#[derive(Debug, Default)]
struct Emit {
    /// Trim at all (harmony does not).
    trim: bool,
    /// Hold any trailing whitespace, not only newlines.
    all_whitespace: bool,
    started: bool,
    held: String,
}

impl Emit {
    fn new(trim: bool, all_whitespace: bool) -> Self {
        Self { trim, all_whitespace, ..Self::default() }
    }

    /// The text to release now for `text`.
    fn push(&mut self, text: &str) -> String {
        if !self.trim {
            return text.to_owned();
        }
        let mut t = text;
        if !self.started {
            t = t.trim_start_matches('\n');
            if t.is_empty() {
                return String::new();
            }
            self.started = true;
        }
        let keep = if self.all_whitespace { t.trim_end() } else { t.trim_end_matches('\n') };
        if keep.is_empty() {
            self.held.push_str(t);
            return String::new();
        }
        let mut out = std::mem::take(&mut self.held);
        out.push_str(keep);
        self.held.push_str(&t[keep.len()..]);
        out
    }
}

/// The incremental parser of one reply in a text chat format.
#[derive(Debug)]
pub struct TextMachine {
    format: OutputFormat,
    markers: &'static [&'static str],
    /// The markers looked for in text: all of them, less those that arrive only as their token
    /// ([`Self::with_token_markers`]).
    spelled: Vec<&'static str>,
    sections: Option<&'static Sections>,
    /// Received text not yet scanned: a possible marker prefix.
    pending: String,
    state: State,
    buf: String,
    reasoning: Emit,
    content: Emit,
    calls: usize,
    /// Tool-call markup is parsed as calls (else it stays content).
    tools: bool,
    /// Where the call body read so far stands in its JSON text.
    json: JsonLex,
    /// Markers count inside strings too (a call re-read at the end because a string never
    /// closed).
    lenient: bool,
    out: Vec<OutputEvent>,
}

/// A JSON lexer reduced to what finding markers needs: whether the text so far ends inside a
/// string, and whether its last character escapes the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct JsonLex {
    in_string: bool,
    escaped: bool,
}

impl JsonLex {
    fn step(&mut self, c: char) {
        if self.escaped {
            self.escaped = false;
        } else if self.in_string {
            match c {
                '\\' => self.escaped = true,
                '"' => self.in_string = false,
                _ => {}
            }
        } else if c == '"' {
            self.in_string = true;
        }
    }

    fn feed(&mut self, text: &str) {
        text.chars().for_each(|c| self.step(c));
    }
}

impl TextMachine {
    /// A machine for a reply in `format`; `reasoning_open`: the prompt opened the think block.
    pub fn new(format: OutputFormat, reasoning_open: bool) -> Self {
        let (markers, sections): (&'static [&'static str], _) = match format {
            OutputFormat::Plain => (&[], None),
            OutputFormat::Qwen3 => (QWEN3_MARKERS, None),
            OutputFormat::Harmony => (HARMONY_MARKERS, None),
            OutputFormat::DeepSeek => (section_markers(&DEEPSEEK), Some(&DEEPSEEK)),
            OutputFormat::KimiK2 => (section_markers(&KIMI_K2), Some(&KIMI_K2)),
        };
        let trim = !matches!(format, OutputFormat::Plain | OutputFormat::Harmony);
        let state = match format {
            OutputFormat::Harmony => State::Header,
            OutputFormat::Plain => State::Content,
            _ if reasoning_open => State::Reasoning,
            _ => State::Start,
        };
        Self {
            format,
            markers,
            spelled: markers.to_vec(),
            sections,
            pending: String::new(),
            state,
            buf: String::new(),
            reasoning: Emit::new(trim, false),
            content: Emit::new(trim, true),
            calls: 0,
            tools: true,
            json: JsonLex::default(),
            lenient: false,
            out: Vec::new(),
        }
    }

    /// Whether tool-call markup is parsed as calls (the default). Without declared tools a
    /// reply's `<tool_call>`, call section or harmony message to `functions.NAME` is not a
    /// call: the markup stays content (a harmony message keeps its channel's meaning).
    pub fn with_tools(mut self, tools: bool) -> Self {
        self.tools = tools;
        self
    }

    /// The markers for which `is_token` holds arrive only as their token
    /// ([`Self::push_marker`]): their spelling in text is text (a JSON answer's string may
    /// spell `<|im_end|>`). The others are still found in text (a tokenizer that spells
    /// `<tool_call>` as ordinary tokens).
    pub fn with_token_markers(mut self, is_token: impl Fn(&str) -> bool) -> Self {
        self.spelled = self.markers.iter().copied().filter(|m| !is_token(m)).collect();
        self
    }

    /// The markers of this format, as [`Self::push_marker`] takes them.
    pub fn markers(&self) -> &'static [&'static str] {
        self.markers
    }

    /// A marker that arrived as its token: text held back as a possible marker start is text,
    /// and the marker counts wherever it stands (a grammar never puts one inside a string).
    pub fn push_marker(&mut self, marker: &'static str) -> Vec<OutputEvent> {
        let held = std::mem::take(&mut self.pending);
        self.text(&held);
        self.marker(marker);
        std::mem::take(&mut self.out)
    }

    /// Whether text now would be reasoning (for counting reasoning tokens).
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Reasoning | State::Body(Body::Reasoning))
    }

    /// Tool calls parsed so far.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Feeds decoded text; returns the events it completed.
    pub fn push_text(&mut self, text: &str) -> Vec<OutputEvent> {
        self.pending.push_str(text);
        loop {
            match self.next_marker() {
                Some((i, marker)) => {
                    let before = self.pending[..i].to_owned();
                    self.pending.drain(..i + marker.len());
                    self.text(&before);
                    self.marker(marker);
                }
                None => {
                    // Inside a call's JSON string no marker can start: nothing is held back.
                    let held = if self.in_call() && self.json_at_end().in_string {
                        0
                    } else {
                        partial_marker_len(&self.pending, &self.spelled)
                    };
                    let text: String = self.pending.drain(..self.pending.len() - held).collect();
                    self.text(&text);
                    break;
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    /// Whether the machine is reading a call's body as JSON text.
    fn in_call(&self) -> bool {
        !self.lenient
            && matches!(self.state, State::Call | State::SectionCall | State::Body(Body::Call(_)))
    }

    /// The call body's JSON state after the pending text.
    fn json_at_end(&self) -> JsonLex {
        let mut json = self.json;
        json.feed(&self.pending);
        json
    }

    /// The first marker in the pending text that counts where it stands (the longest, where
    /// several start there): anywhere, or in a call's body only outside JSON strings.
    fn next_marker(&self) -> Option<(usize, &'static str)> {
        let at = |i: usize| {
            let rest = &self.pending[i..];
            self.spelled.iter().filter(|m| rest.starts_with(**m)).max_by_key(|m| m.len()).copied()
        };
        if !self.in_call() {
            let first = self.spelled.iter().filter_map(|m| self.pending.find(m)).min()?;
            return at(first).map(|m| (first, m));
        }
        let mut json = self.json;
        for (i, c) in self.pending.char_indices() {
            if !json.in_string {
                if let Some(m) = at(i) {
                    return Some((i, m));
                }
            }
            json.step(c);
        }
        None
    }

    /// Ends the reply: releases held text; completes a call whose end marker never came (the
    /// stop token, which ends it, is not text) when it parses.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        let rest = std::mem::take(&mut self.pending);
        self.text(&rest);
        if self.in_call() && self.json.in_string {
            // The body was not JSON: read it again with markers counted everywhere.
            let body = std::mem::take(&mut self.buf);
            self.json = JsonLex::default();
            self.lenient = true;
            let mut out = std::mem::take(&mut self.out);
            for e in self.push_text(&body) {
                push_event(&mut out, e);
            }
            self.out = out;
            let rest = std::mem::take(&mut self.pending);
            self.text(&rest);
        }
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start => {
                let buf = std::mem::take(&mut self.buf);
                self.emit_content(&buf);
            }
            State::Call => self.qwen3_call_done(),
            State::SectionCall => self.section_call_done(),
            State::Body(Body::Call(name)) => self.harmony_call_done(name),
            State::Header => {
                // A header without a body, or stray text: text with no header is the answer.
                let buf = std::mem::take(&mut self.buf);
                if !buf.contains("<|channel|>") && !buf.contains("<|start|>") {
                    self.emit_content(&buf);
                }
            }
            _ => {}
        }
        std::mem::take(&mut self.out)
    }

    fn emit_reasoning(&mut self, text: &str) {
        let t = self.reasoning.push(text);
        if !t.is_empty() {
            push_event(&mut self.out, OutputEvent::Reasoning(t));
        }
    }

    fn emit_content(&mut self, text: &str) {
        let t = self.content.push(text);
        if !t.is_empty() {
            push_event(&mut self.out, OutputEvent::Content(t));
        }
    }

    fn emit_call(&mut self, name: String, arguments: String) {
        let index = self.calls;
        self.calls += 1;
        self.out.push(OutputEvent::ToolCall(ChatToolCall {
            index,
            xtml_index: None,
            name,
            arguments,
        }));
    }

    /// Text between markers, by state.
    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match &self.state {
            State::Start => {
                self.buf.push_str(text);
                if !self.buf.trim().is_empty() {
                    self.state = State::Content;
                    let buf = std::mem::take(&mut self.buf);
                    self.emit_content(&buf);
                }
            }
            State::Reasoning | State::Body(Body::Reasoning) => self.emit_reasoning(text),
            State::Content | State::Body(Body::Content) => self.emit_content(text),
            State::Call | State::SectionCall | State::Body(Body::Call(_)) => {
                self.buf.push_str(text);
                self.json.feed(text);
            }
            State::Header => self.buf.push_str(text),
            // Whitespace between calls, and anything after the turn, carry nothing.
            State::Section | State::Done => {}
        }
    }

    /// A marker, by format and state; one that means nothing where it stands is text.
    fn marker(&mut self, m: &'static str) {
        if self.format == OutputFormat::Harmony {
            return self.harmony_marker(m);
        }
        let s = self.sections;
        let ends: &[&str] = s.map_or(&["<|im_end|>", "<|endoftext|>"], |s| s.ends);
        if ends.contains(&m) {
            // Text after the end is not part of the turn; an open call ends with it.
            match std::mem::replace(&mut self.state, State::Done) {
                State::Call => self.qwen3_call_done(),
                State::SectionCall => self.section_call_done(),
                _ => {}
            }
            return;
        }
        match (&self.state, m) {
            (State::Start, "<think>") => {
                self.buf.clear();
                self.state = State::Reasoning;
            }
            (State::Start | State::Reasoning, "</think>") => {
                self.buf.clear();
                self.state = State::Content;
            }
            (State::Start, _) => {
                // Anything else starts the answer.
                self.state = State::Content;
                let buf = std::mem::take(&mut self.buf);
                self.emit_content(&buf);
                self.marker(m);
            }
            (State::Content, "<tool_call>") if s.is_none() && self.tools => {
                self.buf.clear();
                self.json = JsonLex::default();
                self.state = State::Call;
            }
            (State::Call, "</tool_call>") => {
                self.qwen3_call_done();
                self.state = State::Content;
            }
            (State::Content, b) if self.tools && s.is_some_and(|s| s.section_begin == b) => {
                self.state = State::Section;
            }
            (State::Section, b) if s.is_some_and(|s| s.call_begin == b) => {
                self.buf.clear();
                self.json = JsonLex::default();
                self.state = State::SectionCall;
            }
            (State::SectionCall, e) if s.is_some_and(|s| s.call_end == e) => {
                self.section_call_done();
                self.state = State::Section;
            }
            (State::Section | State::SectionCall, e) if s.is_some_and(|s| s.section_end == e) => {
                if self.state == State::SectionCall {
                    self.section_call_done();
                }
                self.state = State::Done;
            }
            _ => self.text(m),
        }
    }

    /// A harmony marker: headers, bodies, and the three ends of a message.
    fn harmony_marker(&mut self, m: &'static str) {
        match (&self.state, m) {
            (State::Header, "<|message|>") => {
                let header = std::mem::take(&mut self.buf);
                let (channel, recipient) = harmony_header(&header);
                let call =
                    recipient.and_then(|r| r.strip_prefix("functions.")).filter(|_| self.tools);
                self.json = JsonLex::default();
                self.state = match call {
                    Some(name) => State::Body(Body::Call(name.to_owned())),
                    None if channel == "analysis" => State::Body(Body::Reasoning),
                    None => State::Body(Body::Content),
                };
            }
            (State::Body(_), end) if HARMONY_ENDS.contains(&end) => {
                if let State::Body(Body::Call(name)) =
                    std::mem::replace(&mut self.state, State::Header)
                {
                    self.harmony_call_done(name);
                }
                self.buf.clear();
            }
            _ => self.text(m),
        }
    }

    fn qwen3_call_done(&mut self) {
        let body = std::mem::take(&mut self.buf);
        match qwen3_call(&body) {
            Some(c) => self.emit_call(c.name, c.arguments),
            // Not a valid call: the text stays in the answer, as the model wrote it.
            None => {
                let closed = if self.state == State::Done { "" } else { "</tool_call>" };
                self.emit_content(&format!("<tool_call>{body}{closed}"));
            }
        }
    }

    fn section_call_done(&mut self) {
        let body = std::mem::take(&mut self.buf);
        if let Some((name, args)) = self.sections.and_then(|s| (s.call)(&body)) {
            self.emit_call(name, args);
        }
    }

    fn harmony_call_done(&mut self, name: String) {
        let body = std::mem::take(&mut self.buf);
        self.emit_call(name, body.trim().to_owned());
    }
}

/// Every marker of a sectioned format (think tags, section and call markers, ends).
fn section_markers(s: &'static Sections) -> &'static [&'static str] {
    if std::ptr::eq(s, &DEEPSEEK) {
        &[
            "<think>",
            "</think>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜end▁of▁sentence｜>",
        ]
    } else {
        &[
            "<think>",
            "</think>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_end|>",
            "<|im_end|>",
            "[EOS]",
        ]
    }
}

/// A harmony header's channel and recipient (`to=…`), as a whole reply's parse reads them.
fn harmony_header(header: &str) -> (&str, Option<&str>) {
    let channel = header
        .split_once("<|channel|>")
        .map(|(_, c)| c.split(|ch: char| ch.is_whitespace() || ch == '<').next().unwrap_or(""))
        .unwrap_or("");
    let recipient = header
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))
        .map(|r| r.split("<|").next().unwrap_or(r));
    (channel, recipient)
}

/// Length of the longest suffix of `text` that is a proper prefix of a marker (held back:
/// the next text may complete the marker).
fn partial_marker_len(text: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let mut k = longest.saturating_sub(1).min(text.len());
    while k > 0 {
        let at = text.len() - k;
        if text.is_char_boundary(at) {
            let tail = &text[at..];
            if markers.iter().any(|m| m.len() > k && m.starts_with(tail)) {
                return k;
            }
        }
        k -= 1;
    }
    0
}

/// Appends an event, merging it into the previous one when both are text of the same channel.
pub(crate) fn push_event(out: &mut Vec<OutputEvent>, e: OutputEvent) {
    match (out.last_mut(), e) {
        (Some(OutputEvent::Reasoning(a)), OutputEvent::Reasoning(b))
        | (Some(OutputEvent::Content(a)), OutputEvent::Content(b)) => a.push_str(&b),
        (_, e) => out.push(e),
    }
}

#[cfg(test)]
#[path = "chat_stream_tests.rs"]
mod tests;
