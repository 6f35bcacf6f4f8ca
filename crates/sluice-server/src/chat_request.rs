//! `POST /v1/chat/completions` bodies parsed into a [`ValidChat`]: messages as
//! [`ChatMessage`]s for the XTML renderer, rendering options (thinking, effort, tools,
//! `tool_choice`, `response_format`) and the output controls.

use crate::constrain::OutputConstraint;
use crate::error::ApiError;
use crate::fields::{type_name, Obj};
use crate::request::{parse_common, Common, Limits, MAX_TOP_LOGPROBS};
use serde_json::{json, Value};
use sluice_tokenizer::{ChatMessage, ChatOptions, Role, ToolCall};

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ValidChat {
    /// Shared controls.
    pub common: Common,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// How to render it (thinking, effort, tools, …).
    pub options: ChatOptions,
    /// Whether tool calls are parsed from the reply (tools declared and `tool_choice` not `none`).
    pub parse_tools: bool,
    /// `top_logprobs` when `logprobs` is true.
    pub logprobs: Option<usize>,
    /// `response_format` JSON or a required/named `tool_choice`, enforced by the grammar.
    pub constraint: Option<OutputConstraint>,
}

/// Parses a chat body.
pub fn parse_chat(body: &Value, limits: &Limits) -> Result<ValidChat, ApiError> {
    let mut o = Obj::new(body, "")?;
    let common = parse_common(&mut o, limits, true)?;
    let messages = match o.array("messages")? {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(a) if a.is_empty() => {
            return Err(ApiError::invalid("messages", "messages must not be empty"))
        }
        Some(a) => a
            .iter()
            .enumerate()
            .map(|(i, m)| parse_message(m, &format!("messages[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let logprobs = o.bool("logprobs")?.unwrap_or(false);
    let top = o.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs requires logprobs: true"));
    }
    let logprobs = logprobs.then(|| usize::try_from(top.unwrap_or(0)).unwrap_or_default());
    let tools = parse_tools(&mut o)?;
    let (tool_choice, tool_constraint) = parse_tool_choice(o.value("tool_choice"), tools.as_ref())?;
    let (response_format, json_constraint) = parse_response_format(&mut o)?;
    if tool_constraint.is_some() && json_constraint.is_some() {
        return Err(ApiError::invalid(
            "response_format",
            "response_format cannot be combined with a required or named tool_choice",
        ));
    }
    let constraint = tool_constraint.or(json_constraint);
    let (thinking, thinking_explicit, effort) = parse_thinking(&mut o)?;
    if let Some(v) = o.value("modalities") {
        if v != &serde_json::json!(["text"]) {
            return Err(ApiError::unsupported("modalities", "only [\"text\"] output is supported"));
        }
    }
    // Every call the model makes is returned; limiting it to one would need constrained decoding.
    if o.bool("parallel_tool_calls")? == Some(false) {
        return Err(ApiError::unsupported(
            "parallel_tool_calls",
            "parallel_tool_calls false is not enforced by sluice (it returns every call the model \
             makes): omit it or send true",
        ));
    }
    o.finish()?;
    let parse_tools = tools.is_some() && tool_choice.as_deref() != Some("none");
    let options = ChatOptions {
        thinking,
        thinking_explicit,
        effort,
        tools,
        tool_choice,
        response_format,
        add_generation_prompt: true,
    };
    Ok(ValidChat { common, messages, options, parse_tools, logprobs, constraint })
}

/// `reasoning_effort` and `chat_template_kwargs.thinking` / `enable_thinking`: whether to
/// think (K3's default: yes), whether the request said so (an effort other than `none` says
/// yes; a template is told only then, else it follows its own default), and the effort.
fn parse_thinking(o: &mut Obj<'_>) -> Result<(bool, bool, Option<String>), ApiError> {
    let mut thinking: Option<bool> = None;
    if let Some(mut kw) = o.obj("chat_template_kwargs")? {
        for key in ["thinking", "enable_thinking"] {
            if let Some(t) = kw.bool(key)? {
                thinking = Some(t);
            }
        }
        kw.finish()?;
    }
    let effort = match o.str("reasoning_effort")? {
        None => None,
        Some("none") => {
            if thinking == Some(true) {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    "reasoning_effort \"none\" contradicts chat_template_kwargs.thinking = true",
                ));
            }
            thinking = Some(false);
            None
        }
        // Each chat format takes its own subset (K3: low, high, max; gpt-oss: low, medium,
        // high); the renderer refuses the rest by name.
        Some(e @ ("low" | "medium" | "high" | "max")) => Some(e.to_owned()),
        Some(other) => {
            return Err(ApiError::unsupported(
                "reasoning_effort",
                format!(
                    "reasoning_effort {other:?} is not supported: use low, medium, high, max \
                     or none (thinking off), as the model's chat format takes them"
                ),
            ))
        }
    };
    let explicit = thinking.is_some() || effort.is_some();
    Ok((thinking.unwrap_or(true), explicit, effort))
}

/// `tools`: function declarations, passed to the template as given.
fn parse_tools(o: &mut Obj<'_>) -> Result<Option<Value>, ApiError> {
    let Some(tools) = o.value("tools") else { return Ok(None) };
    let Value::Array(list) = tools else {
        return Err(ApiError::invalid(
            "tools",
            format!("tools must be an array, not {}", type_name(tools)),
        ));
    };
    for (i, t) in list.iter().enumerate() {
        let mut t = Obj::new(t, &format!("tools[{i}]"))?;
        if t.str("type")? != Some("function") {
            return Err(ApiError::unsupported(
                t.param("type"),
                "only tools of type \"function\" are supported",
            ));
        }
        let Some(mut f) = t.obj("function")? else {
            return Err(ApiError::invalid(t.param("function"), "function is required"));
        };
        if f.str("name")?.is_none_or(str::is_empty) {
            return Err(ApiError::invalid(f.param("name"), "a function name is required"));
        }
        f.str("description")?;
        f.obj("parameters")?;
        f.bool("strict")?;
        f.finish()?;
        t.finish()?;
    }
    Ok((!list.is_empty()).then(|| tools.clone()))
}

/// `tool_choice`: `none`, `auto`, `required` or a named function. The last two are enforced
/// by constrained decoding over the declared tools ([`crate::constrain`]); the template is told
/// `required` for both.
fn parse_tool_choice(
    v: Option<&Value>,
    tools: Option<&Value>,
) -> Result<(Option<String>, Option<OutputConstraint>), ApiError> {
    let declared = || -> Vec<(String, Value)> {
        let list = tools.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        list.iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let params =
                    f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                Some((f.get("name")?.as_str()?.to_owned(), params))
            })
            .collect()
    };
    let required = |only: Option<&str>| {
        let all = declared();
        if all.is_empty() {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice requires tools: declare the functions the model must call",
            ));
        }
        let tools = match only {
            None => all,
            Some(n) => {
                let one: Vec<_> = all.into_iter().filter(|(name, _)| name == n).collect();
                if one.is_empty() {
                    return Err(ApiError::invalid(
                        "tool_choice.function.name",
                        format!("tool_choice names {n:?}, which is not among the declared tools"),
                    ));
                }
                one
            }
        };
        let c = OutputConstraint::Tools { tools, parallel: only.is_none(), param: "tool_choice" };
        Ok((Some("required".to_owned()), Some(c)))
    };
    match v {
        None => Ok((None, None)),
        Some(Value::String(s)) if s == "none" || s == "auto" => Ok((Some(s.clone()), None)),
        Some(Value::String(s)) if s == "required" => required(None),
        Some(v @ Value::Object(_)) => {
            let mut o = Obj::new(v, "tool_choice")?;
            if o.str("type")? != Some("function") {
                return Err(ApiError::unsupported(
                    o.param("type"),
                    "a named tool_choice must have type \"function\"",
                ));
            }
            let Some(mut f) = o.obj("function")? else {
                return Err(ApiError::invalid(o.param("function"), "function is required"));
            };
            let Some(name) = f.str("name")? else {
                return Err(ApiError::invalid(f.param("name"), "name is required"));
            };
            f.finish()?;
            o.finish()?;
            required(Some(name))
        }
        Some(other) => Err(ApiError::invalid(
            "tool_choice",
            format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got {other}"
            ),
        )),
    }
}

