//! `POST /v1/messages`, the Anthropic Messages API: bodies parsed into the same chat messages
//! and options the OpenAI endpoint renders ([`ValidMessages`]), and the handler that queues them.
//! Responses and the SSE event sequence are in [`crate::anthropic_response`].
//!
//! Mapping. `system` (a string or text blocks) is the system message. A user turn's `text`
//! blocks are its content and each `tool_result` block becomes a tool message answering the
//! `tool_use` of the same id in the assistant turn just before; an assistant turn's `thinking`
//! blocks are its reasoning, `text` its content and `tool_use` blocks its tool calls. `tools`
//! (`name`, `description`, `input_schema`) are declared as functions. `thinking: {"type":
//! "enabled"}` (or `adaptive`) opens the think channel (the API's default is off); `tool_choice`
//! `any` and `tool` and `output_config.format` (a JSON schema) are enforced by constrained
//! decoding ([`crate::constrain`]).
//!
//! Refused with the API's error shape, naming the field: roles out of order (the first turn must
//! be the user's, turns alternate), unknown block types, a `tool_result` without a matching
//! `tool_use`, empty `messages`, a final assistant turn (prefill), unknown fields.

use crate::constrain::OutputConstraint;
use crate::error::ApiError;
use crate::fields::{type_name, Obj};
use crate::request::{Limits, MAX_STOPS, MAX_STOP_BYTES};
use serde_json::{json, Value};
use sluice_engine::Sampling;
use sluice_tokenizer::{ChatMessage, ChatOptions, Role, ToolCall};

/// A validated `POST /v1/messages`.
#[derive(Debug, Clone)]
pub struct ValidMessages {
    /// The conversation, system message first.
    pub messages: Vec<ChatMessage>,
    /// Rendering options (thinking, tools, `tool_choice`).
    pub options: ChatOptions,
    /// `max_tokens` (required by the API).
    pub max_tokens: usize,
    /// Temperature, top-k, top-p.
    pub sampling: Sampling,
    /// `stop_sequences`.
    pub stop: Vec<String>,
    /// Stream with SSE.
    pub stream: bool,
    /// Tools declared and `tool_choice` not `none`.
    pub parse_tools: bool,
    /// `tool_choice` `any` or `tool`, or `output_config.format`.
    pub constraint: Option<OutputConstraint>,
}

/// Parses a Messages body.
pub fn parse_messages(body: &Value, limits: &Limits) -> Result<ValidMessages, ApiError> {
    let mut o = Obj::new(body, "")?;
    match o.str("model")? {
        None => return Err(ApiError::invalid("model", "model: Field required")),
        Some(m) if m != limits.model_id => return Err(ApiError::ModelNotFound(m.to_owned())),
        Some(_) => {}
    }
    let cap = i64::try_from(limits.max_tokens).unwrap_or(i64::MAX).max(1);
    let Some(max_tokens) = o.int("max_tokens", 1, cap)? else {
        return Err(ApiError::invalid("max_tokens", "max_tokens: Field required"));
    };
    let temperature = o.num("temperature", 0.0, 1.0)?.unwrap_or(1.0);
    let top_p = o.num("top_p", 0.0, 1.0)?.unwrap_or(1.0);
    if top_p <= 0.0 {
        return Err(ApiError::invalid("top_p", "top_p must be above 0"));
    }
    let top_k = o.int("top_k", 0, i64::from(u32::MAX))?.unwrap_or(0);
    #[allow(clippy::cast_possible_truncation)]
    let sampling = Sampling {
        temperature: temperature as f32,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        top_p: top_p as f32,
        seed: fresh_seed(),
    };
    let stop = parse_stop_sequences(&mut o)?;
    let stream = o.bool("stream")?.unwrap_or(false);
    let thinking = parse_thinking(&mut o)?;
    let tools = parse_tools(&mut o)?;
    let (tool_choice, tool_constraint) = parse_tool_choice(&mut o, tools.as_ref())?;
    let (effort, json_constraint) = parse_output_config(&mut o)?;
    if tool_constraint.is_some() && json_constraint.is_some() {
        return Err(ApiError::invalid(
            "output_config.format",
            "output_config.format cannot be combined with tool_choice any or tool",
        ));
    }
    let constraint = tool_constraint.or(json_constraint);
    let mut messages = Vec::new();
    if let Some(system) = o.value("system") {
        let text = text_of(system, "system")?;
        messages.push(ChatMessage::new(Role::System, text));
    }
    let Some(list) = o.array("messages")? else {
        return Err(ApiError::invalid("messages", "messages: Field required"));
    };
    parse_turns(list, &mut messages)?;
    // Accepted and without effect (docs/SERVER.md lists them).
    o.ignore(&["metadata", "service_tier"]);
    o.finish()?;
    let parse_tools = tools.is_some() && tool_choice.as_deref() != Some("none");
    let options = ChatOptions {
        thinking,
        // The Messages API's thinking is off unless enabled: the request always says.
        thinking_explicit: true,
        effort: if thinking { effort } else { None },
        tools,
        tool_choice,
        response_format: None,
        add_generation_prompt: true,
    };
    Ok(ValidMessages {
        messages,
        options,
        max_tokens: usize::try_from(max_tokens).unwrap_or(usize::MAX),
        sampling,
        stop,
        stream,
        parse_tools,
        constraint,
    })
}

