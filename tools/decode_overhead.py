#!/usr/bin/env python3
"""Decode pass time against the memory bound, for one or more `sluice` binaries, interleaved.

For a checkpoint held in memory (`--experts mapped`, or `stream` with every expert cached), a
one-row decode pass has to read every spine weight except the embedding once and every routed
expert it picks once; at the memory read bandwidth `sluice probe --kernels` measures, that is
the pass's bound. This runs, per round: the probe (memory read bandwidth, same threads), then
each binary's `sluice run --json` in turn (A B A B ...), and prints every run's decode s/pass,
the bytes a pass read (expert bytes handed to the model + the spine bytes a pass sweeps, from
the run's own stats) and the ratio s/pass ÷ (bytes ÷ bandwidth), with medians per binary.

    tools/decode_overhead.py --model /tmp/decode-k3 --sluice before=/tmp/a/sluice \\
        --sluice after=target/release/sluice --runs 3 --max-new 8 --out /tmp/decode-out

Every run's generated ids are compared with the first run's; a mismatch fails the script.
The machine's load average is recorded per round (`uptime`), since on a shared machine the
wall-clock figures move with it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def probe_memory(sluice, threads, seconds):
    """Memory read GB/s from `sluice probe --kernels` (its temporary storage file kept small)."""
    out = subprocess.run(
        [sluice, "probe", "--kernels", "--json", "--threads", str(threads),
         "--seconds", str(seconds), "--bytes", "64M"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["memory_read_gbps"]


def run_once(sluice, args):
    """One fresh `sluice run --json`; returns (ids, s/pass, bytes/pass, raw stats)."""
    cmd = [sluice, "run", "--model", args.model, "--prompt-ids", args.prompt_ids,
           "--max-new", str(args.max_new), "--json", "--draft", "none",
           "--experts", args.experts] + args.extra
    env = dict(os.environ, SLUICE_THREADS=str(args.threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    j = json.loads(out)
    s = j["stats"]
    if s["tokens_per_pass"] != 1.0:
        sys.exit(f"expected one token per pass (no drafts), got {s['tokens_per_pass']}")
    per_pass = s["expert_bytes_per_token"] + s["spine_bytes_per_token"]
    return j["generated_ids"], s["s_per_token"], per_pass, s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--sluice", action="append", required=True,
                    help="NAME=PATH of a sluice binary (repeatable; runs interleave)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--prompt-ids", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--experts", default="mapped")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--probe-seconds", type=float, default=8.0)
    ap.add_argument("--out", required=True, help="directory for the JSON record")
    ap.add_argument("extra", nargs="*", help="more `sluice run` flags (after --)")
    args = ap.parse_args()
    bins = [b.split("=", 1) for b in args.sluice]
    if any(len(b) != 2 for b in bins):
        sys.exit("--sluice takes NAME=PATH")
    os.makedirs(args.out, exist_ok=True)
    oracle = None
    rows = []
    for r in range(args.runs):
        load = open("/proc/loadavg").read().split()[0]
        bw = probe_memory(bins[0][1], args.threads, args.probe_seconds)
        for name, path in bins:
            ids, spp, bpp, stats = run_once(path, args)
            if oracle is None:
                oracle = ids
            elif ids != oracle:
                sys.exit(f"TOKEN MISMATCH: {name} run {r}: {ids} vs {oracle}")
            bound = bpp / (bw * 1e9)
            rows.append({"round": r, "binary": name, "load": float(load), "memory_gbps": bw,
                         "s_per_pass": spp, "bytes_per_pass": bpp, "bound_s": bound,
                         "ratio": spp / bound, "stats": stats})
            print(f"round {r} {name:>8}: load {load}, memory {bw:.1f} GB/s, "
                  f"{spp * 1e3:.1f} ms/pass, {bpp / 1e9:.3f} GB/pass, "
                  f"bound {bound * 1e3:.1f} ms, ratio {spp / bound:.2f}", flush=True)
    for name, _ in bins:
        mine = [x for x in rows if x["binary"] == name]
        med = lambda k: statistics.median(x[k] for x in mine)  # noqa: E731
        print(f"{name:>8}: median {med('s_per_pass') * 1e3:.1f} ms/pass, "
              f"ratio {med('ratio'):.2f} (min {min(x['ratio'] for x in mine):.2f}, "
              f"max {max(x['ratio'] for x in mine):.2f})")
    with open(os.path.join(args.out, "decode_overhead.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