/// `response_format`: `text`, `json_object` (any JSON object) or `json_schema` (a JSON value
/// valid against the schema), enforced by constrained decoding; also given to the template.
fn parse_response_format(
    o: &mut Obj<'_>,
) -> Result<(Option<Value>, Option<OutputConstraint>), ApiError> {
    let Some(v) = o.value("response_format") else { return Ok((None, None)) };
    let mut rf = Obj::new(v, "response_format")?;
    let schema = match rf.str("type")? {
        Some("text") => {
            rf.finish()?;
            return Ok((None, None));
        }
        Some("json_object") => json!({"type": "object"}),
        Some("json_schema") => {
            let Some(mut js) = rf.obj("json_schema")? else {
                return Err(ApiError::invalid(rf.param("json_schema"), "json_schema is required"));
            };
            if js.str("name")?.is_none() {
                return Err(ApiError::invalid(js.param("name"), "name is required"));
            }
            js.str("description")?;
            // Strict or not, the schema is enforced: sluice has no weaker mode.
            js.bool("strict")?;
            let schema = match js.value("schema") {
                None => json!({}),
                Some(s @ (Value::Object(_) | Value::Bool(true))) => s.clone(),
                Some(other) => {
                    return Err(ApiError::invalid(
                        js.param("schema"),
                        format!("json_schema.schema must be an object, not {}", type_name(other)),
                    ))
                }
            };
            js.finish()?;
            schema
        }
        other => {
            return Err(ApiError::unsupported(
                "response_format.type",
                format!(
                    "response_format type {other:?} is not supported: use text, json_object or json_schema"
                ),
            ))
        }
    };
    rf.finish()?;
    Ok((Some(v.clone()), Some(OutputConstraint::Json { schema, param: "response_format" })))
}

