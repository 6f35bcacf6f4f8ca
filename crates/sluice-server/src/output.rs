//! Turning one job's generated ids into what the client sees: text for completions; reasoning,
//! content and tool calls for chat (through the checkpoint's chat format's incremental parser,
//! [`ChatOutputParser`]); stop strings applied to the visible text; and per-token
//! log-probabilities. Runs on the engine thread. A chat reply is parsed once, as it is
//! generated: [`Reply`] keeps what the parser released, for the follow-up check
//! ([`crate::follow_up`]) as well as the response.

use sluice_engine::logprob::token_logprobs;
use sluice_engine::stop::StopText;
use std::sync::{Arc, Mutex, PoisonError};

use sluice_tokenizer::{
    AnyStreamDecoder, ChatOutputParser, ChatToolCall as ParsedToolCall, OutputEvent, PromptFormat,
};

/// How a job's ids become output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// `/v1/completions`: plain text (the stop token is not text).
    Text,
    /// `/v1/chat/completions` and `/v1/messages`: the chat format's reply.
    Chat {
        /// The prompt opened the reasoning (think channel or block) the reply starts in.
        reasoning_open: bool,
        /// Parse tool calls.
        tools: bool,
    },
}

/// One token's log-probability record.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives: text, bytes, log-probability.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// New output from one or more tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Reasoning text.
    pub reasoning: String,
    /// Content text.
    pub content: String,
    /// Completed tool calls.
    pub tool_calls: Vec<ParsedToolCall>,
    /// Log-probabilities of the tokens this delta covers.
    pub logprobs: Vec<TokenLogprob>,
}

impl Delta {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty()
            && self.content.is_empty()
            && self.tool_calls.is_empty()
            && self.logprobs.is_empty()
    }

    /// Appends the log-probability record of `id` chosen from `logits`.
    pub fn add_logprobs(&mut self, fmt: &PromptFormat, logits: &[f32], id: u32, top_n: usize) {
        let lp = token_logprobs(logits, id, top_n);
        let piece = |id: u32| {
            let bytes = fmt.tokenizer().token_bytes(id).unwrap_or_default();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (token, bytes) = piece(id);
        let top = lp
            .top
            .into_iter()
            .map(|(t, l)| {
                let (s, b) = piece(t);
                (s, b, l)
            })
            .collect();
        self.logprobs.push(TokenLogprob { token, bytes, logprob: lp.logprob, top });
    }

    /// Adds `other` after this delta.
    pub fn extend(&mut self, other: Delta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.tool_calls.extend(other.tool_calls);
        self.logprobs.extend(other.logprobs);
    }
}

/// Per-job output state (holding a share of the tokenizer: see [`Reply`]).
pub enum Output {
    /// Completions.
    Text {
        /// Incremental UTF-8 decoding.
        decoder: AnyStreamDecoder<'static>,
        /// Stop strings over the text.
        stop: StopText,
        /// The stop tokens (not text).
        stop_ids: Vec<u32>,
    },
    /// Chat.
    Chat {
        /// The chat format's parser.
        parser: Box<ChatOutputParser<'static>>,
        /// Stop strings over the reasoning.
        stop_reasoning: StopText,
        /// Stop strings over the content.
        stop_content: StopText,
    },
}

impl Output {
    /// Output state for `kind` with stop strings `stop`.
    pub fn new(
        fmt: &PromptFormat,
        kind: &OutputKind,
        stop: &[String],
    ) -> Result<Self, sluice_tokenizer::PromptError> {
        Ok(match *kind {
            OutputKind::Text => Self::Text {
                decoder: fmt.shared_tokenizer().shared_stream_decoder(),
                stop: StopText::new(stop),
                stop_ids: fmt.stop_ids().to_vec(),
            },
            OutputKind::Chat { reasoning_open, tools } => Self::Chat {
                parser: Box::new(fmt.output_parser(reasoning_open, tools)?),
                stop_reasoning: StopText::new(stop),
                stop_content: StopText::new(stop),
            },
        })
    }

    /// A stop string matched: generation must end.
    pub fn stopped(&self) -> bool {
        match self {
            Self::Text { stop, .. } => stop.stopped(),
            Self::Chat { stop_reasoning, stop_content, .. } => {
                stop_reasoning.stopped() || stop_content.stopped()
            }
        }
    }

