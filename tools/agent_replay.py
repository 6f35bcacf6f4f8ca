#!/usr/bin/env python3
"""Agent replay: a recorded coding-agent session replayed against `sluice serve` through the
OpenAI chat API, in three conditions, reporting per turn the time to first token, the prompt
tokens prefilled and restored, the expert bytes read and the bytes written to the state cache.

    python3 tools/agent_replay.py --sluice target/release/sluice [--model DIR] [--memory 4G] \
        [--session tools/workloads/agent_session.json] [--max-tokens 8] [--runs 3] [--json OUT]

Conditions (each starts its own servers on a free port, with a fresh state-cache directory):
  none     `--session-memory 0`, no `--state-cache`: every turn prefills its whole prompt.
  warm     one server with in-process reuse and `--state-cache`: turn k resumes from turn k-1's
           state held in memory and prefills the rest.
  restart  a new server process for every turn on the same `--state-cache` directory: turn k
           resumes from the state turn k-1's server wrote to disk and prefills the same rest.
The ratio restart / warm of each turn's TTFT is what a restart costs (target <= 1.1).
`--conditions warm,restart` runs a subset and `--turns N` the first N turns (each finished turn
is also printed to stderr as it ends, so a run cut short keeps what it measured); `--serve-arg --state-cache-every --serve-arg N` sets
the snapshot interval under test; `--request '{"tool_choice": "required"}'` adds fields to every
request (a trailing tool-choice message: the prompt's end is then no prefix of the next turn).

With --k3-bytes, each turn also reports the state files it wrote (prefix length of each, read
from the file's header) and what the same files would weigh for the full Kimi K3 (69 KDA layers
of fixed state, 24 MLA layers of 576 f32 per position, a 163,840-entry logits row at prompt ends;
the state-file layout of crates/sluice-engine/src/state_file.rs), so the interval's disk cost
on K3 is read off a replay of the small model.

Figures come from each response's `sluice` object (engine-side TTFT from the start of the job,
restore included). Greedy, so every condition must generate the same tokens (checked). Medians
over --runs repetitions of the whole replay. Only the standard library is used.
"""

import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request


