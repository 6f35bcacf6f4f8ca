#!/usr/bin/env python3
"""End-to-end check of `sluice serve` with the official `openai` Python package.

Run by crates/sluice-server/tests/e2e_openai.rs against a server started with
`--model tests/fixtures/kimi_k3/tiny-a --queue 0`:

    python3 tools/openai_e2e.py --base-url http://127.0.0.1:PORT/v1 --model tiny-a

The tiny fixture has random weights, so the checks are about the protocol: shapes, streaming,
reasoning/content split, tool-call history round trip, seeded reproducibility, usage, 429.
Prints one line per check and exits non-zero on the first failure.
"""

import argparse
import json
import sys
import time
import urllib.request

import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def ext(obj):
    """The `sluice` extension object of a response or chunk."""
    extra = getattr(obj, "model_extra", None) or {}
    return extra.get("sluice")


def reasoning_of(msg):
    extra = getattr(msg, "model_extra", None) or {}
    return extra.get("reasoning_content")


def wait_idle(base):
    root = base.rsplit("/v1", 1)[0]
    for _ in range(2400):
        with urllib.request.urlopen(root + "/health") as r:
            h = json.loads(r.read())
        if not h["running"] and h["queue_depth"] == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("server never became idle")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key="unused", max_retries=0, timeout=600)
    user = [{"role": "user", "content": "Hello there"}]

    models = client.models.list()
    check([m.id for m in models.data] == [a.model], "models.list names the served model")

    comp = client.completions.create(model=a.model, prompt="The quick brown", max_tokens=5, temperature=0)
    check(comp.object == "text_completion" and len(comp.choices) == 1, "completion shape")
    check(comp.usage.completion_tokens == len(ext(comp)["generated_ids"]) <= 5, "completion usage")
    check(comp.choices[0].finish_reason in ("stop", "length"), "completion finish_reason")

    chat = client.chat.completions.create(model=a.model, messages=user, max_tokens=6, temperature=0)
    msg = chat.choices[0].message
    check(chat.object == "chat.completion" and msg.role == "assistant", "chat shape")
    check(chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens == len(ext(chat)["generated_ids"]), "chat usage")
    check(reasoning_of(msg) is not None or msg.content is not None, "chat has reasoning or content")

    # Streaming gives exactly the non-streaming output (greedy), split the same way.
    stream = client.chat.completions.create(
        model=a.model, messages=user, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})
    reasoning, content, finish, usage, ids = "", "", None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            d = c.delta
            reasoning += (getattr(d, "model_extra", None) or {}).get("reasoning_content") or ""
            content += d.content or ""
            finish = c.finish_reason or finish
            if (c.model_extra or {}).get("sluice"):
                ids = c.model_extra["sluice"]["generated_ids"]
    check(ids == ext(chat)["generated_ids"], "streamed ids equal non-streamed ids")
    check(reasoning == (reasoning_of(msg) or "") and content == (msg.content or ""), "streamed text equals non-streamed text")
    check(finish == chat.choices[0].finish_reason, "streamed finish_reason")
    check(usage is not None and usage.total_tokens == chat.usage.total_tokens, "include_usage chunk")

    # Thinking off: everything is content.
    nothink = client.chat.completions.create(model=a.model, messages=user, max_tokens=4, temperature=0,
                                             reasoning_effort="none")
    check(reasoning_of(nothink.choices[0].message) is None, "reasoning_effort=none gives no reasoning")

    # Tool-call round trip: history with an assistant tool call and its result.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    tc = client.chat.completions.create(model=a.model, messages=history, tools=tools, max_tokens=4, temperature=0)
    check(tc.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tool round trip answers")
    check(tc.usage.prompt_tokens > chat.usage.prompt_tokens, "tool history is rendered into the prompt")
    # A named tool_choice is enforced by constrained decoding: the reply is a call to that tool.
    bounded = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}]
    named = client.chat.completions.create(
        model=a.model, messages=user, tools=bounded, max_tokens=160, temperature=0, reasoning_effort="none",
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = named.choices[0].message.tool_calls or []
    check(named.choices[0].finish_reason == "tool_calls" and len(calls) == 1
          and calls[0].function.name == "get_weather"
          and json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome"),
          "named tool_choice gives a call to that tool with schema-valid arguments")
    # response_format json_schema: the content parses and matches the schema.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["ok", "n"], "additionalProperties": False}
    js = client.chat.completions.create(
        model=a.model, messages=user, max_tokens=160, temperature=0, reasoning_effort="none",
        response_format={"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": schema}})
    val = json.loads(js.choices[0].message.content)
    check(js.choices[0].finish_reason == "stop" and set(val) == {"ok", "n"} and isinstance(val["ok"], bool)
          and 0 <= val["n"] <= 99, "response_format json_schema gives schema-valid JSON")
    try:
        client.chat.completions.create(
            model=a.model, messages=user, max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#/missing"}}})
        check(False, "an uncompilable schema is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "response_format" and "missing" in e.body["message"],
              "an uncompilable schema is refused with 400 naming it")

    # Seeded sampling is reproducible.
    kw = dict(model=a.model, messages=user, max_tokens=8, temperature=1.0, top_p=0.95, seed=1234)
    s1 = client.chat.completions.create(**kw)
    s2 = client.chat.completions.create(**kw)
    s3 = client.chat.completions.create(**{**kw, "seed": 99})
    check(ext(s1)["generated_ids"] == ext(s2)["generated_ids"], "same seed, same tokens")
    check(ext(s1)["generated_ids"] != ext(s3)["generated_ids"], "another seed, other tokens")

    # Logprobs.
    lp = client.chat.completions.create(model=a.model, messages=user, max_tokens=3, temperature=0,
                                        logprobs=True, top_logprobs=2)
    entries = lp.choices[0].logprobs.content
    check(len(entries) == len(ext(lp)["generated_ids"]) and all(len(e.top_logprobs) == 2 for e in entries),
          "logprobs per token with top_logprobs")
    check(all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in entries),
          "logprobs are ordered log-probabilities")
    check(ext(lp)["generated_ids"] == ext(chat)["generated_ids"][:3], "logprobs do not change greedy tokens")

    # Errors are OpenAI-shaped.
    try:
        client.chat.completions.create(model="nope", messages=user, max_tokens=1)
        check(False, "unknown model refused")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", "unknown model is 404 model_not_found")
    try:
        client.chat.completions.create(model=a.model, messages=user, n=2)
        check(False, "n=2 refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "n", "n=2 is 400 naming n")

    # 429: with --queue 0 a second request during a long generation is refused.
    long = client.chat.completions.create(model=a.model, messages=user, max_tokens=4000, temperature=1.0,
                                          seed=1, stream=True)
    next(iter(long))
    try:
        client.chat.completions.create(model=a.model, messages=user, max_tokens=1)
        check(False, "second request refused while busy")
    except openai.RateLimitError as e:
        check(e.response.headers.get("retry-after") is not None, "429 with Retry-After while busy")
    long.close()
    wait_idle(a.base_url)
    after = client.chat.completions.create(model=a.model, messages=user, max_tokens=1, temperature=0)
    check(len(ext(after)["generated_ids"]) == 1, "served again after the stream was closed")
    print("all e2e checks passed", flush=True)


if __name__ == "__main__":
    main()
