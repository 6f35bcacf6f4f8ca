#!/usr/bin/env python3
"""sluice against llama.cpp on one `sluice synth` slice (driven by tools/peer/peer_bench.sh): a K3
slice, or a GPT-OSS / Qwen3-MoE one (gpt-oss-20b and Qwen3-30B-A3B are what people run in memory).

Every measurement is a fresh process and the two engines alternate (sluice, llama.cpp, sluice, ...)
within each of --runs ROUNDS, so the drift of a shared machine hits both alike; each round is:

- decode:  an 8-id prompt, then TG one-token passes, model in memory (each engine's run starts
           from its own files in the page cache, the other engine's dropped);
- prefill: a PP-id prompt in one pass, model in memory;
- context: the PP-id prompt, then TG one-token passes after it (decode at a long context: each
           pass's attention reads PP cached positions), model in memory (not a default part);
- cgroup:  decode (--cgroup-tg passes), each run in a fresh memory cgroup (v1 or v2) with the model's
           pages dropped first (posix_fadvise DONTNEED on every model file), so the process sees
           a machine on which the model does not fit, page cache included.

The cgroup rule ("a memory cgroup at 1/3 of the experts", issue 20): for the full Kimi K3 a
cgroup of 1/3 of the expert bytes holds the whole non-expert part (the spine: 56.7 B bf16
parameters, 113.4 GB, against 1,446.5 GB of MXFP4 experts) and leaves room for 1/3 - 113.4/1,446.5
= 25.5% of the experts. A 2-layer slice has a spine larger than 1/3 of its experts (embedding,
lm_head and two layers' attention and shared experts against 48 routed experts), so the literal
rule would starve both engines of the spine, which the full model never does. The default limit
is therefore what the rule means for the full model: the slice's non-expert bytes + 25.5% of its
expert bytes (--cgroup-bytes overrides it). The script prints the rule and the numbers.

Greedy ids: sluice is the exact reference (its goldens); every decode run's ids are compared, and
the first step where llama.cpp's differ is reported per round (sluice's own ids must be the same
in every run, in memory and in the cgroup, or the script fails).

Rates are tokens per second of the timed passes; the ratio of a round is sluice / llama.cpp of
that round, summarised as the median (min-max) over rounds. Each round records the load average
before and after it, and each run the share of the machine's CPU time the hypervisor gave to
others while it ran (the "steal" of /proc/stat; on a shared VM host a round in which a
neighbour took cores shows there: session 17 saw sluice's 16-thread rounds fall to 0.5x then). Writes one JSON file (every run, per-round ratios, the summary) and prints
markdown tables. Exits non-zero, printing why, when either engine fails: no number is reported
without its peer.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CGROUP_ROOT = "/sys/fs/cgroup/memory"
CGROUP_V2_ROOT = "/sys/fs/cgroup"
# The full Kimi K3 (/work/shared/K3.md, section 1): 82,432 routed experts of 17,547,264 bytes, and
# 56.7 B other parameters in bf16. A cgroup of 1/3 of its expert bytes holds the spine and this
# share of the experts, which the slice's cgroup reproduces.
K3_EXPERT_BYTES = 82_432 * 17_547_264
K3_OTHER_BYTES = 113.4e9
K3_EXPERT_SHARE = 1 / 3 - K3_OTHER_BYTES / K3_EXPERT_BYTES


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
    """Reads every file once, into the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


def cache_only(own, other):
    """Drops the other engine's cached pages, then reads the running engine's files once: an
    in-memory run starts from its own model in the page cache, also where memory cannot hold
    both engines' files (there, reading both in turn left the first one read partly evicted: a
    sluice decode round ran at 0.75x, its experts read from disk again during the pass)."""
    drop_pages(other)
    warm_pages(own)