    /// The stop string that ended generation, if one did.
    pub fn stop_sequence(&self) -> Option<String> {
        match self {
            Self::Text { stop, .. } => stop.matched(),
            Self::Chat { stop_reasoning, stop_content, .. } => {
                stop_reasoning.matched().or(stop_content.matched())
            }
        }
        .map(str::to_owned)
    }

    /// Tool calls parsed.
    pub fn tool_calls(&self) -> usize {
        match self {
            Self::Text { .. } => 0,
            Self::Chat { parser, .. } => parser.tool_calls(),
        }
    }

    /// Tokens in the think channel.
    pub fn reasoning_tokens(&self) -> usize {
        match self {
            Self::Text { .. } => 0,
            Self::Chat { parser, .. } => parser.reasoning_tokens(),
        }
    }

    /// Output for one generated token.
    pub fn push(&mut self, id: u32) -> Delta {
        let mut d = Delta::default();
        if self.stopped() {
            return d;
        }
        match self {
            Self::Text { decoder, stop, stop_ids } => {
                if !stop_ids.contains(&id) {
                    let text = decoder.push(id);
                    d.content = stop.push(&text).text;
                }
            }
            Self::Chat { parser, .. } => {
                let events = parser.push(id);
                self.route(events, &mut d);
            }
        }
        d
    }

    /// Output held back at the end of generation.
    pub fn finish(&mut self) -> Delta {
        let mut d = Delta::default();
        match self {
            Self::Text { decoder, stop, .. } => {
                let rest = decoder.finish();
                d.content = stop.push(&rest).text;
                d.content.push_str(&stop.finish());
            }
            Self::Chat { parser, .. } => {
                let events = parser.finish();
                self.route(events, &mut d);
                if let Self::Chat { stop_reasoning, stop_content, .. } = self {
                    d.reasoning.push_str(&stop_reasoning.finish());
                    d.content.push_str(&stop_content.finish());
                }
            }
        }
        d
    }

    /// Parser events through the stop strings into `d`; nothing after a stop string.
    fn route(&mut self, events: Vec<OutputEvent>, d: &mut Delta) {
        let Self::Chat { stop_reasoning, stop_content, .. } = self else { return };
        for e in events {
            if stop_reasoning.stopped() || stop_content.stopped() {
                return;
            }
            match e {
                OutputEvent::Reasoning(t) => d.reasoning.push_str(&stop_reasoning.push(&t).text),
                OutputEvent::Content(t) => d.content.push_str(&stop_content.push(&t).text),
                OutputEvent::ToolCall(c) => d.tool_calls.push(c),
            }
        }
    }
}

/// One job's output, parsed once and shared: the engine's token callback pushes each token
/// through it (and streams the delta), and the follow-up check reads the whole reply from it
/// ([`crate::follow_up::ChatEcho::follow_up`]) instead of parsing the ids again.
pub struct Reply {
    out: Output,
    /// Every id pushed, in order.
    ids: Vec<u32>,
    /// Everything released so far (without log-probabilities).
    text: Delta,
    /// What [`Output::finish`] released, once it was called.
    last: Option<Delta>,
}

/// A [`Reply`] shared between the engine's token callback and the follow-up check.
pub type SharedReply = Arc<Mutex<Reply>>;

impl Reply {
    /// A reply read through `out`, shared.
    pub fn shared(out: Output) -> SharedReply {
        Arc::new(Mutex::new(Self { out, ids: Vec::new(), text: Delta::default(), last: None }))
    }

    /// Runs `f` on the shared reply.
    pub fn with<T>(reply: &SharedReply, f: impl FnOnce(&mut Self) -> T) -> T {
        f(&mut reply.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Output for one generated token ([`Output::push`]).
    pub fn push(&mut self, id: u32) -> Delta {
        let d = self.out.push(id);
        self.ids.push(id);
        self.text.extend(d.clone());
        d
    }

    /// The output held back at the end of generation ([`Output::finish`]); the same delta
    /// however often it is asked for.
    pub fn finish(&mut self) -> Delta {
        if let Some(last) = &self.last {
            return last.clone();
        }
        let last = self.out.finish();
        self.text.extend(last.clone());
        self.last = Some(last.clone());
        last
    }

    /// The whole reply, when `generated` are exactly the ids pushed (else `None`: what was
    /// parsed is not that reply).
    pub fn whole(&mut self, generated: &[u32]) -> Option<Delta> {
        if self.ids != generated {
            return None;
        }
        self.finish();
        Some(self.text.clone())
    }

    /// The output state (stop strings, counts).
    pub fn output(&self) -> &Output {
        &self.out
    }
}
