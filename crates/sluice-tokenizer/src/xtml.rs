//! The XTML renderer: a port of the `Kimi-K3.jinja` chat template (llama.cpp
//! `models/templates/Kimi-K3.jinja`, as vendored by llama-cpp-python 0.3.36), macro by macro.
//!
//! Output order, as in the template: the tool declaration (if any tools), the thinking-effort
//! system message (if thinking), the messages, a `tool-choice` message, a `response-format`
//! message, and the generation prompt. Differences from the template, all outside what a chat
//! request can express here: no image placeholders (text content only), no `system` messages
//! carrying `tools` (lazy-loaded tool sets), and no `thinking_effort=None` (an absent effort means
//! the default `max`).

use crate::chat::{ChatMessage, ChatOptions, Marker, Role, Segment, ToolCall};
use crate::error::{Error, Result};
use crate::pretokenize::python_isspace;
use crate::pyjson::{self, PyValue};

/// Efforts the template accepts (`thinking_effort not in ['low', 'high', 'max']` raises).
const EFFORTS: [&str; 3] = ["low", "high", "max"];

const EFFORT_PREAMBLE: &str = "`thinking_effort` guides on how much to think in your thinking \
channel (not including the response channel), supported values include `low`, `medium`, `high`, \
and `max`.\nNow the system is invoked with `thinking_effort=";

const TOOLS_HEADER: &str =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";

const TOOL_CHOICE_REQUIRED: &str =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";

const TOOL_CHOICE_NONE: &str = "The system is invoked with `tool_choice=none`.\nYou MUST NOT call \
any tools in the next message.";

const JSON_OBJECT: &str = "The system is invoked with `response_format=json_object`.\nYour \
response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";

const JSON_SCHEMA: &str = "The system is invoked with `response_format=json_schema`.\nYour \
response must be raw JSON data without markdown code blocks (```json) or any additional \
formatting.\nThe JSON data must match the following schema:\n```json\n";

/// Jinja's `trim` filter: Python `str.strip()`.
fn python_strip(s: &str) -> &str {
    s.trim_matches(python_isspace)
}

/// Builds the segment list, merging adjacent text.
#[derive(Default)]
struct Writer {
    segments: Vec<Segment>,
}

impl Writer {
    fn marker(&mut self, marker: Marker) {
        self.segments.push(Segment::Marker(marker));
    }

    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.segments.last_mut() {
            Some(Segment::Text(last)) => last.push_str(text),
            _ => self.segments.push(Segment::Text(text.to_owned())),
        }
    }

    /// Macro `open_tag(tag, attrs)`; attribute values go through `escape_attr`.
    fn open_tag(&mut self, tag: &str, attrs: &[(&str, &str)]) {
        self.marker(Marker::Open);
        self.text(tag);
        for (key, value) in attrs {
            // escape_attr: replace('&', '&amp;') then replace('"', '&quot;').
            let escaped = value.replace('&', "&amp;").replace('"', "&quot;");
            self.text(&format!(" {key}=\"{escaped}\""));
        }
        self.marker(Marker::Sep);
    }

    /// Macro `close_tag(tag)`.
    fn close_tag(&mut self, tag: &str) {
        self.marker(Marker::Close);
        self.text(tag);
        self.marker(Marker::Sep);
    }

    /// A whole message: open tag, body, close tag, `<|end_of_msg|>`.
    fn message(&mut self, attrs: &[(&str, &str)], body: impl FnOnce(&mut Self)) {
        self.open_tag("message", attrs);
        body(self);
        self.close_tag("message");
        self.marker(Marker::EndOfMsg);
    }

    /// Macro `internal_system_message(type, body)`.
    fn internal_system_message(&mut self, kind: &str, body: &str) {
        self.message(&[("role", "system"), ("type", kind)], |w| w.text(python_strip(body)));
    }
}

