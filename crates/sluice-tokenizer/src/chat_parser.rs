//! The incremental parser of one chat reply, whichever format the checkpoint's chat uses: Kimi
//! K3's XTML grammar on token ids ([`K3OutputParser`]), or a text format of [`OutputFormat`]
//! on decoded text ([`TextOutputParser`]). [`crate::PromptFormat::output_parser`] picks it; the
//! server only sees [`OutputEvent`]s.

use crate::any::{AnyStreamDecoder, AnyTokenizer};
use crate::chat_stream::{OutputEvent, TextMachine};
use crate::k3_output::K3OutputParser;
use crate::output::OutputFormat;

/// A reply in a text chat format, fed token ids: a marker that is an added token counts only
/// as its id, never as text spelling it.
#[derive(Debug)]
pub struct TextOutputParser<'t> {
    decoder: AnyStreamDecoder<'t>,
    /// The stop ids: they end the reply and are not text (a harmony `<|call|>` that stops
    /// generation completes its call at [`Self::finish`]).
    stop_ids: Vec<u32>,
    machine: TextMachine,
    /// The format's markers that are added tokens, by id: they count only as these ids.
    marker_ids: Vec<(u32, &'static str)>,
    reasoning_tokens: usize,
}

impl<'t> TextOutputParser<'t> {
    /// A parser for `format` over `tok`'s ids; `reasoning_open`: the prompt opened the think
    /// block.
    pub fn new(
        tok: &'t AnyTokenizer,
        format: OutputFormat,
        stop_ids: &[u32],
        reasoning_open: bool,
    ) -> Self {
        Self::with(tok, tok.stream_decoder(), format, stop_ids, reasoning_open)
    }

    /// [`Self::new`] reading ids through `decoder` (over a borrowed or shared `tok`).
    pub(crate) fn with(
        tok: &AnyTokenizer,
        decoder: AnyStreamDecoder<'t>,
        format: OutputFormat,
        stop_ids: &[u32],
        reasoning_open: bool,
    ) -> Self {
        let machine = TextMachine::new(format, reasoning_open);
        let marker_ids: Vec<(u32, &'static str)> =
            machine.markers().iter().filter_map(|&m| Some((tok.added_id(m)?, m))).collect();
        let machine = machine.with_token_markers(|m| marker_ids.iter().any(|&(_, t)| t == m));
        Self { decoder, stop_ids: stop_ids.to_vec(), machine, marker_ids, reasoning_tokens: 0 }
    }

    /// Whether tool-call markup is parsed as calls (the default); `false` when the request
    /// declared no tools, so the markup stays content.
    pub fn with_tools(mut self, tools: bool) -> Self {
        self.machine = self.machine.with_tools(tools);
        self
    }

    /// Feeds one generated token; returns the events it completed.
    pub fn push(&mut self, id: u32) -> Vec<OutputEvent> {
        if self.stop_ids.contains(&id) {
            return Vec::new();
        }
        if self.machine.in_reasoning() {
            self.reasoning_tokens += 1;
        }
        if let Some(&(_, marker)) = self.marker_ids.iter().find(|&&(m, _)| m == id) {
            let rest = self.decoder.finish();
            let mut out = self.machine.push_text(&rest);
            for e in self.machine.push_marker(marker) {
                crate::chat_stream::push_event(&mut out, e);
            }
            return out;
        }
        let text = self.decoder.push(id);
        self.machine.push_text(&text)
    }

    /// Ends the reply.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        let rest = self.decoder.finish();
        let mut out = self.machine.push_text(&rest);
        for e in self.machine.finish() {
            crate::chat_stream::push_event(&mut out, e);
        }
        out
    }
}

/// One reply's parser.
#[derive(Debug)]
pub enum ChatOutputParser<'t> {
    /// Kimi K3's XTML grammar, on ids.
    Xtml(Box<K3OutputParser<'t>>),
    /// A text format.
    Text(Box<TextOutputParser<'t>>),
}

impl ChatOutputParser<'_> {
    /// Feeds one generated token; returns the events it completed.
    pub fn push(&mut self, id: u32) -> Vec<OutputEvent> {
        match self {
            Self::Xtml(p) => p.push(id),
            Self::Text(p) => p.push(id),
        }
    }

    /// Ends the reply: releases held text and a call whose end the stop token took.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        match self {
            Self::Xtml(p) => p.finish(),
            Self::Text(p) => p.finish(),
        }
    }

    /// Tokens generated as reasoning.
    pub fn reasoning_tokens(&self) -> usize {
        match self {
            Self::Xtml(p) => p.reasoning_tokens(),
            Self::Text(p) => p.reasoning_tokens,
        }
    }

    /// Tool calls parsed so far.
    pub fn tool_calls(&self) -> usize {
        match self {
            Self::Xtml(p) => p.tool_calls(),
            Self::Text(p) => p.machine.tool_calls(),
        }
    }

    /// Parses a whole reply (tests, tools): every event of `ids`, then of the end.
    pub fn parse_all(&mut self, ids: &[u32]) -> Vec<OutputEvent> {
        let mut out = Vec::new();
        for e in ids.iter().flat_map(|&id| self.push(id)).collect::<Vec<_>>() {
            crate::chat_stream::push_event(&mut out, e);
        }
        for e in self.finish() {
            crate::chat_stream::push_event(&mut out, e);
        }
        out
    }
}
