#!/usr/bin/env python3
"""Kernel rates against the FMA peak over several rounds, both x86 tiers: issue 20's 70% target.

Runs `sluice probe --kernels --json` (the rates at T = 1, 8, 64 and 256 per weight format, each
beside the FMA peak and the memory read bandwidth measured in the same run) `--rounds` times for
each thread count and tier, alternating, and prints the medians (range) of every figure as
markdown tables: T = 64 and 256 as % of the FMA peak, T = 1 as % of the memory read bandwidth.
A tier is forced with `SLUICE_ISA` (`avx512`, `avx2`; a tier the CPU lacks is skipped with a
line saying so). On a shared machine the figures move between runs: read the ranges.

    tools/kernel_rounds.py --sluice target/release/sluice --threads 1,16 --rounds 3 \\
        --out /tmp/kernel-rounds

The JSON record of every run goes to `--out/kernel_rounds.json`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def probe(sluice, tier, threads, seconds):
    """One `sluice probe --kernels --json` on `tier`; None if it ran on another tier (the
    CPU lacks this one)."""
    env = dict(os.environ, SLUICE_ISA=tier)
    run = subprocess.run(
        [sluice, "probe", "--kernels", "--json", "--threads", str(threads),
         "--seconds", str(seconds), "--bytes", "64M"],
        env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"sluice probe failed on {tier} at {threads} threads: {run.stderr.strip()}")
    p = json.loads(run.stdout)
    # A tier the CPU lacks falls back to the detected one: not the figure asked for.
    return p if p["isa"] == tier else None


def cell(values):
    """Median (min–max) of percentages."""
    values = [100 * v for v in values]
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def table(runs, rows, key, title):
    """Markdown table of `key` at `rows` activation rows: a line per (tier, threads)."""
    formats = []
    for r in runs:
        for k in r["rates"]:
            name = f"{k['format']} ({k['layout']})"
            if k["rows"] == rows and name not in formats:
                formats.append(name)
    lines = [f"{title}", "", "| tier, threads | " + " | ".join(formats) + " |",
             "|---|" + "---|" * len(formats)]
    for tier, threads in sorted({(r["tier"], r["threads"]) for r in runs}):
        got = {f: [] for f in formats}
        for r in runs:
            if (r["tier"], r["threads"]) != (tier, threads):
                continue
            for k in r["rates"]:
                name = f"{k['format']} ({k['layout']})"
                if k["rows"] == rows:
                    got[name].append(k[key])
        lines.append(f"| {tier}, {threads} | " + " | ".join(
            cell(got[f]) if got[f] else "–" for f in formats) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--tiers", default="avx512,avx2", help="comma-separated SLUICE_ISA tiers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="each probe's time budget")
    ap.add_argument("--out", required=True, help="directory for the JSON record")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    tiers = args.tiers.split(",")
    runs = []
    skipped = set()
    for rnd in range(args.rounds):
        for n in threads:
            for tier in tiers:
                if tier in skipped:
                    continue
                p = probe(args.sluice, tier, n, args.seconds)
                if p is None:
                    print(f"{tier}: not supported by this CPU, skipped", file=sys.stderr)
                    skipped.add(tier)
                    continue
                runs.append({"round": rnd, "tier": tier, "threads": n, "isa": p["isa"],
                             "fma_peak_gflops": p["fma_peak_gflops"],
                             "memory_read_gbps": p["memory_read_gbps"], "rates": p["kernels"]})
                print(f"round {rnd} {tier} {n} threads: FMA peak {p['fma_peak_gflops']:.0f} "
                      f"GFLOP/s, memory {p['memory_read_gbps']:.1f} GB/s", file=sys.stderr)
    if not runs:
        sys.exit("no tier ran")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_rounds.json"), "w") as f:
        json.dump(runs, f, indent=1)
    peaks = {}
    for r in runs:
        peaks.setdefault((r["tier"], r["threads"]), []).append(r["fma_peak_gflops"])
    print("FMA peak per run (GFLOP/s): " + "; ".join(
        f"{t}, {n} threads: " + " / ".join(f"{p:.0f}" for p in v)
        for (t, n), v in sorted(peaks.items())))
    print()
    print(table(runs, 256, "ratio_to_fma_peak", "T = 256, % of the FMA peak, median (range):"))
    print()
    print(table(runs, 64, "ratio_to_fma_peak", "T = 64, % of the FMA peak, median (range):"))
    print()
    print(table(runs, 1, "ratio_to_memory", "T = 1, % of the memory read bandwidth, median (range):"))


if __name__ == "__main__":
    main()
