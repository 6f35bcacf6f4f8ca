#!/usr/bin/env bash
# Streaming benchmark of issue 3 (docs/PERFORMANCE.md): a K3 slice at least 3x larger than a
# memory cgroup, decode cold and warm (gated prefetch vs none) and a 256-token prefill, every
# run a fresh process checked against the oracle tokens, the storage probed in the same run.
# Writes one JSON file per part into $OUT; summarise with tools/bench_stream_summary.py.
#
#   tools/bench_stream.sh /tmp/k3slice /tmp/stream-bench
#
# Env: SLUICE (target/release/sluice), LIMIT (cgroup bytes, 4.5 GiB), RUNS (3), PRE_RUNS (2),
# PARTS (decode-cold decode-warm prefill).
set -euo pipefail
MODEL=$1 OUT=$2
SLUICE=${SLUICE:-target/release/sluice} LIMIT=${LIMIT:-4831838208}
RUNS=${RUNS:-3} PRE_RUNS=${PRE_RUNS:-2} PARTS=${PARTS:-decode-cold decode-warm prefill}
mkdir -p "$OUT"
common=(--model "$MODEL" --cgroup-limit "$LIMIT" --json)
decode=(--config gated= --config noprefetch=--no-prefetch --prompt-len 8 --max-new 8 --runs "$RUNS")
for part in $PARTS; do
  uptime > "$OUT/$part.load"
  case $part in
    decode-cold) "$SLUICE" bench "${common[@]}" "${decode[@]}" --cold > "$OUT/$part.json" ;;
    decode-warm) "$SLUICE" bench "${common[@]}" "${decode[@]}" > "$OUT/$part.json" ;;
    prefill) "$SLUICE" bench "${common[@]}" --config whole= --prompt-len 256 --max-new 2 \
               --runs "$PRE_RUNS" --cold > "$OUT/$part.json" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
  uptime >> "$OUT/$part.load"
done
