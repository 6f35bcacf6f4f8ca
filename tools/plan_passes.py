#!/usr/bin/env python3
"""Prefill passes a long prompt takes by the memory plan, for `sluice serve` and `sluice run`.

On a streamed model every prefill pass reads nearly every routed expert once, so the number of
passes is what a long prompt's time to first token costs. This reads the plan a `sluice`
binary prints at start (no request is sent, no prompt is run: each process is stopped as soon
as its plan line is out) and computes the passes:

- `serve`: a pass runs to the prefill chunk's end and captures the states at the
  `--checkpoint-every` points inside it, at most `--captures` of them (4, sluice's
  MAX_CAPTURES); it is cut at the point past those. `--captures 0` counts passes as builds before
  in-pass captures made them, cut at every checkpoint. With `--session-memory 0` a server takes
  no checkpoints. Message boundaries, which also take captures, are not modelled;
- `run`: the plan is made for the prompt itself (its length is the largest pass), and a prompt
  of P tokens takes ceil(P / chunk) passes.

    python3 tools/plan_passes.py --sluice target/release/sluice --model DIR --memory 4G \\
        [--session-memory 1G] [--checkpoint-every 512] [--prompts 3000,8000] [--run-memory 2.67G]

Give `--sluice` twice (`--sluice OLD --sluice NEW`) to compare two builds. Prints one JSON
line per (binary, command, prompt) with the chunk, the expert-cache slots and the passes.
"""

import argparse
import json
import math
import re
import subprocess


def plan_line(cmd):
    """Starts `cmd`, returns the stderr line holding the memory plan, and stops the process."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:
            if "memory plan:" in line or line.startswith("error"):
                return line.strip()
        return ""
    finally:
        p.kill()
        p.wait()


def parse(line):
    chunk = re.search(r"prefill chunk (\d+) tokens", line)
    slots = re.search(r"expert cache (\d+) slots", line)
    if not chunk:
        raise SystemExit(f"no plan in: {line}")
    return int(chunk.group(1)), int(slots.group(1)) if slots else None


def serve_passes(prompt, chunk, every, captures):
    passes, pos = 0, 0
    while pos < prompt:
        end = min(pos + chunk, prompt)
        if every:
            points = range((pos // every + 1) * every, end, every)
            if len(points) > captures:
                end = points[captures]
        passes, pos = passes + 1, end
    return passes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", action="append", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--memory", default="4G")
    ap.add_argument("--session-memory", default="1G")
    ap.add_argument("--checkpoint-every", type=int, default=512)
    ap.add_argument("--prompts", default="3000,8000")
    ap.add_argument("--captures", type=int, default=4,
                    help="states a pass captures before it is cut (0: builds without captures)")
    ap.add_argument("--run-memory", default=None, help="budget of the `sluice run` plans (default --memory)")
    a = ap.parse_args()
    prompts = [int(x) for x in a.prompts.split(",")]
    for binary in a.sluice:
        serve = [binary, "serve", "--model", a.model, "--port", "0", "--memory", a.memory,
                 "--session-memory", a.session_memory, "--checkpoint-every", str(a.checkpoint_every),
                 "--no-warm-start"]
        line = plan_line(serve)
        chunk, slots = parse(line)
        every = a.checkpoint_every if a.session_memory not in ("0", "0M", "0G") else 0
        for p in prompts:
            print(json.dumps({"sluice": binary, "command": "serve", "memory": a.memory,
                              "session_memory": a.session_memory,
                              "checkpoint_every": a.checkpoint_every, "prompt": p, "chunk": chunk,
                              "slots": slots, "passes": serve_passes(p, chunk, every, a.captures)}))
        for p in prompts:
            ids = ",".join(str(i * 131 % 20000 + 7) for i in range(p))
            run = [binary, "run", "--model", a.model, "--prompt-ids", ids, "--max-new", "1",
                   "--memory", a.run_memory or a.memory, "--no-warm-start"]
            chunk, slots = parse(plan_line(run))
            print(json.dumps({"sluice": binary, "command": "run", "memory": a.run_memory or a.memory,
                              "prompt": p, "chunk": chunk, "slots": slots,
                              "passes": math.ceil(p / chunk)}))


if __name__ == "__main__":
    main()