/// One message.
fn parse_message(v: &Value, path: &str) -> Result<ChatMessage, ApiError> {
    let mut m = Obj::new(v, path)?;
    let role = match m.str("role")? {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(other) => {
            return Err(ApiError::invalid(
                m.param("role"),
                format!(
                    "unsupported role {other:?}: use system, developer, user, assistant or tool"
                ),
            ))
        }
        None => return Err(ApiError::invalid(m.param("role"), "role is required")),
    };
    let content = match m.value("content") {
        None if role == Role::Assistant => String::new(),
        None => return Err(ApiError::invalid(m.param("content"), "content is required")),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(parts, &m.param("content"))?,
        Some(other) => {
            return Err(ApiError::invalid(
                m.param("content"),
                format!(
                    "content must be a string or an array of text parts, not {}",
                    type_name(other)
                ),
            ))
        }
    };
    let mut msg = ChatMessage::new(role, content);
    msg.name = m.str("name")?.map(str::to_owned);
    if role == Role::Assistant {
        let reasoning = m.str("reasoning_content")?;
        let alias = m.str("reasoning")?;
        msg.reasoning_content = reasoning.or(alias).map(str::to_owned);
        if let Some(calls) = m.array("tool_calls")? {
            let p = m.param("tool_calls");
            msg.tool_calls = calls
                .iter()
                .enumerate()
                .map(|(i, c)| parse_tool_call(c, &format!("{p}[{i}]")))
                .collect::<Result<_, _>>()?;
        }
        // Fields the OpenAI SDKs put on a returned message; accepted when empty.
        for key in ["refusal", "audio", "function_call", "annotations"] {
            match m.value(key) {
                None => {}
                Some(Value::Array(a)) if a.is_empty() => {}
                Some(_) => {
                    return Err(ApiError::unsupported(
                        m.param(key),
                        format!("{key} is not supported"),
                    ))
                }
            }
        }
    }
    if role == Role::Tool {
        msg.tool_call_id = m.str("tool_call_id")?.map(str::to_owned);
    }
    m.finish()?;
    Ok(msg)
}

/// Content parts: text only, joined with newlines (as vLLM joins text parts).
fn text_parts(parts: &[Value], path: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let mut part = Obj::new(p, &format!("{path}[{i}]"))?;
        match part.str("type")? {
            Some("text") => match part.str("text")? {
                Some(t) => texts.push(t),
                None => return Err(ApiError::invalid(part.param("text"), "text is required")),
            },
            Some(other) => {
                return Err(ApiError::unsupported(
                    part.param("type"),
                    format!(
                    "content parts of type {other:?} are not supported: sluice serves text only"
                ),
                ))
            }
            None => return Err(ApiError::invalid(part.param("type"), "type is required")),
        }
        part.finish()?;
    }
    Ok(texts.join("\n"))
}

