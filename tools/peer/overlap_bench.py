#!/usr/bin/env python3
"""Where a streamed decode pass's time goes in a memory cgroup, against max(compute, I/O).

For one `sluice synth` K3 slice, each of --runs interleaved rounds runs, every one a fresh process:

- mapped:  decode with every expert resident (`--experts mapped`, files in the page cache): the
           compute-only time of a pass;
- cgroup:  for each --sluice binary (e.g. before and after a change; their order alternates from
           round to round), decode in a fresh v1 memory
           cgroup with the model's pages dropped first (the rule of tools/peer/peer_bench.py:
           the slice's non-expert bytes + 25.5% of its expert bytes; sluice at the limit - 256 MiB,
           or the --memory given with the binary as NAME=BINARY@MEMORY);
- probe:   `sluice probe --model` (storage read bandwidth at the engine's block size and queue
           depth), so the I/O bound is measured in the same round.

Per run: decode s/pass, the time the pass waited on expert reads (`decode_io_wait_s`), expert
bytes read per pass, hit rate, per-layer reads, and the process's CPU seconds (user + system,
from wait4), the plan's slots and chunk, the peak RSS, and the cgroup's peak charge, how often it
hit the limit (memory.failcnt: reclaim ran) and its OOM kills. The I/O bound of a pass is its expert bytes read / the probed bandwidth; the figure
of a cgroup run is `s/pass / max(mapped s/pass, I/O bound)` with the mapped run and the probe of
the same round (1.0 = reads fully overlapped with compute). Medians (min-max) over rounds; the
load average is recorded around every round. Every run's greedy ids must equal the mapped run's
of round 1 or the script fails. Writes one JSON file and prints a markdown table.

    tools/peer/overlap_bench.py --model /tmp/overlap-k3 --sluice before=/path/a \
        --sluice after=/path/b --runs 3 --out /tmp/overlap.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_bench import (K3_EXPERT_SHARE, Cgroup, drop_pages, fail, prompt_ids,  # noqa: E402
                        safetensors_bytes, warm_pages)


def run(cmd, env, cgroup=None):
    """One fresh process: (its last stdout line as JSON, wall s, CPU s, stderr)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=cgroup.join if cgroup else None)
    out, err = p.communicate()
    wall = time.monotonic() - t0
    # communicate() reaped the child; its rusage arrives with RUSAGE_CHILDREN deltas instead.
    if p.returncode != 0:
        fail(f"{' '.join(cmd)[:300]} exited {p.returncode}: {err.strip()[-1500:]}")
    lines = [l for l in out.splitlines() if l.strip()]
    try:
        return json.loads(lines[-1]), wall, err
    except (IndexError, json.JSONDecodeError):
        fail(f"{cmd[0]} printed no JSON line: {out[-500:]}")


def child_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def decode(binary, a, ids, cgroup=None, extra=()):
    env = dict(os.environ, SLUICE_THREADS=str(a.threads))
    cmd = [binary, "run", "--model", a.model, "--json", "--stats", "--no-warm-start",
           "--prompt-ids", ",".join(map(str, ids)), "--max-new", str(a.tg + 1), *extra]
    cpu0 = child_cpu()
    v, wall, err = run(cmd, env, cgroup)
    cpu = child_cpu() - cpu0
    st = v["stats"]
    passes = st["passes"] - st["prefill_passes"]
    layers = [{k: l.get(k) for k in ("layer", "demanded", "covered", "bytes_read", "issued",
                                     "gated", "skipped", "guess_precision")}
              for l in st.get("decode_layers", [])]
    return {"ids": v["generated_ids"], "s_per_pass": st["decode_s"] / passes, "passes": passes,
            "io_wait_per_pass": st["decode_io_wait_s"] / passes,
            "read_busy_per_pass": st["decode_read_busy_s"] / passes,
            "bytes_read_per_pass": st["decode_expert_bytes_read"] / passes,
            "hit_rate": st["hit_rate"], "slots": v["plan"]["slots"], "chunk": v["plan"]["chunk"],
            "peak_rss_bytes": st.get("peak_rss_bytes"), "cpu_s": cpu,
            "wall_s": wall, "io_backend": v.get("io_backend"), "layers": layers}


def probe(binary, a):
    v, _, _ = run([binary, "probe", "--model", a.model, "--json", "--bytes", a.probe_bytes],
                  dict(os.environ))
    if "storage_read_gbps" not in v:
        fail(f"probe printed no storage_read_gbps: {json.dumps(v)[:400]}")
    return float(v["storage_read_gbps"]) * 1e9, v


