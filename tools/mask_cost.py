#!/usr/bin/env python3
"""Per-token cost of constrained output: decode seconds per token of constrained replies over
unconstrained ones, on a running `sluice serve` (standard library only).

    sluice serve --port 8000 &        # the built-in model, or --model DIR
    python3 tools/mask_cost.py --base-url http://127.0.0.1:8000/v1 --model mini-k3 --runs 7

Each run sends one unconstrained chat request and one whose `response_format` is a JSON schema
forcing a long string (so both replies decode `--max-tokens` tokens), in alternating order.
Decode s/token is the engine's own `(total_s - ttft_s) / (completion_tokens - 1)` from the
`sluice` extension, so HTTP and queueing are not counted; the first token (prefill, and for the
constrained request the grammar compile) is excluded. Prints the median, min and max of each and
the ratio of the medians.
"""

import argparse
import json
import statistics
import urllib.request


def chat(base, body):
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def decode_s_per_token(resp):
    ext = resp["sluice"]
    n = resp["usage"]["completion_tokens"]
    return (ext["total_s"] - ext["ttft_s"]) / max(n - 1, 1), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    base = {"model": a.model, "max_tokens": a.max_tokens, "temperature": 0, "reasoning_effort": "none",
            "messages": [{"role": "user", "content": "Describe the Rust borrow checker."}]}
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4 * a.max_tokens}},
              "required": ["text"], "additionalProperties": False}
    constrained = dict(base, response_format={"type": "json_schema",
                                              "json_schema": {"name": "long", "schema": schema}})
    times = {"plain": [], "constrained": []}
    tokens = {"plain": [], "constrained": []}
    chat(a.base_url, base)  # warm-up: expert pages, allocator
    chat(a.base_url, constrained)  # warm-up: the vocabulary index is built on first use
    for i in range(a.runs):
        order = [("plain", base), ("constrained", constrained)]
        if i % 2:
            order.reverse()
        for name, body in order:
            # A user message that differs per run keeps the state cache from serving the reply.
            b = json.loads(json.dumps(body))
            b["messages"][0]["content"] += f" ({i})"
            s, n = decode_s_per_token(chat(a.base_url, b))
            times[name].append(s)
            tokens[name].append(n)
    for name in times:
        t = times[name]
        print(f"{name}: decode s/token median {statistics.median(t):.6f} (min {min(t):.6f}, max {max(t):.6f}),"
              f" tokens {tokens[name]}")
    ratio = statistics.median(times["constrained"]) / statistics.median(times["plain"])
    print(f"ratio constrained/plain: {ratio:.3f}")


if __name__ == "__main__":
    main()
