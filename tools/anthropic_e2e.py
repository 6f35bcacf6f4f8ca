#!/usr/bin/env python3
"""End-to-end check of `sluice serve`'s Messages API with the official `anthropic` Python package.

Run by crates/sluice-server/tests/e2e_anthropic.rs against a server started with
`--model tests/fixtures/kimi_k3/tiny-a --queue 0`:

    python3 tools/anthropic_e2e.py --base-url http://127.0.0.1:PORT --model tiny-a

The tiny fixture has random weights, so the checks are about the protocol: message shape, usage,
stop reasons, thinking blocks, the streaming event sequence and its agreement with the
non-streaming message, a tool round trip (tool_use answered by tool_result), tool_choice enforced
by constrained decoding, and errors in the API's shape (the server keeps serving after them).
Prints one line per check and exits non-zero on the first failure.
"""

import argparse
import json
import sys

import anthropic


# The SDK no longer takes `temperature`; sluice still reads it (0 is greedy, so checks can compare
# replies), sent through extra_body.
T0 = {"temperature": 0}


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def ext(msg):
    """The `sluice` extension object of a message."""
    return (getattr(msg, "model_extra", None) or {}).get("sluice")


def expect_error(client, status, kind, says, **kw):
    try:
        client.messages.create(**kw)
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", {})
        check(e.status_code == status and body.get("type") == "error" and err.get("type") == kind
              and says in err.get("message", ""),
              f"{status} {kind} naming {says!r}: {err.get('message')!r}")
        return
    check(False, f"refused with {status}: {says}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    client = anthropic.Anthropic(base_url=a.base_url, api_key="unused", max_retries=0, timeout=600)
    user = [{"role": "user", "content": "Hello there"}]

    msg = client.messages.create(model=a.model, max_tokens=6, extra_body=T0, system="Be brief.",
                                 messages=user)
    check(msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), "message shape")
    check(msg.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {msg.stop_reason}")
    check(msg.usage.input_tokens > 0 and msg.usage.output_tokens == len(ext(msg)["generated_ids"]) <= 6,
          "usage counts input and output tokens")
    check(all(b.type == "text" for b in msg.content), "thinking off: text blocks only")
    if msg.stop_reason == "max_tokens":
        check(msg.usage.output_tokens == 6, "max_tokens stops at max_tokens")

    # Thinking on: reasoning arrives as a thinking block, before any text.
    think = client.messages.create(model=a.model, max_tokens=8, extra_body=T0, messages=user,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    kinds = [b.type for b in think.content]
    check(kinds[:1] == ["thinking"] and set(kinds) <= {"thinking", "text"}, f"thinking block first: {kinds}")

    # Streaming: the documented event sequence, and the same output as the non-streaming call.
    events, text, thinking, final = [], "", "", None
    with client.messages.stream(model=a.model, max_tokens=8, extra_body=T0, messages=user,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        for ev in s:
            events.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                text += ev.delta.text
            if ev.type == "content_block_delta" and ev.delta.type == "thinking_delta":
                thinking += ev.delta.thinking
        final = s.get_final_message()
    check(events[0] == "message_start" and events[-1] == "message_stop" and "message_delta" in events,
          f"event sequence {events[:3]}...{events[-2:]}")
    check(events.count("content_block_start") == events.count("content_block_stop") >= 1,
          "every content block is started and stopped")
    want_thinking = "".join(b.thinking for b in think.content if b.type == "thinking")
    want_text = "".join(b.text for b in think.content if b.type == "text")
    check(thinking == want_thinking and text == want_text, "streamed blocks equal the non-streamed message")
    check(final.stop_reason == think.stop_reason and final.usage.output_tokens == think.usage.output_tokens,
          "streamed stop_reason and usage")

    # Stop sequences: stop_reason stop_sequence names the one that matched.
    first = (want_thinking + want_text)[:2]
    if len(want_text) >= 2:
        stopped = client.messages.create(model=a.model, max_tokens=8, extra_body=T0, messages=user,
                                         thinking={"type": "enabled", "budget_tokens": 1024},
                                         stop_sequences=["zzzz-never", want_text[:2]])
        check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == want_text[:2],
              "stop_sequences end with stop_reason stop_sequence")
    else:
        print(f"note: reply text {first!r} too short to test stop_sequences here", flush=True)

    # Tool round trip: tool_use in history answered by tool_result.
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                               "required": ["city"], "additionalProperties": False}}]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    rt = client.messages.create(model=a.model, max_tokens=4, extra_body=T0, tools=tools, messages=history)
    check(rt.stop_reason in ("end_turn", "max_tokens", "tool_use"), "tool round trip answers")
    check(rt.usage.input_tokens > msg.usage.input_tokens, "tool history is rendered into the prompt")

    # tool_choice any / tool: enforced, the reply is a tool_use with a schema-valid input.
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        forced = client.messages.create(model=a.model, max_tokens=160, extra_body=T0, tools=tools,
                                        tool_choice=choice, messages=[history[0]])
        uses = [b for b in forced.content if b.type == "tool_use"]
        check(forced.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
              and uses[0].input.get("city") in ("Paris", "Rome") and uses[0].id.startswith("toolu_"),
              f"tool_choice {choice['type']} gives a schema-valid tool_use")
        # The same request streamed: input_json_delta carries the same input.
        with client.messages.stream(model=a.model, max_tokens=160, extra_body=T0, tools=tools,
                                    tool_choice=choice, messages=[history[0]]) as s:
            deltas = [ev for ev in s if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta"]
            streamed = s.get_final_message()
        check(deltas and [b.input for b in streamed.content if b.type == "tool_use"] == [u.input for u in uses],
              "streamed tool_use input equals the non-streamed input")
        # Round trip: the call answered.
        back = client.messages.create(
            model=a.model, max_tokens=3, extra_body=T0, tools=tools,
            messages=[history[0], {"role": "assistant", "content": [{"type": "tool_use", "id": u.id, "name": u.name,
                                                          "input": u.input} for u in uses]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                    "content": "sunny"}]}])
        check(back.type == "message", "a returned tool_use is accepted back with its tool_result")

    # output_config.format: the text is JSON valid against the schema.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["ok", "n"], "additionalProperties": False}
    js = client.messages.create(model=a.model, max_tokens=160, extra_body=T0, messages=user,
                                output_config={"format": {"type": "json_schema", "schema": schema}})
    val = json.loads("".join(b.text for b in js.content if b.type == "text"))
    check(js.stop_reason == "end_turn" and set(val) == {"ok", "n"} and isinstance(val["ok"], bool)
          and 0 <= val["n"] <= 99, "output_config.format gives schema-valid JSON")
    expect_error(client, 400, "invalid_request_error", "output_config.format", model=a.model, max_tokens=4,
                 messages=user, output_config={"format": {"type": "json_schema", "schema": {"$ref": "#/missing"}}})

    # Errors: the API's shape, the field named, and the server keeps serving.
    base = dict(model=a.model, max_tokens=4)
    expect_error(client, 400, "invalid_request_error", "alternate",
                 messages=[user[0], user[0]], **base)
    expect_error(client, 400, "invalid_request_error", "first message",
                 messages=[{"role": "assistant", "content": "hi"}, user[0]], **base)
    expect_error(client, 400, "invalid_request_error", "content block type",
                 messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}], **base)
    expect_error(client, 400, "invalid_request_error", "tool_use_id",
                 messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope",
                                                         "content": "x"}]}], **base)
    expect_error(client, 400, "invalid_request_error", "at least one message", messages=[], **base)
    expect_error(client, 404, "not_found_error", "nope", model="nope", max_tokens=4, messages=user)
    expect_error(client, 400, "invalid_request_error", "tool_choice",
                 messages=user, tool_choice={"type": "any"}, **base)
    again = client.messages.create(model=a.model, max_tokens=2, extra_body=T0, messages=user)
    check(again.type == "message", "the server keeps serving after bad requests")
    print("all anthropic e2e checks passed", flush=True)


if __name__ == "__main__":
    main()