class Cgroup:
    """A fresh memory cgroup limited to `limit` bytes; children join it before exec. A v1
    memory controller (/sys/fs/cgroup/memory, as on the development VM) or cgroup v2 (the
    device host: a group under /sys/fs/cgroup with the memory controller enabled for it)."""

    def __init__(self, limit, tag):
        self.v2 = not os.access(CGROUP_ROOT, os.W_OK) and os.path.exists(
            os.path.join(CGROUP_V2_ROOT, "cgroup.controllers"))
        root = CGROUP_V2_ROOT if self.v2 else CGROUP_ROOT
        self.dir = os.path.join(root, f"peer-bench-{os.getpid()}-{tag}")
        try:
            if self.v2:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            os.mkdir(self.dir)
            name = "memory.max" if self.v2 else "memory.limit_in_bytes"
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(str(limit))
        except OSError as e:
            fail(f"cannot make a memory cgroup under {root} ({e}); the cgroup part needs a "
                 "writable v1 memory controller or cgroup v2 with its memory controller "
                 "(docs: /work/shared/MACHINE.md)")

    def join(self):
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def peak(self):
        """The group's peak charge, bytes (None where a v2 kernel has no memory.peak)."""
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            with open(os.path.join(self.dir, name)) as f:
                return int(f.read())
        except OSError:
            return None

    def pressure(self):
        """(times the charge hit the limit, OOM kills): v1 memory.failcnt and oom_control's
        oom_kill, v2 memory.events' max and oom_kill (0 where the kernel does not report it)."""
        if self.v2:
            events = {}
            with open(os.path.join(self.dir, "memory.events")) as f:
                for line in f:
                    k, v = line.split()
                    events[k] = int(v)
            return events.get("max", 0), events.get("oom_kill", 0)
        with open(os.path.join(self.dir, "memory.failcnt")) as f:
            failcnt = int(f.read())
        kills = 0
        try:
            with open(os.path.join(self.dir, "memory.oom_control")) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        kills = int(line.split()[1])
        except OSError:
            pass
        return failcnt, kills

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


TIMEOUT_S = None  # --timeout: the most seconds one process may take


def cpu_times():
    """(stolen, all) CPU jiffies of the whole machine so far, from /proc/stat (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice, counted in user/nice]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_share(before, after):
    """The share of the machine's CPU time stolen between two `cpu_times` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def run_json(cmd, env=None, cgroup=None):
    """Runs one fresh process and returns (its last stdout line as JSON, wall seconds); the
    JSON gets `_steal`, the share of CPU time stolen from the machine while it ran."""
    t0 = time.monotonic()
    c0 = cpu_times()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
                           preexec_fn=cgroup.join if cgroup else None)
    except subprocess.TimeoutExpired:
        fail(f"{os.path.basename(cmd[0])} ran past --timeout {TIMEOUT_S} s: {' '.join(cmd)[:400]}")
    wall = time.monotonic() - t0
    stolen = steal_share(c0, cpu_times())
    if p.returncode != 0:
        fail(f"{os.path.basename(cmd[0])} exited {p.returncode}: {p.stderr.strip()[-2000:]}\n"
             f"command: {' '.join(cmd)[:400]}")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    try:
        v = json.loads(lines[-1])
        v["_stderr"] = p.stderr
        v["_steal"] = stolen
        return v, wall
    except (IndexError, json.JSONDecodeError):
        fail(f"{os.path.basename(cmd[0])} printed no JSON line: {p.stdout[-500:]}")


def sluice(a, ids, n_new, cgroup=None):
    env = dict(os.environ, SLUICE_THREADS=str(a.threads))
    cmd = [a.sluice, "run", "--model", a.model, "--json", "--no-warm-start",
           "--prompt-ids", ",".join(map(str, ids)), "--max-new", str(n_new)]
    if cgroup:
        cmd += ["--memory", f"{a.sluice_memory >> 20}M"]
    v, wall = run_json(cmd, env, cgroup)
    st = v["stats"]
    plan = [l for l in v["_stderr"].splitlines() if "plan" in l.lower() or "spine" in l.lower()]
    return {"generated_ids": v["generated_ids"], "prefill_s": st["prefill_s"],
            "decode_s": st["decode_s"], "decode_passes": st["passes"] - st["prefill_passes"],
            "wall_s": wall, "load_s": v.get("load_s"), "plan": plan[:8],
            "steal_share": v["_steal"], "isa": v.get("isa")}