def med(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--sluice", action="append", required=True,
                    help="NAME=BINARY[@MEMORY], once per configuration measured in the cgroup "
                    "(the first one also runs the mapped pass and the probe); MEMORY is its "
                    "--memory (default: the limit - 256 MiB)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tg", type=int, default=8, help="timed one-token passes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--probe-bytes", default="1G")
    ap.add_argument("--cgroup-bytes", type=int, help="limit (default: the peer_bench rule)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    bins, mem_of = [], {}
    for s in a.sluice:
        name, _, path = s.partition("=")
        path, _, mem_of[name] = path.partition("@")
        if not path or not os.access(path, os.X_OK):
            fail(f"--sluice {s!r}: expected NAME=EXECUTABLE[@MEMORY]")
        bins.append((name, path))
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    ids = prompt_ids(8, cfg["text_config"]["vocab_size"] - 256, 1)
    expert, other = safetensors_bytes(a.model)
    limit = a.cgroup_bytes or int(other + K3_EXPERT_SHARE * expert)
    memory = f"{(limit - (256 << 20)) >> 20}M"
    for name in mem_of:
        mem_of[name] = mem_of[name] or memory
    files = [os.path.join(a.model, f) for f in os.listdir(a.model) if f.endswith(".safetensors")]
    print(f"overlap_bench: cgroup {limit / 1e9:.3f} GB, sluice --memory "
          f"{', '.join(f'{n} {m}' for n, m in mem_of.items())}", file=sys.stderr)
    rounds, ref = [], None
    for r in range(a.runs):
        rnd = {"load_before": os.getloadavg()[0]}
        bw, rnd["probe"] = probe(bins[0][1], a)
        rnd["probe_bytes_per_s"] = bw
        warm_pages(files)
        rnd["mapped"] = decode(bins[0][1], a, ids, extra=("--experts", "mapped"))
        ref = ref or rnd["mapped"]["ids"]
        # Alternate the binaries' order from round to round, so drift favours neither.
        for name, path in (bins if r % 2 == 0 else bins[::-1]):
            drop_pages(files)
            cg = Cgroup(limit, f"overlap-{r}-{name}")
            try:
                res = decode(path, a, ids, cg, extra=("--memory", mem_of[name]))
                res["cgroup_peak_bytes"] = cg.peak()
                res["cgroup_failcnt"], res["cgroup_oom_kills"] = cg.pressure()
            finally:
                cg.remove()
            io_bound = res["bytes_read_per_pass"] / bw
            res["io_bound_per_pass"] = io_bound
            res["ratio"] = res["s_per_pass"] / max(rnd["mapped"]["s_per_pass"], io_bound)
            rnd[name] = res
        rnd["load_after"] = os.getloadavg()[0]
        for k in ["mapped"] + [n for n, _ in bins]:
            if rnd[k]["ids"] != ref:
                fail(f"round {r + 1} {k}: greedy ids {rnd[k]['ids']} differ from {ref}")
        rounds.append(rnd)
        print(f"overlap_bench: round {r + 1}: load {rnd['load_before']:.1f} -> "
              f"{rnd['load_after']:.1f}, probe {bw / 1e9:.2f} GB/s, mapped "
              f"{rnd['mapped']['s_per_pass']:.3f} s/pass, " + ", ".join(
                  f"{n} {rnd[n]['s_per_pass']:.3f} s/pass (io wait {rnd[n]['io_wait_per_pass']:.3f},"
                  f" ratio {rnd[n]['ratio']:.2f})" for n, _ in bins), file=sys.stderr)
    summary = {"mapped_s_per_pass": med([x["mapped"]["s_per_pass"] for x in rounds]),
               "mapped_cpu_s": med([x["mapped"]["cpu_s"] for x in rounds]),
               "probe_gb_per_s": med([x["probe_bytes_per_s"] / 1e9 for x in rounds])}
    for n, _ in bins:
        for k in ("s_per_pass", "io_wait_per_pass", "read_busy_per_pass", "bytes_read_per_pass",
                  "io_bound_per_pass", "ratio", "cpu_s", "hit_rate"):
            summary[f"{n}_{k}"] = med([x[n][k] for x in rounds])
    json.dump({"model": a.model, "cgroup_bytes": limit, "sluice_memory": mem_of,
               "binaries": dict(bins), "tg": a.tg, "threads": a.threads, "rounds": rounds,
               "summary": summary}, open(a.out, "w"), indent=1)
    f = lambda s, d=3: f"{s['median']:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f})"  # noqa: E731
    print(f"\nmapped (compute only): {f(summary['mapped_s_per_pass'])} s/pass; probe "
          f"{f(summary['probe_gb_per_s'], 2)} GB/s; load "
          f"{min(x['load_before'] for x in rounds):.1f}–{max(x['load_after'] for x in rounds):.1f}\n")
    print("| binary | cgroup s/pass | I/O wait s/pass | reads in flight s/pass | MB read/pass | "
          "I/O bound s/pass | s/pass ÷ max(compute, I/O) | process CPU s | --memory | "
          "slots | hit rate | peak RSS GB | cgroup peak GB | limit hits | OOM kills |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, _ in bins:
        s = lambda k: summary[f"{n}_{k}"]  # noqa: E731
        print(f"| {n} | {f(s('s_per_pass'))} | {f(s('io_wait_per_pass'))} | "
              f"{f(s('read_busy_per_pass'))} | "
              f"{s('bytes_read_per_pass')['median'] / 1e6:.0f} | {f(s('io_bound_per_pass'))} | "
              f"**{f(s('ratio'), 2)}** | {f(s('cpu_s'), 1)} | {mem_of[n]} | "
              f"{rounds[0][n]['slots']} | {f(s('hit_rate'))} | "
              f"{max(x[n]['peak_rss_bytes'] or 0 for x in rounds) / 1e9:.3f} | "
              f"{max(x[n]['cgroup_peak_bytes'] for x in rounds) / 1e9:.3f} | "
              f"{sum(x[n]['cgroup_failcnt'] for x in rounds)} | "
              f"{sum(x[n]['cgroup_oom_kills'] for x in rounds)} |")


if __name__ == "__main__":
    main()
