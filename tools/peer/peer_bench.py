#!/usr/bin/env python3
"""sluice against llama.cpp on one `sluice synth` K3 slice (driven by tools/peer/peer_bench.sh).

Every measurement is a fresh process, the two engines interleaved (sluice, llama.cpp, sluice, ...)
so the drift of a shared machine hits both alike, each with the same kernel threads:

- tokens:  greedy ids of both from the same prompt ids; sluice is the exact reference, and the
           first step where llama.cpp's id differs is reported.
- decode:  a short prompt, then TG one-token passes, model in memory (page cache warm);
- prefill: a PP-token prompt in one pass, model in memory;
- cgroup:  decode, each run in a fresh memory cgroup (v1) of --cgroup-bytes with the model's
           pages dropped first (posix_fadvise DONTNEED on every model file), so the process sees
           a machine on which the model does not fit, page cache included.

Rates are tokens per second per pass; ratios are sluice / llama.cpp of the medians. Writes one
JSON file (every run and the summary) and prints a markdown summary. Exits non-zero, printing
why, when either engine fails: no number is reported without its peer.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CGROUP_ROOT = "/sys/fs/cgroup/memory"


def fail(msg):
    print(f"peer_bench: {msg}", file=sys.stderr)
    sys.exit(1)


def prompt_ids(n, ranks, seed):
    """n deterministic pseudo-random ids below `ranks` (plain tokens, no specials)."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % ranks)
    return out


def safetensors_bytes(model):
    """(expert bytes, other bytes) of the checkpoint's tensors, from the shard headers."""
    expert = other = 0
    for name in sorted(os.listdir(model)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model, name), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for key, t in header.items():
            if key == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            if ".experts." in key:
                expert += size
            else:
                other += size
    return expert, other


def drop_pages(paths):
    """Drops the cached pages of every file (so a cgroup run starts with nothing cached)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_pages(paths):
    """Reads every file once so both engines start from the page cache in memory runs."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


class Cgroup:
    """A fresh v1 memory cgroup limited to `limit` bytes; children join it before exec."""

    def __init__(self, limit, tag):
        self.dir = os.path.join(CGROUP_ROOT, f"peer-bench-{os.getpid()}-{tag}")
        try:
            os.mkdir(self.dir)
            with open(os.path.join(self.dir, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit))
        except OSError as e:
            fail(f"cannot make a memory cgroup under {CGROUP_ROOT} ({e}); the cgroup part needs "
                 "a writable v1 memory controller (docs: /work/shared/MACHINE.md)")

    def join(self):
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def peak(self):
        with open(os.path.join(self.dir, "memory.max_usage_in_bytes")) as f:
            return int(f.read())

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


