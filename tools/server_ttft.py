#!/usr/bin/env python3
"""Time to first token of a follow-up chat turn, with and without conversation-state reuse.

Start two servers on the same model, one with reuse (the default) and one without:

    sluice serve --model DIR --port 8001 &
    sluice serve --model DIR --port 8002 --session-memory 0 &
    python3 tools/server_ttft.py --reuse http://127.0.0.1:8001/v1 --fresh http://127.0.0.1:8002/v1 --model NAME

For each follow-up question it sends turn 1, then the follow-up (turn 1 + reply + question) as a
streaming request, and measures the client-side time to the first streamed token; the engine's
own figure (`sluice.ttft_s`) and the reused prompt tokens come from the final chunk. Greedy, so
both servers must produce the same tokens (checked). Prints one JSON line per follow-up and a
median summary.
"""

import argparse
import json
import statistics
import time

import openai

FOLLOW_UPS = ["Tell me more.", "Why is that?", "Give an example.", "Summarise it in one line.", "And then?"]


def first_token_time(client, model, messages, max_tokens):
    t0 = time.perf_counter()
    ttft, ext = None, None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    for chunk in stream:
        for c in chunk.choices:
            extra = getattr(c.delta, "model_extra", None) or {}
            if ttft is None and (c.delta.content or extra.get("reasoning_content")):
                ttft = time.perf_counter() - t0
            if (c.model_extra or {}).get("sluice"):
                ext = c.model_extra["sluice"]
    return (ttft if ttft is not None else time.perf_counter() - t0), ext


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reuse", required=True, help="base URL of a server with state reuse")
    ap.add_argument("--fresh", required=True, help="base URL of a server with --session-memory 0")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--first", default="Hello there, what can you do?")
    ap.add_argument("--repeat", type=int, default=1, help="send --first this many times, space-separated")
    ap.add_argument("--follow-ups", type=int, default=len(FOLLOW_UPS), help="how many follow-up questions")
    a = ap.parse_args()
    a.first = " ".join([a.first] * a.repeat)
    reuse = openai.OpenAI(base_url=a.reuse, api_key="x", max_retries=0, timeout=3600)
    fresh = openai.OpenAI(base_url=a.fresh, api_key="x", max_retries=0, timeout=3600)
    rows = []
    for q in FOLLOW_UPS[:a.follow_ups]:
        turn1 = [{"role": "user", "content": a.first}]
        r1 = reuse.chat.completions.create(model=a.model, messages=turn1, max_tokens=a.max_tokens, temperature=0)
        m = r1.choices[0].message
        turn2 = turn1 + [{"role": "assistant", "content": m.content,
                          "reasoning_content": (m.model_extra or {}).get("reasoning_content")},
                         {"role": "user", "content": q}]
        t_reuse, e_reuse = first_token_time(reuse, a.model, turn2, a.max_tokens)
        t_fresh, e_fresh = first_token_time(fresh, a.model, turn2, a.max_tokens)
        assert e_reuse["generated_ids"] == e_fresh["generated_ids"], "reuse changed the output"
        row = {"follow_up": q, "prompt_tokens": e_reuse["prompt_tokens"], "reused": e_reuse["cached_tokens"],
               "prefilled_with_reuse": e_reuse["prefill_tokens"], "ttft_s_reuse": round(t_reuse, 4),
               "ttft_s_fresh": round(t_fresh, 4), "engine_ttft_s_reuse": round(e_reuse["ttft_s"], 4),
               "engine_ttft_s_fresh": round(e_fresh["ttft_s"], 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    med = lambda k: statistics.median(r[k] for r in rows)
    print(json.dumps({"median_prompt_tokens": med("prompt_tokens"), "median_reused": med("reused"),
                      "median_prefilled_with_reuse": med("prefilled_with_reuse"),
                      "median_engine_ttft_s_reuse": med("engine_ttft_s_reuse"),
                      "median_engine_ttft_s_fresh": med("engine_ttft_s_fresh"),
                      "median_ttft_s_reuse": med("ttft_s_reuse"), "median_ttft_s_fresh": med("ttft_s_fresh"),
                      "speedup": round(med("ttft_s_fresh") / max(med("ttft_s_reuse"), 1e-9), 1)}))


if __name__ == "__main__":
    main()
