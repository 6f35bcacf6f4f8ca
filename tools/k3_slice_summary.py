#!/usr/bin/env python3
"""Tables for docs/PERFORMANCE.md from the output directory of tools/k3_slice_measure.sh (or of the same
`sluice bench --json` runs on any model): the warm-start comparison and the workload suite, medians
[min, max] of each configuration's runs.  Usage: python3 tools/k3_slice_summary.py OUT_DIR"""
import glob
import json
import os
import sys

out = sys.argv[1]


def metric(cfg, k, scale=1.0, fmt="{:.3f}"):
    m = cfg["metrics"].get(k)
    if not m:
        return "n/a"
    f = lambda v: fmt.format(v * scale)
    return f"{f(m['median'])} [{f(m['min'])}, {f(m['max'])}]"


def first32(b, name):
    # prefill + 32 decode tokens: the "first 32 tokens" cost, per run, then the median
    v = []
    for r in b["runs"]:
        if r["config"] == name and r.get("prefill_s") is not None and r.get("s_per_token") is not None:
            n = r.get("generated_tokens") or 32
            v.append(r["prefill_s"] + r["s_per_token"] * (n - 1))
    v.sort()
    return f"{v[len(v) // 2]:.2f} [{v[0]:.2f}, {v[-1]:.2f}]" if v else "n/a"


p = os.path.join(out, "warm.json")
if os.path.exists(p):
    b = json.load(open(p))
    print(f"warm starts ({b['model']}; cgroup {b['cgroup_limit_bytes']}; storage {b['storage_gbps']:.2f} GB/s; "
          f"mismatches {b['mismatches']})")
    print("config | prefill s | s/token | first 32 tokens s | hit rate | expert GB read")
    for c in b["summary"]:
        print(f"{c['config']} | {metric(c, 'prefill_s')} | {metric(c, 's_per_token')} | {first32(b, c['config'])} | "
              f"{metric(c, 'hit_rate')} | {metric(c, 'expert_bytes_read', 1e-9, '{:.2f}')}")
for p in sorted(glob.glob(os.path.join(out, "suite-*.json"))):
    if os.path.getsize(p) == 0:
        continue  # still running, or failed: its .err file says why
    b = json.load(open(p))
    w = (b.get("workload") or {}).get("name", p)
    print(f"\nworkload {w} (cgroup {b['cgroup_limit_bytes']}; storage {b['storage_gbps']:.2f} GB/s; "
          f"mismatches {b['mismatches']})")
    print("config | TTFT s | s/token | tokens/pass | hit rate | expert MB read/token | bytes written/token | swap in/out")
    for c in b["summary"]:
        swap = f"{metric(c, 'swap_in_bytes', 1, '{:.0f}')} / {metric(c, 'swap_out_bytes', 1, '{:.0f}')}"
        print(f"{c['config']} | {metric(c, 'ttft_s')} | {metric(c, 's_per_token')} | {metric(c, 'tokens_per_pass', 1, '{:.2f}')} | "
              f"{metric(c, 'hit_rate')} | {metric(c, 'read_bytes_per_token', 1e-6, '{:.1f}')} | "
              f"{metric(c, 'written_bytes_per_token', 1, '{:.0f}')} | {swap}")
p = os.path.join(out, "replay.txt")
if os.path.exists(p):
    print("\nagent replay")
    print(open(p).read())
