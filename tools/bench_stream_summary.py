#!/usr/bin/env python3
"""Summarise tools/bench_stream.sh output (one `sluice bench --json` file per part) as markdown."""
import json
import os
import sys

FIGS = [
    ("s_per_pass", "decode s/pass", 3),
    ("decode_bound_s_per_pass", "storage bound s/pass (probe)", 3),
    ("decode_ratio", "ratio to bound (probe)", 2),
    ("decode_read_gbps", "decode reads GB/s while the disk was busy", 2),
    ("decode_busy_ratio", "ratio to bound at max(probe, reads while busy)", 2),
    ("decode_io_wait_s_per_pass", "I/O wait s/pass", 3),
    ("decode_compute_s_per_pass", "compute s/pass", 3),
    ("s_per_pass_per_moe_layer", "s/pass per MoE layer", 3),
    ("prefill_s", "prefill s", 2),
    ("prefill_ratio", "prefill ratio to bound (probe)", 2),
    ("prefill_busy_ratio", "prefill ratio at max(probe, reads while busy)", 2),
    ("prefill_read_amplification", "prefill bytes read / distinct", 4),
    ("hit_rate", "cache hit rate", 3),
    ("prefetch_recall", "prefetch recall", 3),
    ("prefetch_issued", "prefetch reads issued", 0),
    ("prefetch_used", "prefetch reads used", 0),
    ("prefetch_wasted_bytes", "prefetch bytes wasted", 0),
    ("expert_reads", "expert reads", 0),
    ("requests_per_expert_read", "disk requests per expert read", 2),
]

# The one-line-per-configuration table (before / after rows of separate runs line up).
ROW = [
    ("s_per_pass", 3),
    ("decode_ratio", 2),
    ("decode_read_gbps", 2),
    ("prefill_read_amplification", 4),
    ("requests_per_expert_read", 2),
    ("prefetch_issued", 0),
    ("prefetch_used", 0),
    ("prefetch_wasted_bytes", 0),
]
ROW_HEAD = ("| run | phase | config | slice ÷ cgroup | decode s/pass | ratio to bound | reads GB/s "
            "while busy | prefill read ÷ distinct | requests per expert | prefetch issued | used | "
            "wasted bytes |")


def cell(m, key, digits):
    if key not in m:
        return "—"
    v = m[key]
    return f"{v['median']:.{digits}f} ({v['min']:.{digits}f}–{v['max']:.{digits}f})"


def short(m, key, digits):
    if key not in m or m[key]["median"] is None:
        return "—"
    v = m[key]
    if v["min"] == v["max"]:
        return f"{v['median']:.{digits}f}"
    return f"{v['median']:.{digits}f} ({v['min']:.{digits}f}–{v['max']:.{digits}f})"


def slice_ratio(out, v):
    """Slice bytes ÷ cgroup bytes from the setup line tools/bench_stream_v2.sh and
    tools/bench_deepseek.sh write, or "—"."""
    p = os.path.join(out, "setup.txt")
    if not os.path.exists(p):
        return "—"
    words = open(p).read().split()
    try:
        sl = int(words[words.index("slice") + 1])
        cg = int(words[words.index("cgroup") + 1].rstrip(","))
    except (ValueError, IndexError):
        return "—"
    return f"{sl / cg:.2f}×"


def rows(out, label=None):
    """The one-line-per-configuration table of OUT (medians, min–max of the runs)."""
    if label is None:
        p = os.path.join(out, "label.txt")
        label = open(p).read().strip() if os.path.exists(p) else os.path.basename(out.rstrip("/"))
    lines = []
    for part in sorted(os.listdir(out)):
        if not (part.startswith("decode-") and part.endswith(".json")):
            continue
        v = json.load(open(os.path.join(out, part)))
        for c in v["summary"]:
            cells = [short(c["metrics"], k, d) for k, d in ROW]
            lines.append(f"| {label} | {part[7:-5]} | {c['config']} | {slice_ratio(out, v)} | "
                         + " | ".join(cells) + " |")
    return lines


def main(out):
    for part in sorted(os.listdir(out)):
        if not part.endswith(".json"):
            continue
        v = json.load(open(os.path.join(out, part)))
        load = open(os.path.join(out, part[:-5] + ".load")).read().split("load average:")
        loads = [x.split(",")[0].strip() for x in load[1:]]
        pb, pa = v["probe_before"]["gbps"], v["probe_after"]["gbps"]
        print(f"### {part[:-5]}: {v['cache_drop']}; storage probe {pb:.2f} / {pa:.2f} GB/s "
              f"(before / after); load average {' → '.join(loads)}; mismatches {v['mismatches']}\n")
        names = [c["config"] for c in v["summary"]]
        print("| figure | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for key, label, digits in FIGS:
            cells = [cell(c["metrics"], key, digits) for c in v["summary"]]
            if any(c != "—" for c in cells):
                print(f"| {label} | " + " | ".join(cells) + " |")
        rss = max(r["peak_rss_bytes"] for r in v["runs"]) / 2**30
        limit = v.get("cgroup_limit_bytes")
        where = f"cgroup {limit / 2**30:.2f} GiB" if limit else "no cgroup set by sluice bench"
        print(f"\npeak RSS over all runs {rss:.2f} GiB ({where})\n")
        # Per-layer figures of the first run of each configuration.
        print("| config | phase | layer | bytes read / distinct | recall | guess precision | read / gated |")
        print("|---|---|---|---|---|---|---|")
        seen = set()
        for r in v["runs"]:
            if r["config"] in seen:
                continue
            seen.add(r["config"])
            for phase in ("prefill_layers", "decode_layers"):
                for l in r.get(phase, []) or []:
                    amp = l.get("read_amplification")
                    rec = l.get("recall")
                    gp = l.get("guess_precision")
                    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"
                    print(f"| {r['config']} | {phase.split('_')[0]} | {l['layer']} | {f(amp, 4)} | {f(rec)} | "
                          f"{f(gp)} | {l['issued']} / {l['gated']} |")
        print()
    table = rows(out)
    if table:
        print("One row per configuration (medians, min–max over the runs; paste next to another "
              "run's rows):\n")
        print(ROW_HEAD)
        print("|" + "---|" * (ROW_HEAD.count("|") - 1))
        print("\n".join(table))
        print()


if __name__ == "__main__":
    # Several OUT directories (a before and an after run): each one's tables, then all rows in
    # one table.
    for d in sys.argv[1:]:
        main(d)
    if len(sys.argv) > 2:
        print(ROW_HEAD)
        print("|" + "---|" * (ROW_HEAD.count("|") - 1))
        for d in sys.argv[1:]:
            print("\n".join(rows(d)))
