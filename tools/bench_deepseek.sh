#!/usr/bin/env bash
# Streaming benchmark of issue 16 for the DeepSeek-V3 architecture: synthesizes a DeepSeek V3
# slice (FP8 experts) and a Kimi K2 Thinking slice (INT4 experts) at real per-layer dimensions,
# and streams each in a memory cgroup at least 3x smaller than the slice, reporting decode
# s/pass and its ratio to the storage bound probed in the same run, prefill read bytes / distinct
# routed bytes, and the full-model equivalent s/token next to its storage bound. One slice at a
# time, deleted after it is measured (nothing big leaves the machine). Needs root for the cgroup.
#
#   tools/bench_deepseek.sh SLUICE OUT [deepseek-v3-slice] [kimi-k2-slice]
#
# SLUICE: a release `sluice` binary. OUT: a directory on the disk to measure (the slices are
# written there, then removed; the results stay). Each preset fits one 10-minute command on a
# 16-core host with a 1.6-2 GB/s disk; name one preset per call to split them.
#
# Env: LAYERS (MoE layers, 2), EXPERTS (routed experts per layer; default the published 256 /
# 384), RANKS (tokenizer ranks, 4096), RUNS (3), MAX_NEW (16), PROMPT_LEN (8), THREADS (threads
# per run, 8), CGROUP (v1 | v2 | auto: v1 when /sys/fs/cgroup/memory is writable), RATIO (slice ÷
# cgroup, 4; at least 3), PHASES ("cold warm"), NOPREFETCH (1: also a --no-prefetch configuration),
# PROBE (storage probe bytes, 2G), KEEP (1: keep the slice), LABEL (row label of the summary's
# one-line-per-configuration table, the preset; e.g. before / after). Summarise a result with:
# python3 tools/bench_deepseek_summary.py OUT (several OUTs: python3 tools/bench_stream_summary.py
# OUT/PRESET ... prints every run's rows in one table).
set -euo pipefail
SLUICE=$(realpath "$1") OUT=$2
shift 2
PRESETS=("$@")
[ ${#PRESETS[@]} -eq 0 ] && PRESETS=(deepseek-v3-slice kimi-k2-slice)
LAYERS=${LAYERS:-2} RANKS=${RANKS:-4096} RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-16}
PROMPT_LEN=${PROMPT_LEN:-8} THREADS=${THREADS:-8} CGROUP=${CGROUP:-auto} KEEP=${KEEP:-0}
RATIO=${RATIO:-4} PHASES=${PHASES:-cold warm} NOPREFETCH=${NOPREFETCH:-1} PROBE=${PROBE:-2G}
mkdir -p "$OUT"
if [ "$RATIO" -lt 3 ]; then echo "RATIO=$RATIO: the cgroup must be at least 3x smaller" >&2; exit 2; fi
if [ "$CGROUP" = auto ]; then
  if [ -w /sys/fs/cgroup/memory ]; then CGROUP=v1; else CGROUP=v2; fi
fi

model=
# A slice is big: never leave one behind, also when a step fails (unless KEEP=1).
trap '[ "$KEEP" = 1 ] || [ -z "$model" ] || rm -rf "$model"' EXIT
for preset in "${PRESETS[@]}"; do
  model="$OUT/model-$preset" res="$OUT/$preset"
  mkdir -p "$res"
  experts_arg=()
  [ -n "${EXPERTS:-}" ] && experts_arg=(--experts "$EXPERTS")
  "$SLUICE" synth --preset "$preset" --out "$model" --layers "$LAYERS" --ranks "$RANKS" \
    "${experts_arg[@]}" > "$res/synth.txt" 2>&1
  "$SLUICE" inspect "$model" > "$res/inspect.txt"
  "$SLUICE" verify "$model" > "$res/verify.txt"
  bytes=$(du -sb "$model" | cut -f1)
  # The cgroup: 1/RATIO of the slice (>= 3x smaller); --memory leaves 10% of it to the
  # process's own pages outside the plan.
  limit=$((bytes / RATIO)) memory=$((bytes / RATIO * 9 / 10))
  echo "$preset: slice $bytes bytes, cgroup $limit, --memory $memory, $CGROUP" | tee "$res/setup.txt"
  printf '%s\n' "${LABEL:-$preset}" > "$res/label.txt"
  common=(--model "$model" --memory "$memory" --json --prompt-len "$PROMPT_LEN"
          --max-new "$MAX_NEW" --runs "$RUNS" --probe-bytes "$PROBE" --config default=)
  [ "$NOPREFETCH" = 1 ] && common+=(--config noprefetch=--no-prefetch)
  for phase in $PHASES; do
    extra=()
    [ "$phase" = cold ] && extra=(--cold --fadvise-only)
    uptime > "$res/decode-$phase.load"
    if [ "$CGROUP" = v1 ]; then
      SLUICE_THREADS=$THREADS "$SLUICE" bench "${common[@]}" "${extra[@]}" \
        --cgroup-limit "$limit" > "$res/decode-$phase.json"
    else
      cg=/sys/fs/cgroup/sluice-bench-ds
      echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
      mkdir -p "$cg" && echo "$limit" > "$cg/memory.max"
      sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" env SLUICE_THREADS="$THREADS" \
        "$SLUICE" bench "${common[@]}" "${extra[@]}" > "$res/decode-$phase.json"
      cat "$cg/memory.peak" > "$res/memory-$phase.peak" 2>/dev/null || true
    fi
    uptime >> "$res/decode-$phase.load"
  done
  [ "$KEEP" = 1 ] || rm -rf "$model"
done
python3 "$(dirname "$0")/bench_deepseek_summary.py" "$OUT" | tee "$OUT/summary.txt"