def peer(a, ids, n_new, cgroup=None):
    cmd = [a.peer_run, a.gguf, str(a.threads), str(n_new), ",".join(map(str, ids))]
    # In the cgroup, llama.cpp's weight repacking (extra buffer types, on by default; on an
    # AVX-512/AMX host it copies the weights into anonymous memory, and the process is OOM-killed)
    # is off, as a user running a model larger than memory would set it; in memory, its defaults.
    env = dict(os.environ, PEER_NO_REPACK="1") if cgroup and not a.peer_repack else None
    v, wall = run_json(cmd, env, cgroup)
    v["wall_s"] = wall
    v["steal_share"] = v.pop("_steal")
    del v["_stderr"]
    return v


def first_divergence(ref, got):
    for i, (r, g) in enumerate(zip(ref, got)):
        if r != g:
            return i
    return None if len(got) >= len(ref) else len(got)


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def rate(part, r, pp):
    """Tokens per second of a run's timed passes."""
    return pp / r["prefill_s"] if part == "prefill" else r["decode_passes"] / r["decode_s"]


def fmt_range(s, digits=2):
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True, help="release sluice binary")
    ap.add_argument("--model", required=True, help="`sluice synth` checkpoint directory")
    ap.add_argument("--gguf", required=True, help="the same checkpoint converted by llama.cpp")
    ap.add_argument("--peer-run", required=True, help="tools/peer/peer_run.cpp, built")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--tg", type=int, default=32, help="one-token passes timed in memory")
    ap.add_argument("--pp", type=int, default=256, help="prompt tokens of the prefill test")
    ap.add_argument("--cgroup-tg", type=int, default=8, help="one-token passes in the cgroup")
    ap.add_argument("--cgroup-bytes", type=int,
                    help="cgroup limit (default: the non-expert bytes + the share of the expert "
                    f"bytes a 1/3-of-the-experts cgroup leaves the full K3, {K3_EXPERT_SHARE:.3f})")
    ap.add_argument("--sluice-memory", type=int,
                    help="sluice's --memory in the cgroup, bytes (default: the limit - 256 MiB; "
                    "sluice's own default, 85%% of the limit - 512 MiB, is below the slice's "
                    "minimum there)")
    ap.add_argument("--peer-repack", action="store_true",
                    help="keep llama.cpp's weight repacking in the cgroup runs too")
    ap.add_argument("--parts", default="decode,prefill,cgroup")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds one process may take before the benchmark fails")
    ap.add_argument("--out", required=True, help="JSON file written")
    a = ap.parse_args()
    global TIMEOUT_S
    TIMEOUT_S = a.timeout
    parts = a.parts.split(",")
    for part in parts:
        if part not in ("decode", "prefill", "context", "cgroup"):
            fail(f"unknown part {part!r} (decode, prefill, context, cgroup)")

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    k3 = "text_config" in cfg  # K3's release nests the language model's config
    # K3: the tokenizer's ranks, below its 256 reserved specials; the other slices: every row.
    ranks = cfg["text_config"]["vocab_size"] - 256 if k3 else cfg["vocab_size"]
    if "cgroup" in parts and not k3 and not a.cgroup_bytes:
        fail(f"the default cgroup rule is the full Kimi K3's; a {cfg['architectures'][0]} slice "
             "needs --cgroup-bytes (or --parts decode,prefill)")
    expert, other = safetensors_bytes(a.model)
    shards = [os.path.join(a.model, f) for f in os.listdir(a.model) if f.endswith(".safetensors")]
    files = shards + [a.gguf]
    limit = a.cgroup_bytes or int(other + K3_EXPERT_SHARE * expert)
    a.sluice_memory = a.sluice_memory or limit - (256 << 20)
    rule = ("--cgroup-bytes (given)" if a.cgroup_bytes else
            f"non-expert bytes + {K3_EXPERT_SHARE:.4f} x expert bytes (the full K3's 1/3-of-the-"
            f"experts cgroup holds its {K3_OTHER_BYTES / 1e9:.1f} GB spine and "
            f"{100 * K3_EXPERT_SHARE:.1f}% of its {K3_EXPERT_BYTES / 1e9:.1f} GB of experts)")
    short = prompt_ids(8, ranks, 1)
    long = prompt_ids(a.pp, ranks, 2)
    res = {"architecture": cfg["architectures"][0], "threads": a.threads, "runs": a.runs, "expert_bytes": expert, "other_bytes": other,
           "gguf_bytes": os.path.getsize(a.gguf), "cgroup_bytes": limit, "cgroup_rule": rule,
           "tg": a.tg, "pp": a.pp, "cgroup_tg": a.cgroup_tg, "prompt_ids": short,
           "sluice_cgroup_memory": a.sluice_memory, "rounds": [], "runs_raw": []}
    print(f"peer_bench: experts {expert / 1e9:.3f} GB, other {other / 1e9:.3f} GB, gguf "
          f"{res['gguf_bytes'] / 1e9:.3f} GB, {a.threads} threads", file=sys.stderr)
    if "cgroup" in parts:
        print(f"peer_bench: cgroup limit {limit / 1e9:.3f} GB = {rule}; the literal 1/3 of the "
              f"slice's experts would be {expert / 3e9:.3f} GB, "
              f"{'less' if expert / 3 < other else 'more'} than its {other / 1e9:.3f} GB spine; "
              f"sluice there: --memory {a.sluice_memory >> 20}M", file=sys.stderr)

    def record(rnd, part, engine, r):
        r.update(part=part, engine=engine, round=rnd)
        res["runs_raw"].append(r)
        with open(a.out + ".partial", "w") as f:  # what an interrupted run leaves
            json.dump(res, f, indent=1)
        st = r.get("steal_share")
        print(f"  round {rnd} {part:8s} {engine:9s} prefill {r['prefill_s']:.3f}s decode "
              f"{r['decode_s']:.3f}s/{r['decode_passes']} passes, wall {r['wall_s']:.1f}s, "
              f"stolen {'-' if st is None else f'{100 * st:.1f}%'}", file=sys.stderr)

    reference = {}  # sluice's greedy ids per prompt: the same in every run, or the script fails
    for rnd in range(a.runs):
        load = {"before": os.getloadavg()}
        print(f"peer_bench: round {rnd + 1}/{a.runs}, load average {load['before']}",
              file=sys.stderr)
        jobs = []
        if "decode" in parts:
            jobs.append(("decode", short, a.tg + 1, False))
        if "prefill" in parts:
            jobs.append(("prefill", long, 1, False))
        if "context" in parts:
            jobs.append(("context", long, a.tg + 1, False))
        if "cgroup" in parts:
            jobs.append(("cgroup", short, a.cgroup_tg + 1, True))
        rr = {"round": rnd + 1, "load": load, "ratio": {}, "divergence": {}}
        for part, ids, n_new, limited in jobs:
            got = {}
            for engine, fn in (("sluice", sluice), ("llama.cpp", peer)):
                cg = None
                if limited:
                    drop_pages(files)
                    cg = Cgroup(limit, f"{rnd}-{engine}")
                elif engine == "sluice":
                    cache_only(shards, [a.gguf])
                else:
                    cache_only([a.gguf], shards)
                try:
                    r = fn(a, ids, n_new, cg)
                    if cg:
                        r["cgroup_peak_bytes"] = cg.peak()
                        r["cgroup_limit_hits"], r["cgroup_oom_kills"] = cg.pressure()
                finally:
                    if cg:
                        cg.remove()
                record(rnd + 1, part, engine, r)
                got[engine] = r
            s_ids, p_ids = got["sluice"]["generated_ids"], got["llama.cpp"]["generated_ids"]
            # the long and the short prompt
            key = "prefill" if part in ("prefill", "context") else "decode"
            ref = reference.setdefault(key, s_ids)
            n = min(len(ref), len(s_ids))
            if s_ids[:n] != ref[:n]:
                fail(f"sluice's greedy ids differ between runs (round {rnd + 1}, {part}): "
                     f"{s_ids} vs {ref}")
            rr["divergence"][part] = first_divergence(s_ids, p_ids)
            rr.setdefault("llama_cpp_ids", {})[part] = p_ids
            rr["ratio"][part] = rate(part, got["sluice"], a.pp) / rate(part, got["llama.cpp"], a.pp)
        load["after"] = os.getloadavg()
        res["rounds"].append(rr)
        print(f"peer_bench: round {rnd + 1} ratios {rr['ratio']}, llama.cpp's first differing "
              f"step {rr['divergence']}, load after {load['after']}", file=sys.stderr)

    res["sluice_ids"] = reference
    out = {}
    for part in ("decode", "prefill", "context", "cgroup"):
        rs = {e: [rate(part, r, a.pp) for r in res["runs_raw"] if r["part"] == part and
                  r["engine"] == e] for e in ("sluice", "llama.cpp")}
        if rs["sluice"] and rs["llama.cpp"]:
            out[part] = {e: summary(v) for e, v in rs.items()}
            out[part]["ratio"] = summary([rr["ratio"][part] for rr in res["rounds"]])
    res["summary"] = out
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    try:
        os.remove(a.out + ".partial")
    except OSError:
        pass

    names = {"decode": f"decode tg{a.tg}, in memory", "prefill": f"prefill pp{a.pp}, in memory",
             "context": f"decode tg{a.tg} after pp{a.pp}, in memory",
             "cgroup": f"decode tg{a.cgroup_tg}, cgroup {limit / 1e9:.2f} GB"}
    print(f"\n{a.runs} interleaved rounds, {a.threads} threads; tok/s and the per-round ratio, "
          "median (min–max):\n")
    print("| test | sluice tok/s | llama.cpp tok/s | sluice / llama.cpp |")
    print("|---|---|---|---|")
    for part, r in out.items():
        print(f"| {names[part]} | {fmt_range(r['sluice'], 3)} | {fmt_range(r['llama.cpp'], 3)} "
              f"| **{fmt_range(r['ratio'])}×** |")
    # Which instruction sets ran: sluice's kernel tier (its `run --json`) and llama.cpp's
    # build (its system_info), from the first run of each.
    isas = {e: next((r[k] for r in res["runs_raw"] if r.get("engine") == e and r.get(k)),
                    None) for e, k in (("sluice", "isa"), ("llama.cpp", "system_info"))}
    print(f"\nsluice kernels: {isas['sluice'] or 'not reported'}; llama.cpp built with: "
          f"{(isas['llama.cpp'] or 'not reported').strip()}")
    print("\nPer round (load average before → after; the most CPU time stolen from the machine "
          "during one of the round's runs; the first step, from 0, where llama.cpp's greedy id "
          "differs from sluice's, per test in the order of the columns; none: equal):\n")
    cols = [p for p in ("decode", "prefill", "context", "cgroup") if p in out]
    print("| round | load | stolen | " + " | ".join(f"{p} ratio" for p in cols)
          + " | first differing step |")
    print("|---|---|---|" + "---|" * len(cols) + "---|")
    for rr in res["rounds"]:
        ld = f"{rr['load']['before'][0]:.1f} → {rr['load']['after'][0]:.1f}"
        steals = [r["steal_share"] for r in res["runs_raw"]
                  if r.get("round") == rr["round"] and r.get("steal_share") is not None]
        st = f"{100 * max(steals):.1f}%" if steals else "–"
        div = " / ".join("none" if d is None else str(d) for d in rr["divergence"].values())
        print(f"| {rr['round']} | {ld} | {st} | "
              + " | ".join(f"{rr['ratio'][p]:.2f}×" for p in cols) + f" | {div or '–'} |")
    if "cgroup" in out:
        print(f"\ncgroup: {limit} bytes = {rule}; sluice --memory {a.sluice_memory >> 20}M")


if __name__ == "__main__":
    main()
