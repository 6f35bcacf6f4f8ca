#!/usr/bin/env python3
"""Summarise tools/bench_draft.sh output: medians (min-max) per configuration, as markdown."""
import json
import statistics
import sys
from collections import defaultdict


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(v, scale=1.0, digits=2):
    m, lo, hi = (x / scale for x in v)
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = defaultdict(list)
    for r in rows:
        if r["part"] == "ctrl":
            run = r["run"]
            key = ("ctrl", run["accept"], run["width"], run["mode"])
        else:
            key = (r["part"], r["cache"], r["prompt"], r["draft"])
        groups[key].append(r)
    loads = [r["load"] for r in rows]
    print(f"runs: {len(rows)}, load average {min(loads):.1f}–{max(loads):.1f}\n")
    oracle = {}
    for key, rs in groups.items():
        if key[0] != "ctrl" and key[3] == "none":
            oracle[(key[1], key[2])] = rs[0]["run"]["generated_ids"]
    print("| cache | prompt | drafter | tokens/pass | acceptance (accepted/drafted) | s/token | "
          "expert MB read/token | spine MB/token | draft s | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(k for k in groups if k[0] != "ctrl"):
        rs = groups[key]
        st = [r["run"]["stats"] for r in rs]
        exact = all(r["run"]["generated_ids"] == oracle.get((key[1], key[2])) for r in rs)
        acc = f"{sum(s['accepted'] for s in st)}/{sum(s['drafted'] for s in st)}"
        print(f"| {key[1]} | {key[2]} | {key[3]} | "
              f"{fmt(med([s['tokens_per_pass'] for s in st]))} | {acc} | "
              f"{fmt(med([s['s_per_token'] for s in st]))} | "
              f"{fmt(med([s['expert_bytes_read_per_token'] for s in st]), 1e6, 0)} | "
              f"{fmt(med([s['spine_bytes_per_token'] for s in st]), 1e6, 0)} | "
              f"{statistics.median(s['draft_s'] for s in st):.3f} | {'yes' if exact else 'NO'} |")
    print("\n| acceptance | width | mode | tokens/pass | measured acceptance | s/token | "
          "expert MB read/token | widths used (passes per width) | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(k for k in groups if k[0] == "ctrl"):
        rs = groups[key]
        st = [r["run"]["stats"] for r in rs]
        drafted = sum(s["drafted"] for s in st)
        acc = sum(s["accepted"] for s in st) / drafted if drafted else 0.0
        hist = [sum(x) for x in zip(*(s["width_histogram"] for s in st))]
        exact = all(r["run"]["exact"] for r in rs)
        print(f"| {key[1]} | {key[2]} | {key[3]} | "
              f"{fmt(med([s['tokens_per_pass'] for s in st]))} | {acc:.2f} | "
              f"{fmt(med([s['s_per_token'] for s in st]))} | "
              f"{fmt(med([s['expert_bytes_read_per_token'] for s in st]), 1e6, 0)} | "
              f"{hist} | {'yes' if exact else 'NO'} |")


if __name__ == "__main__":
    main(sys.argv[1])