/// Template state carried across messages (`namespace(tool_calls, tool_index)`).
struct State<'a> {
    tool_calls: &'a [ToolCall],
    tool_index: usize,
}

/// Renders a conversation as the template does (see the module docs).
pub(crate) fn render(messages: &[ChatMessage], options: &ChatOptions) -> Result<Vec<Segment>> {
    let effort = options.effort.as_deref().unwrap_or("max");
    if options.thinking && !EFFORTS.contains(&effort) {
        return Err(Error::UnsupportedEffort(effort.to_owned()));
    }
    let mut w = Writer::default();
    if let Some(tools) = options.tools.as_ref().map(PyValue::from).filter(PyValue::truthy) {
        let mut body = String::from(TOOLS_HEADER);
        pyjson::write_sorted_compact(&tools, &mut body);
        body.push_str("\n```");
        w.message(&[("role", "system"), ("type", "tool-declare")], |w| w.text(&body));
    }
    if options.thinking {
        w.internal_system_message("thinking-effort", &format!("{EFFORT_PREAMBLE}{effort}`."));
    }
    let mut state = State { tool_calls: &[], tool_index: 0 };
    for (i, message) in messages.iter().enumerate() {
        let name = message.name.as_deref().filter(|n| !n.is_empty());
        match message.role {
            Role::User | Role::System => {
                let role = if message.role == Role::User { "user" } else { "system" };
                let mut attrs = vec![("role", role)];
                attrs.extend(name.map(|n| ("name", n)));
                w.message(&attrs, |w| w.text(&message.content));
            }
            Role::Assistant => {
                state.tool_calls = &message.tool_calls;
                state.tool_index = 0;
                let mut attrs = vec![("role", "assistant")];
                attrs.extend(name.map(|n| ("name", n)));
                w.message(&attrs, |w| render_assistant(w, message, options.thinking));
            }
            Role::Tool if i == 0 || messages[i - 1].role != Role::Tool => {
                let run_len = messages[i..].iter().take_while(|m| m.role == Role::Tool).count();
                render_tool_run(&mut w, &messages[i..i + run_len], i, &mut state)?;
            }
            // Later members of a run of tool messages were rendered with its first member.
            Role::Tool => {}
        }
    }
    match options.tool_choice.as_deref() {
        Some("required") => w.internal_system_message("tool-choice", TOOL_CHOICE_REQUIRED),
        Some("none") => w.internal_system_message("tool-choice", TOOL_CHOICE_NONE),
        _ => {}
    }
    render_response_format(&mut w, options.response_format.as_ref());
    if options.add_generation_prompt {
        w.open_tag("message", &[("role", "assistant")]);
        w.open_tag(if options.thinking { "think" } else { "response" }, &[]);
    }
    Ok(w.segments)
}

/// Macro `render_assistant`.
fn render_assistant(w: &mut Writer, message: &ChatMessage, thinking: bool) {
    if thinking {
        w.open_tag("think", &[]);
        let reasoning = message.reasoning_content.as_deref().unwrap_or_default();
        if !python_strip(reasoning).is_empty() {
            w.text(reasoning);
        }
        w.close_tag("think");
    }
    w.open_tag("response", &[]);
    w.text(&message.content);
    w.close_tag("response");
    if message.tool_calls.is_empty() {
        return;
    }
    w.open_tag("tools", &[]);
    for (k, call) in message.tool_calls.iter().enumerate() {
        let index = (k + 1).to_string();
        w.open_tag("call", &[("tool", &call.name), ("index", &index)]);
        match PyValue::parse(&call.arguments) {
            Some(PyValue::Dict(arguments)) => {
                for (key, value) in &arguments {
                    w.open_tag("argument", &[("key", key), ("type", xtml_type(value))]);
                    match value {
                        PyValue::Str(s) => w.text(s),
                        other => w.text(&pyjson::dumps(other)),
                    }
                    w.close_tag("argument");
                }
            }
            Some(PyValue::Null) => {}
            // Not a JSON object: the template's string branch, a raw `json` element.
            _ if !python_strip(&call.arguments).is_empty() => {
                w.open_tag("json", &[("type", "object")]);
                w.text(&call.arguments);
                w.close_tag("json");
            }
            _ => {}
        }
        w.close_tag("call");
    }
    w.close_tag("tools");
}

