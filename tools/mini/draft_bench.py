#!/usr/bin/env python3
"""Speculation on the built-in model: no drafts vs n-gram vs mini-draft (issue 17; docs/PERFORMANCE.md).

    python3 tools/mini/draft_bench.py [--sluice target/release/sluice] [--runs 3] [--max-new 64] [--out FILE]

Runs `sluice run` on the built-in mini-K3 (no --model) for three workloads (prose, code, a chat turn) with
`--draft none`, `--draft ngram` and `--draft auto` (the built-in mini-draft), each as a fresh process,
interleaving the drafters run by run so that a change of machine load hits all three alike. Per workload and
drafter it prints the medians over the runs of: acceptance (accepted / drafted), tokens per target pass, s per
generated token, and that s/token as a ratio to `none` measured in the same run (median of the per-run ratios).
It also checks that the three drafters emit the same tokens (they must: drafts only propose). --out writes
every run as a JSON line.
"""

import argparse
import json
import statistics
import subprocess
import sys

WORKLOADS = {
    "prose": ["--prompt", "The memory management subsystem of the kernel keeps track of"],
    "code": ["--prompt", "fn main() {\n    let mut total = 0;\n    for i in 0..10 {\n        total += i;\n    }\n"],
    "chat": ["--chat", "--no-think", "--prompt", "How do I read a file line by line in Python?"],
}
DRAFTERS = ["none", "ngram", "auto"]


def run(sluice, args, draft, max_new, cache):
    cmd = [sluice, "run", *args, "--max-new", str(max_new), "--draft", draft, "--json"]
    env = {"SLUICE_CACHE": cache, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--cache", default="/tmp/sluice-draft-bench-cache")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for r in range(args.runs):
        for w, wargs in WORKLOADS.items():
            for d in DRAFTERS:
                j = run(args.sluice, wargs, d, args.max_new, args.cache)
                st = j["stats"]
                rows.append({"run": r, "workload": w, "draft": d, "generated_ids": j["generated_ids"],
                             "drafter": st["drafter"], "drafted": st["drafted"], "accepted": st["accepted"],
                             "passes": st["passes"], "tokens_per_pass": st["tokens_per_pass"],
                             "s_per_token": st["s_per_token"], "draft_s": st["draft_s"],
                             "generated": st["generated_tokens"]})
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    ok = True
    print("| workload | draft | acceptance | tokens/pass | s/token | vs none | drafting s/token |")
    print("|---|---|---|---|---|---|---|")
    for w in WORKLOADS:
        base = {x["run"]: x for x in rows if x["workload"] == w and x["draft"] == "none"}
        for d in DRAFTERS:
            xs = [x for x in rows if x["workload"] == w and x["draft"] == d]
            same = all(x["generated_ids"] == base[x["run"]]["generated_ids"] for x in xs)
            ok &= same
            med = lambda k: statistics.median(x[k] for x in xs)  # noqa: E731
            acc = statistics.median(x["accepted"] / x["drafted"] if x["drafted"] else 0.0 for x in xs)
            ratio = statistics.median(x["s_per_token"] / base[x["run"]]["s_per_token"] for x in xs)
            dps = statistics.median(x["draft_s"] / max(1, x["generated"]) for x in xs)
            name = "mini-draft" if d == "auto" else d
            print(f"| {w} | {name} | {acc:.3f} | {med('tokens_per_pass'):.2f} | {med('s_per_token'):.4f} | "
                  f"{ratio:.2f}x | {dps:.4f} |{'' if same else ' OUTPUT DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