class Server:
    """One `sluice serve` child on a free port."""

    def __init__(self, a, extra):
        cmd = [a.sluice, "serve", "--port", "0", "--max-tokens", str(max(a.max_tokens, 1))]
        if a.model:
            cmd += ["--model", a.model]
        if a.memory:
            cmd += ["--memory", a.memory]
        base = list(a.serve_arg)
        # A condition's own flag replaces the same flag among --serve-arg (the `none` condition's
        # `--session-memory 0`): sluice refuses a flag given twice.
        for flag in extra[::2]:
            while flag in base:
                i = base.index(flag)
                del base[i:i + 2]
        cmd += base + extra
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.log = []
        for line in self.p.stderr:
            self.log.append(line)
            m = re.search(r"on http://(\S+)", line)
            if m:
                self.url = f"http://{m.group(1)}/v1"
                break
        else:
            raise SystemExit("sluice serve exited:\n" + "".join(self.log))
        # Keep reading the server's log (its last lines kept): a pipe nobody reads fills up and
        # blocks the server at its next log line (prefill progress is logged while it runs).
        self.log = collections.deque(self.log, maxlen=200)
        threading.Thread(target=lambda: self.log.extend(self.p.stderr), daemon=True).start()
        self.model = json.loads(urllib.request.urlopen(self.url + "/models").read())["data"][0]["id"]

    def chat(self, session, k, max_tokens, extra=None):
        messages = [{"role": "system", "content": session["system"]}]
        for t in session["turns"][:k + 1]:
            messages += t["append"]
        body = {"model": self.model, "messages": messages, "tools": session["tools"],
                "max_tokens": max_tokens, "temperature": 0, **(extra or {})}
        req = urllib.request.Request(self.url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        r = json.loads(urllib.request.urlopen(req, timeout=3600).read())
        return r["sluice"]

    def stop(self):
        self.p.terminate()
        self.p.wait()


def state_files(cache):
    """{name: (prefix tokens, has logits)} of the complete state files in `cache`."""
    out = {}
    for name in os.listdir(cache):
        if name.endswith(".state"):
            with open(os.path.join(cache, name), "rb") as f:
                h = f.read(88)
            if len(h) == 88:
                out[name] = (int.from_bytes(h[44:52], "little"), int.from_bytes(h[84:88], "little") & 1)
    return out


def k3_file_bytes(n, logits):
    """Bytes of a state file of n positions of the full Kimi K3 (state file version 2)."""
    snap = 13 + 69 * (25 + 4 * (96 * 128 * 128 + 3 * 3 * 12288)) + 24 * (9 + 4 * 576 * n)
    body = 4 * n + (8 + 4 * 163840 if logits else 0) + 8 + snap
    return 100 + body + 32 * -(-body // (4 << 20)) + 32


def replay(a, session, condition):
    cache = tempfile.mkdtemp(prefix="sluice-agent-")
    disk = ["--state-cache", cache]
    rows = []
    try:
        if condition == "none":
            extra, per_turn = ["--session-memory", "0"], False
        elif condition == "warm":
            extra, per_turn = disk, False
        else:
            extra, per_turn = disk, True
        srv = None if per_turn else Server(a, extra)
        seen = {}
        for k in range(len(session["turns"])):
            s = Server(a, extra) if per_turn else srv
            x = s.chat(session, k, a.max_tokens, json.loads(a.request))
            if per_turn:
                s.stop()  # SIGTERM: queued state writes finish before the process ends
            files = state_files(cache) if condition != "none" else {}
            new = sorted(v for f, v in files.items() if f not in seen)
            seen = files
            rows.append({
                "turn": k + 1,
                "ttft_s": x["ttft_s"],
                "prompt_tokens": x["prompt_tokens"],
                "prefilled": x["prefill_tokens"],
                "restored_memory": x["cached_tokens"] - x["state_cache_tokens_restored"],
                "restored_disk": x["state_cache_tokens_restored"],
                "expert_bytes_read": x["expert_bytes_read"],
                "state_bytes_written": x["state_cache_bytes_written"],
                "generated_ids": x["generated_ids"],
                "state_files": new,
                "k3_state_bytes": sum(k3_file_bytes(n, l) for n, l in new),
            })
            r = rows[-1]
            # One line per turn as it finishes, so a run cut short by a time limit keeps its turns.
            print(f"[{condition}] turn {r['turn']}: prompt {r['prompt_tokens']} tokens, TTFT "
                  f"{r['ttft_s']:.3f} s, prefilled {r['prefilled']}, restored "
                  f"{r['restored_memory']}+{r['restored_disk']}, expert bytes read "
                  f"{r['expert_bytes_read']}, state bytes written {r['state_bytes_written']}",
                  file=sys.stderr, flush=True)
        if srv:
            srv.stop()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True, help="the sluice binary")
    ap.add_argument("--model", help="checkpoint directory (default: the built-in mini-K3)")
    ap.add_argument("--memory", help="--memory for the servers (e.g. 4G)")
    ap.add_argument("--session", default=os.path.join(os.path.dirname(__file__), "workloads", "agent_session.json"))
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens generated per turn")
    ap.add_argument("--runs", type=int, default=3, help="repetitions of the whole replay (medians)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `sluice serve` argument (repeatable)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--request", default="{}", help="JSON object of fields added to every request")
    ap.add_argument("--conditions", default="none,warm,restart", help="comma-separated subset")
    ap.add_argument("--turns", type=int, help="replay only the session's first N turns")
    ap.add_argument("--k3-bytes", action="store_true", help="also print the files each turn wrote")
    a = ap.parse_args()
    session = json.load(open(a.session))
    if a.turns:
        session["turns"] = session["turns"][:a.turns]
    runs = {c: [] for c in a.conditions.split(",")}
    for _ in range(a.runs):
        for c in runs:  # interleaved, so drift in the machine hits every condition alike
            runs[c].append(replay(a, session, c))
    first = next(iter(runs))
    ids = [r["generated_ids"] for rows in runs[first] for r in rows]
    for c, reps in runs.items():
        got = [r["generated_ids"] for rows in reps for r in rows]
        if got != ids[:len(got)] or len(got) != len(ids):
            sys.exit(f"condition {c} generated different tokens: not exact")
    med = lambda c, t, key: statistics.median(rows[t][key] for rows in runs[c])
    if set(runs) == {"none", "warm", "restart"}:
        print("| turn | prompt tokens | TTFT none (s) | TTFT warm (s) | TTFT restart (s) | restart / warm "
              "| prefilled none / warm / restart | restored warm (mem+disk) / restart (disk) "
              "| expert bytes read none / warm / restart | state bytes written warm / restart |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for t in range(len(session["turns"])):
            r0 = runs["none"][0][t]
            w, s = runs["warm"][0][t], runs["restart"][0][t]
            tw, ts = med("warm", t, "ttft_s"), med("restart", t, "ttft_s")
            print(f"| {t + 1} | {r0['prompt_tokens']} | {med('none', t, 'ttft_s'):.3f} | {tw:.3f} | {ts:.3f} "
                  f"| {ts / tw:.2f} | {r0['prefilled']} / {w['prefilled']} / {s['prefilled']} "
                  f"| {w['restored_memory']}+{w['restored_disk']} / {s['restored_disk']} "
                  f"| {med('none', t, 'expert_bytes_read'):.0f} / {med('warm', t, 'expert_bytes_read'):.0f} / "
                  f"{med('restart', t, 'expert_bytes_read'):.0f} "
                  f"| {w['state_bytes_written']} / {s['state_bytes_written']} |")
    else:
        for c in runs:
            print(f"{c}: turn | prompt tokens | TTFT s (median) [runs] | prefilled | restored (mem+disk) "
                  f"| state bytes written | files written (prefix tokens) | full-K3 bytes of those files")
            for t in range(len(session["turns"])):
                r = runs[c][0][t]
                print(f"{c}: {t + 1} | {r['prompt_tokens']} | {med(c, t, 'ttft_s'):.3f} "
                      f"{[round(rows[t]['ttft_s'], 3) for rows in runs[c]]} | {r['prefilled']} "
                      f"| {r['restored_memory']}+{r['restored_disk']} | {r['state_bytes_written']} "
                      f"| {[n for n, _ in r['state_files']]} | {r['k3_state_bytes']} ")
    if a.json:
        json.dump(runs, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