/// Macro `xtml_type`: the `type` attribute of an `argument` element.
fn xtml_type(value: &PyValue) -> &'static str {
    match value {
        PyValue::Bool(_) => "boolean",
        PyValue::Null => "null",
        PyValue::Int(_) | PyValue::Float(_) => "number",
        PyValue::Str(_) => "string",
        PyValue::Dict(_) => "object",
        PyValue::List(_) => "array",
    }
}

/// A run of consecutive tool messages starting at message `first`. When every message answers
/// a call of the last assistant turn by id, results are written in the order of the calls and
/// named after them; otherwise in message order, named by the message or by call position.
fn render_tool_run(
    w: &mut Writer,
    run: &[ChatMessage],
    first: usize,
    state: &mut State<'_>,
) -> Result<()> {
    let calls = state.tool_calls;
    let answers = |m: &ChatMessage, call: &ToolCall| {
        m.tool_call_id.is_some() && call.id.is_some() && m.tool_call_id == call.id
    };
    let resolved = run.iter().all(|m| calls.iter().any(|c| answers(m, c)));
    if !resolved {
        for (k, message) in run.iter().enumerate() {
            render_tool_message(w, message, first + k, None, state)?;
        }
        return Ok(());
    }
    let mut emitted: Vec<&str> = Vec::new();
    for call in calls {
        let Some(id) = call.id.as_deref() else { continue };
        if emitted.contains(&id) {
            continue;
        }
        emitted.push(id);
        for (k, message) in run.iter().enumerate().filter(|(_, m)| answers(m, call)) {
            render_tool_message(w, message, first + k, Some(&call.name), state)?;
        }
    }
    Ok(())
}

/// Macro `render_tool_message`.
fn render_tool_message(
    w: &mut Writer,
    message: &ChatMessage,
    position: usize,
    resolved_name: Option<&str>,
    state: &mut State<'_>,
) -> Result<()> {
    state.tool_index += 1;
    let by_position = || state.tool_calls.get(state.tool_index - 1).map(|c| c.name.as_str());
    let name = resolved_name
        .or(message.name.as_deref())
        .or_else(by_position)
        .ok_or(Error::UnresolvedToolName { message: position })?;
    let index = state.tool_index.to_string();
    w.message(&[("role", "tool"), ("tool", name), ("index", &index)], |w| {
        w.text(&message.content);
    });
    Ok(())
}

/// The `response_format` handling at the end of the template.
fn render_response_format(w: &mut Writer, response_format: Option<&serde_json::Value>) {
    let Some(format) = response_format.map(PyValue::from) else { return };
    let get = |value: &PyValue, key: &str| match value {
        PyValue::Dict(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()),
        _ => None,
    };
    let kind = match &format {
        PyValue::Dict(_) => get(&format, "type"),
        other => Some(other.clone()),
    };
    match kind {
        Some(PyValue::Str(kind)) if kind == "json_object" => {
            w.internal_system_message("response-format", JSON_OBJECT);
        }
        Some(PyValue::Str(kind)) if kind == "json_schema" => {
            let schema = match get(&format, "json_schema").filter(|v| *v != PyValue::Null) {
                Some(wrapper) => get(&wrapper, "schema")
                    .or_else(|| get(&wrapper, "json_schema"))
                    .unwrap_or(wrapper),
                None => PyValue::Null,
            };
            let mut body = String::from(JSON_SCHEMA);
            pyjson::write_sorted_compact(&schema, &mut body);
            body.push_str("\n```");
            w.internal_system_message("response-format", &body);
        }
        _ => {}
    }
}
