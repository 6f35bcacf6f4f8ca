//! Kimi K3 chat prompts in "XTML" (K3.md §4.2): types, and rendering to ids or to text.
//!
//! An XTML element is `<|open|>TAG attr="v"…<|sep|>BODY<|close|>TAG<|sep|>`; each message ends
//! with `<|end_of_msg|>`, which is also the stop token. Only those four markers are special
//! tokens. [`render_k3`] inserts them **by id** and encodes all other text (tag names,
//! attributes, message content) with [`Tokenizer::encode_ordinary`], one call per maximal run of
//! text between markers, which is how the reference tokenizes a rendered prompt. A user who types
//! `<|open|>` therefore gets ordinary tokens, never a structural marker.
//!
//! The rendering is a port of the `Kimi-K3.jinja` chat template that llama.cpp ships (module
//! `xtml`); `tools/gen_chat_goldens.py` renders that template with jinja2 for the goldens the
//! tests compare against.

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::xtml;

/// The four structural special tokens of XTML (the discriminant indexes [`Marker::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    /// `<|open|>`: starts an opening tag.
    Open = 0,
    /// `<|close|>`: starts a closing tag.
    Close = 1,
    /// `<|sep|>`: ends a tag.
    Sep = 2,
    /// `<|end_of_msg|>`: ends a message; the stop token.
    EndOfMsg = 3,
}

impl Marker {
    /// All markers.
    pub const ALL: [Marker; 4] = [Marker::Open, Marker::Close, Marker::Sep, Marker::EndOfMsg];

    /// The token's spelling in `tokenizer_config.json`.
    pub fn spelling(self) -> &'static str {
        match self {
            Marker::Open => "<|open|>",
            Marker::Close => "<|close|>",
            Marker::Sep => "<|sep|>",
            Marker::EndOfMsg => "<|end_of_msg|>",
        }
    }

    /// The token id of this marker in `tokenizer`.
    pub fn id(self, tokenizer: &Tokenizer) -> Result<u32> {
        tokenizer
            .special_id(self.spelling())
            .ok_or_else(|| Error::MissingSpecial(self.spelling().to_owned()))
    }
}

/// The id generation stops at: `<|end_of_msg|>` (K3's `eos_token_id`).
pub fn k3_stop_id(tokenizer: &Tokenizer) -> Result<u32> {
    Marker::EndOfMsg.id(tokenizer)
}

/// One piece of a rendered prompt: a marker (a special id) or text (ordinary tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A structural special token.
    Marker(Marker),
    /// Text between markers; never empty, never adjacent to another `Text`.
    Text(String),
}

/// Who sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the operator.
    System,
    /// The user.
    #[default]
    User,
    /// The model (history turns).
    Assistant,
    /// A tool result.
    Tool,
}

/// A tool call made by the assistant in a history turn.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id that tool results refer to (`tool_call_id`).
    #[serde(default)]
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments as JSON text, as in the OpenAI API. A JSON object is rendered as one
    /// `argument` element per key, in document order; `null` or blank text as no arguments;
    /// anything else as a raw `json` element (the template's string branch).
    #[serde(default)]
    pub arguments: String,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The sender.
    pub role: Role,
    /// The text (`null` in JSON reads as empty).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// Assistant reasoning from an earlier turn (rendered in the think channel when thinking).
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Assistant tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// For a user/system/assistant message: an optional `name` attribute; for a tool result:
    /// the tool's name when it cannot be taken from the matching call.
    #[serde(default)]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with only a role and text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), ..Self::default() }
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// Options of one rendering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatOptions {
    /// Thinking mode (default true): history turns keep their think channel, the prompt ends
    /// with `<|open|>think<|sep|>`. When false, the prompt ends with `<|open|>response<|sep|>`
    /// and no thinking-effort message is written.
    pub thinking: bool,
    /// Whether the request set `thinking` (a Jinja template is given `enable_thinking` and
    /// `thinking` only then, and otherwise follows its own default, as transformers'
    /// `apply_chat_template` does without those keyword arguments; K3's renderer uses
    /// `thinking` either way). Default false.
    pub thinking_explicit: bool,
    /// Thinking effort: `low`, `high` or `max` (the default when `None`). Checked only when
    /// thinking; anything else is [`Error::UnsupportedEffort`] (the template rejects `medium`
    /// although its preamble lists it).
    pub effort: Option<String>,
    /// Tool declarations (the OpenAI `tools` array), written first as a
    /// `message role="system" type="tool-declare"` with deep-sorted compact JSON. Omitted when
    /// `None` or empty.
    pub tools: Option<serde_json::Value>,
    /// `tool_choice`: `"required"` or `"none"` add a `tool-choice` system message at the end.
    pub tool_choice: Option<String>,
    /// `response_format`: `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    /// {"schema": …}}` add a `response-format` system message at the end.
    pub response_format: Option<serde_json::Value>,
    /// Whether to open the assistant turn the model completes (default true).
    pub add_generation_prompt: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            thinking: true,
            thinking_explicit: false,
            effort: None,
            tools: None,
            tool_choice: None,
            response_format: None,
            add_generation_prompt: true,
        }
    }
}

/// Renders a conversation to segments (markers and text).
pub fn render_k3_segments(messages: &[ChatMessage], options: &ChatOptions) -> Result<Vec<Segment>> {
    xtml::render(messages, options)
}

/// Renders a conversation to token ids: markers by id, all other text ordinary.
pub fn render_k3(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    options: &ChatOptions,
) -> Result<Vec<u32>> {
    let mut marker_ids = [0u32; 4];
    for (slot, marker) in marker_ids.iter_mut().zip(Marker::ALL) {
        *slot = marker.id(tokenizer)?;
    }
    let mut out = Vec::new();
    for segment in xtml::render(messages, options)? {
        match segment {
            Segment::Marker(m) => out.push(marker_ids[m as usize]),
            Segment::Text(text) => tokenizer.encode_ordinary_into(&text, &mut out),
        }
    }
    Ok(out)
}

/// Renders a conversation to text with the markers spelled out: the string the reference
/// template produces. Tokenizing this text is ambiguous (user text may spell a marker); use
/// [`render_k3`] for ids.
pub fn render_k3_text(messages: &[ChatMessage], options: &ChatOptions) -> Result<String> {
    Ok(segments_to_text(&xtml::render(messages, options)?))
}

/// Concatenates segments with the markers spelled out.
pub fn segments_to_text(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Marker(m) => out.push_str(m.spelling()),
            Segment::Text(t) => out.push_str(t),
        }
    }
    out
}
