#!/usr/bin/env bash
# Streaming benchmark of one slice (issues 3, 15, 16) in a memory cgroup at least 3x smaller than
# the slice: every `sluice bench` run is a fresh process inside the group, decode cold
# (posix_fadvise only) and warm, configurations `default` and `noprefetch` interleaved, each run
# checked against the oracle. On a cgroup-v2 host (the device) the runs are started inside a v2
# group limited to LIMIT bytes (`sluice bench --cgroup-limit` needs v1); on a v1 host `sluice bench
# --cgroup-limit LIMIT` makes the group. Needs root (writes /sys/fs/cgroup). Ends by printing the
# summary (tools/bench_stream_summary.py OUT), whose last table has one row per configuration,
# labelled LABEL, ready to paste next to another run's rows (before / after a change).
#
#   tools/bench_stream_v2.sh /var/tmp/k3slice /tmp/stream-bench
#   SLUICE=/tmp/old/sluice LABEL=before tools/bench_stream_v2.sh /tmp/qw OUT/qw-before
#
# Env: SLUICE (target/release/sluice), RATIO (slice ÷ cgroup, 4; at least 3), LIMIT (cgroup
# bytes; default the slice's bytes ÷ RATIO, refused when it is not 3x smaller than the slice),
# MEMORY (--memory; default 90% of LIMIT, the rest for the process's own pages outside the plan),
# THREADS (SLUICE_THREADS, 8), RUNS (3), MAX_NEW (16), PROMPT_LEN (8), PHASES ("cold warm"),
# PROBE (storage probe bytes, sluice bench's default when unset), CGROUP (v1 | v2 | auto: v1
# when /sys/fs/cgroup/memory is writable), LABEL (row label in the summary, the OUT name).
set -euo pipefail
MODEL=$1 OUT=$2
SLUICE=${SLUICE:-target/release/sluice} RATIO=${RATIO:-4} THREADS=${THREADS:-8}
RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-16} PROMPT_LEN=${PROMPT_LEN:-8} PHASES=${PHASES:-cold warm}
CGROUP=${CGROUP:-auto} LABEL=${LABEL:-$(basename "$OUT")}
mkdir -p "$OUT"
if [ "$CGROUP" = auto ]; then
  if [ -w /sys/fs/cgroup/memory ]; then CGROUP=v1; else CGROUP=v2; fi
fi
bytes=$(du -sb "$MODEL" | cut -f1)
if [ "$RATIO" -lt 3 ]; then echo "RATIO=$RATIO: the cgroup must be at least 3x smaller" >&2; exit 2; fi
LIMIT=${LIMIT:-$((bytes / RATIO))}
if [ $((LIMIT * 3)) -gt "$bytes" ]; then
  echo "LIMIT=$LIMIT is not 3x smaller than the slice ($bytes bytes): at most $((bytes / 3))" >&2
  exit 2
fi
MEMORY=${MEMORY:-$((LIMIT * 9 / 10))}
ratio=$(python3 -c "print(f'{$bytes / $LIMIT:.2f}')")
echo "$LABEL: slice $bytes bytes, cgroup $LIMIT bytes ($ratio x smaller), --memory $MEMORY, $CGROUP" \
  | tee "$OUT/setup.txt"
printf '%s\n' "$LABEL" > "$OUT/label.txt"
common=(--model "$MODEL" --memory "$MEMORY" --json --prompt-len "$PROMPT_LEN" --max-new "$MAX_NEW"
        --config default= --config noprefetch=--no-prefetch --runs "$RUNS")
[ -n "${PROBE:-}" ] && common+=(--probe-bytes "$PROBE")
CG=/sys/fs/cgroup/sluice-bench
if [ "$CGROUP" = v2 ]; then
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir -p "$CG" && echo "$LIMIT" > "$CG/memory.max"
fi
run() {
  local part=$1; shift
  uptime > "$OUT/$part.load"
  if [ "$CGROUP" = v1 ]; then
    SLUICE_THREADS=$THREADS "$SLUICE" bench "$@" --cgroup-limit "$LIMIT" > "$OUT/$part.json"
  else
    sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" env SLUICE_THREADS="$THREADS" \
      "$SLUICE" bench "$@" > "$OUT/$part.json"
  fi
  uptime >> "$OUT/$part.load"
}
for phase in $PHASES; do
  case $phase in
    cold) run decode-cold "${common[@]}" --cold --fadvise-only ;;
    warm) run decode-warm "${common[@]}" ;;
    *) echo "unknown phase $phase (cold | warm)" >&2; exit 2 ;;
  esac
done
if [ "$CGROUP" = v2 ]; then cat "$CG/memory.peak" 2>/dev/null > "$OUT/memory.peak" || true; fi
python3 "$(dirname "$0")/bench_stream_summary.py" "$OUT" | tee "$OUT/summary.md"