def run_json(cmd, env=None, cgroup=None):
    """Runs one fresh process and returns (its last stdout line as JSON, wall seconds)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       preexec_fn=cgroup.join if cgroup else None)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        fail(f"{os.path.basename(cmd[0])} exited {p.returncode}: {p.stderr.strip()[-2000:]}\n"
             f"command: {' '.join(cmd)[:400]}")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    try:
        return json.loads(lines[-1]), wall
    except (IndexError, json.JSONDecodeError):
        fail(f"{os.path.basename(cmd[0])} printed no JSON line: {p.stdout[-500:]}")


def sluice(a, ids, n_new, cgroup=None):
    env = dict(os.environ, SLUICE_THREADS=str(a.threads))
    cmd = [a.sluice, "run", "--model", a.model, "--json", "--no-warm-start",
           "--prompt-ids", ",".join(map(str, ids)), "--max-new", str(n_new)]
    v, wall = run_json(cmd, env, cgroup)
    st = v["stats"]
    return {"generated_ids": v["generated_ids"], "prefill_s": st["prefill_s"],
            "decode_s": st["decode_s"], "decode_passes": st["passes"] - st["prefill_passes"],
            "wall_s": wall, "load_s": v.get("load_s")}


def peer(a, ids, n_new, cgroup=None):
    cmd = [a.peer_run, a.gguf, str(a.threads), str(n_new), ",".join(map(str, ids))]
    v, wall = run_json(cmd, None, cgroup)
    v["wall_s"] = wall
    return v


def first_divergence(ref, got):
    for i, (r, g) in enumerate(zip(ref, got)):
        if r != g:
            return i
    return None if len(got) >= len(ref) else len(got)


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True, help="release sluice binary")
    ap.add_argument("--model", required=True, help="`sluice synth` checkpoint directory")
    ap.add_argument("--gguf", required=True, help="the same checkpoint converted by llama.cpp")
    ap.add_argument("--peer-run", required=True, help="tools/peer/peer_run.cpp, built")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tg", type=int, default=32, help="one-token passes timed in memory")
    ap.add_argument("--pp", type=int, default=256, help="prompt tokens of the prefill test")
    ap.add_argument("--cgroup-tg", type=int, default=8, help="one-token passes in the cgroup")
    ap.add_argument("--cgroup-bytes", type=int,
                    help="cgroup limit (default: the non-expert bytes + 1/3 of the expert bytes)")
    ap.add_argument("--compare-new", type=int, default=32, help="greedy ids compared")
    ap.add_argument("--parts", default="tokens,memory,cgroup")
    ap.add_argument("--out", required=True, help="JSON file written")
    a = ap.parse_args()
    parts = a.parts.split(",")

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    ranks = cfg["text_config"]["vocab_size"] - 256
    expert, other = safetensors_bytes(a.model)
    files = [os.path.join(a.model, f) for f in os.listdir(a.model) if f.endswith(".safetensors")]
    files.append(a.gguf)
    limit = a.cgroup_bytes or other + expert // 3
    short = prompt_ids(8, ranks, 1)
    long = prompt_ids(a.pp, ranks, 2)
    res = {"threads": a.threads, "runs": a.runs, "expert_bytes": expert, "other_bytes": other,
           "gguf_bytes": os.path.getsize(a.gguf), "cgroup_bytes": limit, "tg": a.tg, "pp": a.pp,
           "cgroup_tg": a.cgroup_tg, "load": {"before": os.getloadavg()}, "runs_raw": []}
    print(f"peer_bench: experts {expert / 1e9:.2f} GB, other {other / 1e9:.2f} GB, gguf "
          f"{res['gguf_bytes'] / 1e9:.2f} GB, {a.threads} threads, load {os.getloadavg()}",
          file=sys.stderr)

    def record(part, engine, r):
        r.update(part=part, engine=engine)
        res["runs_raw"].append(r)
        with open(a.out + ".partial", "w") as f:  # what an interrupted run leaves
            json.dump(res, f, indent=1)
        print(f"  {part:8s} {engine:9s} prefill {r['prefill_s']:.3f}s decode {r['decode_s']:.3f}s"
              f"/{r['decode_passes']} passes", file=sys.stderr)

    if "tokens" in parts:
        warm_pages(files)
        s = sluice(a, short, a.compare_new)
        p = peer(a, short, a.compare_new)
        d = first_divergence(s["generated_ids"], p["generated_ids"])
        res["tokens"] = {"prompt_ids": short, "sluice": s["generated_ids"],
                         "llama_cpp": p["generated_ids"], "first_divergence": d,
                         "system_info": p.get("system_info")}
        print(f"  tokens: llama.cpp {'matches sluice' if d is None else f'diverges at step {d}'}"
              f"\n    sluice    {s['generated_ids']}\n    llama.cpp {p['generated_ids']}",
              file=sys.stderr)

    if "memory" in parts:
        warm_pages(files)
        for _ in range(a.runs):
            record("decode", "sluice", sluice(a, short, a.tg + 1))
            record("decode", "llama.cpp", peer(a, short, a.tg + 1))
            record("prefill", "sluice", sluice(a, long, 1))
            record("prefill", "llama.cpp", peer(a, long, 1))

    if "cgroup" in parts:
        for i in range(a.runs):
            for engine, fn in (("sluice", sluice), ("llama.cpp", peer)):
                drop_pages(files)
                cg = Cgroup(limit, f"{i}-{engine}")
                try:
                    r = fn(a, short, a.cgroup_tg + 1, cg)
                    r["cgroup_peak_bytes"] = cg.peak()
                finally:
                    cg.remove()
                record("cgroup", engine, r)

    res["load"]["after"] = os.getloadavg()
    out = {}
    for part, per in (("decode", "decode"), ("cgroup", "decode"), ("prefill", "prefill")):
        rates = {}
        for engine in ("sluice", "llama.cpp"):
            rs = [r for r in res["runs_raw"] if r["part"] == part and r["engine"] == engine]
            if not rs:
                continue
            if per == "decode":
                rates[engine] = summary([r["decode_passes"] / r["decode_s"] for r in rs])
            else:
                rates[engine] = summary([a.pp / r["prefill_s"] for r in rs])
        if len(rates) == 2:
            rates["ratio"] = rates["sluice"]["median"] / rates["llama.cpp"]["median"]
            out[part] = rates
    res["summary"] = out
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"| test | sluice tok/s | llama.cpp tok/s | sluice / llama.cpp |")
    print(f"|---|---|---|---|")
    names = {"decode": f"decode tg{a.tg}, in memory", "prefill": f"prefill pp{a.pp}, in memory",
             "cgroup": f"decode tg{a.cgroup_tg}, cgroup {limit / 2**30:.2f} GiB"}
    for part, r in out.items():
        s, p = r["sluice"], r["llama.cpp"]
        print(f"| {names[part]} | {s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}) | "
              f"{p['median']:.3f} ({p['min']:.3f}–{p['max']:.3f}) | {r['ratio']:.2f}× |")
    if "tokens" in res:
        t = res["tokens"]
        d = t["first_divergence"]
        print(f"\ngreedy ids ({a.compare_new} steps): llama.cpp "
              f"{'equals sluice' if d is None else f'first differs from sluice at step {d}'}")
    print(f"\nload average before {res['load']['before']}, after {res['load']['after']}")


if __name__ == "__main__":
    main()