/// A fresh seed per request: the Messages API has no `seed`, so sampling is not reproducible.
fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    #[allow(clippy::cast_possible_truncation)]
    let t = nanos as u64;
    t
}

fn parse_stop_sequences(o: &mut Obj<'_>) -> Result<Vec<String>, ApiError> {
    let Some(list) = o.array("stop_sequences")? else { return Ok(Vec::new()) };
    if list.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop_sequences",
            format!("at most {MAX_STOPS} stop sequences"),
        ));
    }
    list.iter()
        .map(|s| match s {
            Value::String(s) if s.is_empty() => {
                Err(ApiError::invalid("stop_sequences", "stop sequences must not be empty"))
            }
            Value::String(s) if s.len() > MAX_STOP_BYTES => Err(ApiError::invalid(
                "stop_sequences",
                format!("stop sequences are at most {MAX_STOP_BYTES} bytes"),
            )),
            Value::String(s) => Ok(s.clone()),
            other => Err(ApiError::invalid(
                "stop_sequences",
                format!("stop_sequences must be strings, not {}", type_name(other)),
            )),
        })
        .collect()
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}` (K3 thinks
/// when its think channel is open) or `{"type": "disabled"}`; off when absent. The budget is
/// accepted and not enforced (the reply's `max_tokens` bounds reasoning and answer together).
fn parse_thinking(o: &mut Obj<'_>) -> Result<bool, ApiError> {
    let Some(mut t) = o.obj("thinking")? else { return Ok(false) };
    let on = match t.str("type")? {
        Some("enabled") => {
            t.int("budget_tokens", 1, i64::MAX)?;
            true
        }
        Some("adaptive") => true,
        Some("disabled") => false,
        other => {
            return Err(ApiError::invalid(
                t.param("type"),
                format!(
                    "thinking.type must be \"enabled\", \"adaptive\" or \"disabled\", got {other:?}"
                ),
            ))
        }
    };
    match t.str("display")? {
        None | Some("summarized") => {}
        Some(other) => {
            return Err(ApiError::unsupported(
                t.param("display"),
                format!("thinking.display {other:?} is not supported: sluice returns the thinking as written (\"summarized\")"),
            ))
        }
    }
    t.finish()?;
    Ok(on)
}

/// `output_config`: `effort` (K3's thinking effort: `low`, `high`, `max`) and `format`
/// (`{"type": "json_schema", "schema"}`: the text is JSON valid against the schema, enforced by
/// constrained decoding).
fn parse_output_config(
    o: &mut Obj<'_>,
) -> Result<(Option<String>, Option<OutputConstraint>), ApiError> {
    let Some(mut c) = o.obj("output_config")? else { return Ok((None, None)) };
    let effort = match c.str("effort")? {
        None => None,
        Some(e @ ("low" | "high" | "max")) => Some(e.to_owned()),
        Some(other) => {
            return Err(ApiError::unsupported(
                c.param("effort"),
                format!(
                "output_config.effort {other:?} is not supported by Kimi K3: use low, high or max"
            ),
            ))
        }
    };
    let constraint = match c.obj("format")? {
        None => None,
        Some(mut f) => {
            if f.str("type")? != Some("json_schema") {
                return Err(ApiError::invalid(
                    f.param("type"),
                    "output_config.format.type must be \"json_schema\"",
                ));
            }
            let schema = match f.value("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                Some(other) => {
                    return Err(ApiError::invalid(
                        f.param("schema"),
                        format!(
                            "output_config.format.schema must be an object, not {}",
                            type_name(other)
                        ),
                    ))
                }
                None => return Err(ApiError::invalid(f.param("schema"), "schema: Field required")),
            };
            f.finish()?;
            Some(OutputConstraint::Json { schema, param: "output_config.format" })
        }
    };
    c.finish()?;
    Ok((effort, constraint))
}

/// `tools`: client tools (`name`, `description`, `input_schema`), declared to the template in
/// the OpenAI function form it renders.
fn parse_tools(o: &mut Obj<'_>) -> Result<Option<Value>, ApiError> {
    let Some(list) = o.array("tools")? else { return Ok(None) };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let mut t = Obj::new(t, &format!("tools[{i}]"))?;
        if let Some(ty) = t.str("type")? {
            if ty != "custom" {
                return Err(ApiError::unsupported(
                    t.param("type"),
                    format!("tools of type {ty:?} (server tools) are not supported: declare client tools with name and input_schema"),
                ));
            }
        }
        let name = match t.str("name")? {
            Some(n) if !n.is_empty() => n,
            _ => return Err(ApiError::invalid(t.param("name"), "a tool name is required")),
        };
        let description = t.str("description")?;
        let Some(schema) = t.value("input_schema") else {
            return Err(ApiError::invalid(t.param("input_schema"), "input_schema is required"));
        };
        if !schema.is_object() {
            return Err(ApiError::invalid(
                t.param("input_schema"),
                format!("input_schema must be an object, not {}", type_name(schema)),
            ));
        }
        t.ignore(&["cache_control"]);
        t.finish()?;
        let mut f = json!({"name": name, "parameters": schema});
        if let Some(d) = description {
            f["description"] = json!(d);
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

/// `tool_choice`: `auto`, `none`, `any` (some tool must be called) or `tool` (this one).
fn parse_tool_choice(
    o: &mut Obj<'_>,
    tools: Option<&Value>,
) -> Result<(Option<String>, Option<OutputConstraint>), ApiError> {
    let Some(mut c) = o.obj("tool_choice")? else { return Ok((None, None)) };
    let kind = c.str("type")?;
    let name = c.str("name")?;
    let single = c.bool("disable_parallel_tool_use")?.unwrap_or(false);
    c.finish()?;
    let declared: Vec<(String, Value)> = tools
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            Some((f.get("name")?.as_str()?.to_owned(), f.get("parameters")?.clone()))
        })
        .collect();
    let only = match (kind, name) {
        (Some("auto"), None) => return Ok((Some("auto".into()), None)),
        (Some("none"), None) => return Ok((Some("none".into()), None)),
        (Some("any"), None) => None,
        (Some("tool"), Some(n)) => Some(n),
        (Some("tool"), None) => {
            return Err(ApiError::invalid("tool_choice.name", "tool_choice.name: Field required"))
        }
        (Some(k @ ("auto" | "none" | "any")), Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice.name",
                format!("tool_choice.name is only allowed with type \"tool\", not {k:?}"),
            ))
        }
        (other, _) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("tool_choice.type must be auto, any, tool or none, got {other:?}"),
            ))
        }
    };
    if declared.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice any or tool requires tools: declare the tools the model must call",
        ));
    }
    let tools: Vec<_> = match only {
        None => declared,
        Some(n) => declared.into_iter().filter(|(t, _)| t == n).collect(),
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice.name",
            format!(
                "tool_choice names {:?}, which is not among the declared tools",
                only.unwrap_or("")
            ),
        ));
    }
    let parallel = only.is_none() && !single;
    let c = OutputConstraint::Tools { tools, parallel, param: "tool_choice" };
    Ok((Some("required".into()), Some(c)))
}

/// A string, or an array of `text` blocks joined with newlines.
fn text_of(v: &Value, path: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                let p = format!("{path}[{i}]");
                let mut b = Obj::new(b, &p)?;
                match b.str("type")? {
                    Some("text") => {}
                    Some(other) => return Err(unknown_block(&b.param("type"), other, &["text"])),
                    None => return Err(ApiError::invalid(b.param("type"), "type: Field required")),
                }
                let Some(t) = b.str("text")? else {
                    return Err(ApiError::invalid(b.param("text"), "text: Field required"));
                };
                b.ignore(&["cache_control", "citations"]);
                b.finish()?;
                texts.push(t);
            }
            Ok(texts.join("\n"))
        }
        other => Err(ApiError::invalid(
            path,
            format!("{path} must be a string or an array of text blocks, not {}", type_name(other)),
        )),
    }
}

fn unknown_block(param: &str, ty: &str, allowed: &[&str]) -> ApiError {
    ApiError::invalid(
        param,
        format!(
            "{param}: unknown or unsupported content block type {ty:?} here (expected one of: {})",
            allowed.join(", ")
        ),
    )
}

/// The conversation: turns alternate, the user's first and last; tool results answer the tool
/// uses of the assistant turn before.
fn parse_turns(list: &[Value], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages: at least one message is required"));
    }
    let mut open_uses: Vec<String> = Vec::new();
    let mut last_role = "";
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let mut m = Obj::new(m, &path)?;
        let role = match m.str("role")? {
            Some(r @ ("user" | "assistant")) => r,
            Some(other) => {
                return Err(ApiError::invalid(
                    m.param("role"),
                    format!(
                        "{}: unexpected role {other:?}: use \"user\" or \"assistant\" (the system \
                         prompt goes in the top-level system parameter)",
                        m.param("role")
                    ),
                ))
            }
            None => return Err(ApiError::invalid(m.param("role"), "role: Field required")),
        };
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            let why = if i == 0 {
                "the first message must use the \"user\" role".to_owned()
            } else {
                format!("roles must alternate between \"user\" and \"assistant\", but messages[{}] and messages[{i}] are both {role:?}", i - 1)
            };
            return Err(ApiError::invalid(m.param("role"), format!("{}: {why}", m.param("role"))));
        }
        let Some(content) = m.value("content") else {
            return Err(ApiError::invalid(m.param("content"), "content: Field required"));
        };
        let cpath = m.param("content");
        m.finish()?;
        if role == "user" {
            user_turn(content, &cpath, &mut open_uses, out)?;
        } else {
            open_uses = assistant_turn(content, &cpath, out)?;
        }
        last_role = role;
    }
    if last_role == "assistant" {
        return Err(ApiError::unsupported(
            format!("messages[{}]", list.len() - 1),
            "a final assistant message (a prefill to continue) is not supported: end with a user message",
        ));
    }
    Ok(())
}

/// A user turn: tool results first (as tool messages), then its text.
fn user_turn(
    content: &Value,
    path: &str,
    open_uses: &mut Vec<String>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let Value::Array(blocks) = content else {
        let text = text_of(content, path)?;
        open_uses.clear();
        out.push(ChatMessage::new(Role::User, text));
        return Ok(());
    };
    let mut texts = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let mut b = Obj::new(b, &format!("{path}[{i}]"))?;
        match b.str("type")? {
            Some("text") => match b.str("text")? {
                Some(t) => texts.push(t.to_owned()),
                None => return Err(ApiError::invalid(b.param("text"), "text: Field required")),
            },
            Some("tool_result") => {
                let Some(id) = b.str("tool_use_id")? else {
                    return Err(ApiError::invalid(
                        b.param("tool_use_id"),
                        "tool_use_id: Field required",
                    ));
                };
                let Some(k) = open_uses.iter().position(|u| u == id) else {
                    return Err(ApiError::invalid(
                        b.param("tool_use_id"),
                        format!(
                            "{}: unexpected tool_use_id {id:?} in tool_result blocks: each tool_result \
                             block must have a corresponding tool_use block in the previous message",
                            b.param("tool_use_id")
                        ),
                    ));
                };
                open_uses.remove(k);
                let text = match b.value("content") {
                    None => String::new(),
                    Some(v) => text_of(v, &b.param("content"))?,
                };
                let text =
                    if b.bool("is_error")? == Some(true) { format!("Error: {text}") } else { text };
                let mut msg = ChatMessage::new(Role::Tool, text);
                msg.tool_call_id = Some(id.to_owned());
                out.push(msg);
            }
            Some(other) => {
                return Err(unknown_block(&b.param("type"), other, &["text", "tool_result"]))
            }
            None => return Err(ApiError::invalid(b.param("type"), "type: Field required")),
        }
        b.ignore(&["cache_control", "citations"]);
        b.finish()?;
    }
    open_uses.clear();
    if !texts.is_empty() {
        out.push(ChatMessage::new(Role::User, texts.join("\n")));
    }
    Ok(())
}

/// An assistant turn; returns the ids of its tool uses (the next turn may answer them).
fn assistant_turn(
    content: &Value,
    path: &str,
    out: &mut Vec<ChatMessage>,
) -> Result<Vec<String>, ApiError> {
    let Value::Array(blocks) = content else {
        out.push(ChatMessage::new(Role::Assistant, text_of(content, path)?));
        return Ok(Vec::new());
    };
    let (mut texts, mut thinking, mut calls, mut ids) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, b) in blocks.iter().enumerate() {
        let mut b = Obj::new(b, &format!("{path}[{i}]"))?;
        match b.str("type")? {
            Some("text") => match b.str("text")? {
                Some(t) => texts.push(t.to_owned()),
                None => return Err(ApiError::invalid(b.param("text"), "text: Field required")),
            },
            Some("thinking") => {
                if let Some(t) = b.str("thinking")? {
                    thinking.push(t.to_owned());
                }
                b.str("signature")?;
            }
            Some("tool_use") => {
                let (Some(id), Some(name)) = (b.str("id")?, b.str("name")?) else {
                    return Err(ApiError::invalid(
                        b.param("id"),
                        "tool_use blocks need id and name",
                    ));
                };
                let input = b.value("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(ApiError::invalid(
                        b.param("input"),
                        format!("{}: input must be an object", b.param("input")),
                    ));
                }
                ids.push(id.to_owned());
                calls.push(ToolCall {
                    id: Some(id.to_owned()),
                    name: name.to_owned(),
                    arguments: input.to_string(),
                });
            }
            Some(other) => {
                return Err(unknown_block(
                    &b.param("type"),
                    other,
                    &["text", "thinking", "tool_use"],
                ))
            }
            None => return Err(ApiError::invalid(b.param("type"), "type: Field required")),
        }
        b.ignore(&["cache_control", "citations"]);
        b.finish()?;
    }
    let mut msg = ChatMessage::new(Role::Assistant, texts.join("\n"));
    if !thinking.is_empty() {
        msg.reasoning_content = Some(thinking.join("\n"));
    }
    msg.tool_calls = calls;
    out.push(msg);
    Ok(ids)
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
