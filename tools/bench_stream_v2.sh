#!/usr/bin/env bash
# Streaming benchmark of issue 3 on a machine with cgroup v2 (where `sluice bench --cgroup-limit`,
# which needs v1, cannot be used): every `sluice bench` run is started inside a v2 memory cgroup
# limited to LIMIT bytes; decode cold (posix_fadvise only) and warm, configurations `default` and
# `noprefetch`, each run a fresh process checked against the oracle. Needs root (writes
# /sys/fs/cgroup). Summarise with tools/bench_stream_summary.py OUT.
#
#   tools/bench_stream_v2.sh /var/tmp/k3slice /tmp/stream-bench
#
# Env: SLUICE (target/release/sluice), LIMIT (4.5 GiB), MEMORY (--memory, 3400M), THREADS
# (SLUICE_THREADS, 8), RUNS (3), MAX_NEW (16).
set -euo pipefail
MODEL=$1 OUT=$2
SLUICE=${SLUICE:-target/release/sluice} LIMIT=${LIMIT:-4831838208} MEMORY=${MEMORY:-3400M}
THREADS=${THREADS:-8} RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-16}
mkdir -p "$OUT"
CG=/sys/fs/cgroup/sluice-bench
echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
mkdir -p "$CG" && echo "$LIMIT" > "$CG/memory.max"
common=(--model "$MODEL" --memory "$MEMORY" --json --prompt-len 8 --max-new "$MAX_NEW"
        --config default= --config noprefetch=--no-prefetch --runs "$RUNS")
run() {
  local part=$1; shift
  uptime > "$OUT/$part.load"
  sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" env SLUICE_THREADS="$THREADS" \
    "$SLUICE" bench "$@" > "$OUT/$part.json"
  uptime >> "$OUT/$part.load"
}
run decode-cold "${common[@]}" --cold --fadvise-only
run decode-warm "${common[@]}"
cat "$CG/memory.peak" 2>/dev/null > "$OUT/memory.peak" || true
