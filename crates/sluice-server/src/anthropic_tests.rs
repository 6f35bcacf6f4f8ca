//! Messages bodies: the mapping to chat messages, and refusals naming the field.

use super::*;
use serde_json::json;

fn limits() -> Limits {
    Limits { model_id: "m".into(), max_tokens: 100, context_len: 1000 }
}

fn ok(v: Value) -> ValidMessages {
    parse_messages(&v, &limits()).unwrap_or_else(|e| panic!("{e}"))
}

fn refused(v: Value) -> (String, String) {
    match parse_messages(&v, &limits()) {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => {
            let param = match &e {
                ApiError::Invalid { param, .. } => param.clone().unwrap_or_default(),
                _ => String::new(),
            };
            (param, e.to_string())
        }
    }
}

#[test]
fn a_tool_round_trip_maps_to_chat_messages() {
    let r = ok(
        json!({"model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "be brief"}],
        "thinking": {"type": "enabled", "budget_tokens": 10},
        "tools": [{"name": "get", "description": "weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "and tomorrow?"}]}
        ], "stop_sequences": ["\n\n"]}),
    );
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::User]);
    assert_eq!(r.messages[2].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(r.messages[2].reasoning_content.as_deref(), Some("use the tool"));
    assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("t1"));
    assert_eq!(r.messages[3].content, "sunny");
    assert!(r.options.thinking && r.parse_tools && r.constraint.is_none());
    assert_eq!(
        r.options.tools.as_ref().map(|t| t[0]["function"]["name"].clone()),
        Some(json!("get"))
    );
    assert_eq!((r.max_tokens, r.stop.len()), (20, 1));
}

#[test]
fn tool_choice_any_and_tool_become_constraints() {
    let tools = json!([{"name": "a", "input_schema": {"type": "object"}},
                       {"name": "b", "input_schema": {"type": "object", "properties": {}}}]);
    let base = |choice: Value| {
        json!({"model": "m", "max_tokens": 5, "tools": tools, "tool_choice": choice,
               "messages": [{"role": "user", "content": "x"}]})
    };
    let r = ok(base(json!({"type": "any"})));
    assert!(
        matches!(r.constraint, Some(OutputConstraint::Tools { ref tools, parallel: true, .. }) if tools.len() == 2)
    );
    let r = ok(base(json!({"type": "tool", "name": "b", "disable_parallel_tool_use": true})));
    assert!(
        matches!(r.constraint, Some(OutputConstraint::Tools { ref tools, parallel: false, .. })
        if tools.len() == 1 && tools[0].0 == "b")
    );
    assert!(!ok(base(json!({"type": "none"}))).parse_tools);
    assert_eq!(refused(base(json!({"type": "tool", "name": "zz"}))).0, "tool_choice.name");
}

#[test]
fn output_config_format_is_a_json_constraint() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let r =
        ok(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}}}));
    assert_eq!(
        r.constraint,
        Some(OutputConstraint::Json { schema, param: "output_config.format" })
    );
    assert_eq!((r.options.thinking, r.options.effort.as_deref()), (true, Some("low")));
}

#[test]
fn bad_requests_name_the_problem() {
    let user = json!({"role": "user", "content": "x"});
    let asst = json!({"role": "assistant", "content": "y"});
    for (body, param, says) in [
        (json!({"model": "m", "max_tokens": 5, "messages": []}), "messages", "at least one"),
        (json!({"model": "m", "messages": [user]}), "max_tokens", "Field required"),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [asst, user]}),
            "messages[0].role",
            "first message",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user, user]}),
            "messages[1].role",
            "alternate",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user, asst]}),
            "messages[1]",
            "prefill",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "s"}]}),
            "messages[0].role",
            "system parameter",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages[0].content[0].type",
            "unknown or unsupported content block type \"image\"",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user, asst,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "r"}]}]}),
            "messages[2].content[0].tool_use_id",
            "corresponding tool_use",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]}),
            "messages[0].content[0].tool_use_id",
            "corresponding tool_use",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user], "temperature": 1.5}),
            "temperature",
            "between",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user], "wat": 1}),
            "wat",
            "Unrecognized",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user], "output_config": {"effort": "xhigh"}}),
            "output_config.effort",
            "low, high or max",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user], "output_config": {"format": {"type": "json_schema"}}}),
            "output_config.format.schema",
            "Field required",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [user], "thinking": {"type": "maybe"}}),
            "thinking.type",
            "enabled",
        ),
    ] {
        let (p, m) = refused(body.clone());
        assert_eq!(p, param, "{body}: {m}");
        assert!(m.contains(says), "{body}: {m}");
    }
}