/// An assistant history tool call.
fn parse_tool_call(v: &Value, path: &str) -> Result<ToolCall, ApiError> {
    let mut c = Obj::new(v, path)?;
    let id = c.str("id")?.map(str::to_owned);
    if c.str("type")?.is_some_and(|t| t != "function") {
        return Err(ApiError::unsupported(
            c.param("type"),
            "only function tool calls are supported",
        ));
    }
    let Some(mut f) = c.obj("function")? else {
        return Err(ApiError::invalid(c.param("function"), "function is required"));
    };
    let Some(name) = f.str("name")?.map(str::to_owned) else {
        return Err(ApiError::invalid(f.param("name"), "name is required"));
    };
    let arguments = f.str("arguments")?.unwrap_or_default().to_owned();
    f.finish()?;
    c.finish()?;
    Ok(ToolCall { id, name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> Limits {
        Limits { model_id: "m".into(), max_tokens: 100, context_len: 1000 }
    }

    fn ok(v: Value) -> ValidChat {
        parse_chat(&v, &limits()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn param(v: Value) -> Value {
        match parse_chat(&v, &limits()) {
            Ok(r) => panic!("accepted: {r:?}"),
            Err(e) => e.body()["error"]["param"].clone(),
        }
    }

    #[test]
    fn history_with_reasoning_tool_calls_and_results() {
        let r = ok(json!({"model": "m", "reasoning_effort": "low", "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "reasoning_content": "use the tool", "refusal": null,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ], "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]}));
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.messages[0].role, Role::System);
        assert_eq!(r.messages[2].tool_calls[0].name, "get");
        assert_eq!(r.messages[2].reasoning_content.as_deref(), Some("use the tool"));
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert!(r.parse_tools && r.options.thinking);
        assert_eq!(r.options.effort.as_deref(), Some("low"));
    }

    #[test]
    fn thinking_switches() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        assert!(!ok(with("reasoning_effort", json!("none"))).options.thinking);
        assert!(!ok(with("chat_template_kwargs", json!({"thinking": false}))).options.thinking);
        assert!(ok(base.clone()).options.thinking);
        assert_eq!(param(with("reasoning_effort", json!("extreme"))), json!("reasoning_effort"));
    }

    #[test]
    fn json_formats_and_required_tools_become_constraints() {
        let m = json!([{"role": "user", "content": "x"}]);
        let tools = json!([{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}},
                           {"type": "function", "function": {"name": "put"}}]);
        let r =
            ok(json!({"model": "m", "messages": m, "response_format": {"type": "json_object"}}));
        assert_eq!(
            r.constraint,
            Some(OutputConstraint::Json {
                schema: json!({"type": "object"}),
                param: "response_format"
            })
        );
        assert!(r.options.response_format.is_some());
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let r = ok(json!({"model": "m", "messages": m, "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}}}));
        assert!(
            matches!(r.constraint, Some(OutputConstraint::Json { ref schema, .. }) if *schema == s)
        );
        let r = ok(json!({"model": "m", "messages": m, "tools": tools, "tool_choice": "required"}));
        assert!(
            matches!(r.constraint, Some(OutputConstraint::Tools { ref tools, parallel: true, .. }) if tools.len() == 2)
        );
        let r = ok(json!({"model": "m", "messages": m, "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "put"}}}));
        assert!(
            matches!(r.constraint, Some(OutputConstraint::Tools { ref tools, parallel: false, .. })
            if tools.len() == 1 && tools[0].0 == "put")
        );
        assert_eq!(r.options.tool_choice.as_deref(), Some("required"));
    }

    #[test]
    fn refusals_name_the_field() {
        let m = json!([{"role": "user", "content": "x"}]);
        let tools = json!([{"type": "function", "function": {"name": "get"}}]);
        for (body, want) in [
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (json!({"model": "m", "messages": [{"role": "user"}]}), "messages[0].content"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "extra": 1}]}),
                "messages[0].extra",
            ),
            (json!({"model": "m", "messages": m, "top_logprobs": 3}), "top_logprobs"),
            (
                json!({"model": "m", "messages": m, "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"model": "m", "messages": m, "response_format": {"type": "grammar"}}),
                "response_format.type",
            ),
            (
                json!({"model": "m", "messages": m, "tools": [{"type": "retrieval"}]}),
                "tools[0].type",
            ),
            (json!({"model": "m", "messages": m, "frequency_penalty": 1}), "frequency_penalty"),
            (
                json!({"model": "m", "messages": m, "tools": tools, "parallel_tool_calls": false}),
                "parallel_tool_calls",
            ),
            (json!({"model": "m", "messages": m, "functions": []}), "functions"),
            (json!({"model": "m", "messages": m, "tool_choice": "required"}), "tool_choice"),
            (
                json!({"model": "m", "messages": m, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice.function.name",
            ),
            (
                json!({"model": "m", "messages": m, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"model": "m", "messages": m, "max_completion_tokens": 0}),
                "max_completion_tokens",
            ),
        ] {
            assert_eq!(param(body.clone()), json!(want), "{body}");
        }
    }
}
