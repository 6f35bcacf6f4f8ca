#!/usr/bin/env bash
# Streamed decode of the Qwen3-MoE and GPT-OSS slices (issue 15) in a memory cgroup at least 3×
# smaller than the slice, with next-layer prefetch (`default`) and without it (`noprefetch`, what
# these families ran before they guessed), for a disk-bound host such as the 16-core device
# machine. Synthesizes both slices itself under OUT (nothing big travels), then for each:
# `sluice bench` cold (posix_fadvise only), RUNS runs per configuration, every run a fresh process
# checked against the first run's tokens; the storage probe runs before and after in the same
# process. On a cgroup-v2 host every run starts inside /sys/fs/cgroup/sluice-families (needs
# root); on a cgroup-v1 host (no /sys/fs/cgroup/cgroup.controllers) the same limit is set through
# `sluice bench --cgroup-limit`, so the script also runs on the development machine.
# Deletes each slice after its runs (KEEP=1 keeps them).
#
#   tools/bench_stream_families.sh target/release/sluice /tmp/stream-families
#
# Per slice, OUT/<slice>.json holds every run and the summary (decode s/pass, the probed bound and
# their ratio, prefill bytes ÷ distinct routed bytes); OUT/<slice>.load the load average before
# and after; OUT/<slice>.peak the v2 cgroup's memory.peak.
#
# Env: RUNS (3), MAX_NEW (24: the prefetch gate opens after ~10 passes of precise guesses),
# THREADS (SLUICE_THREADS, all cores), PROBE (probe bytes, 2G),
# QWEN_LAYERS (1) and GPTOSS_LAYERS (2): slice depths (4.76 GiB and 3.34 GiB with --ranks 8192);
# SMALL=1 skips the 3× check (a quick test of the script with small limits); SLICES picks
# which to run (default "qwen3-moe-slice gpt-oss-slice").
set -euo pipefail
SLUICE=$1 OUT=$2
RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-24} THREADS=${THREADS:-$(nproc)} PROBE=${PROBE:-2G}
QWEN_LAYERS=${QWEN_LAYERS:-1} GPTOSS_LAYERS=${GPTOSS_LAYERS:-2}
mkdir -p "$OUT"
CG=/sys/fs/cgroup/sluice-families
V2=0
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  V2=1
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir -p "$CG"
fi

# name preset layers --memory cgroup-limit(bytes) prompt-len
slices=(
  "qwen3-moe-slice qwen3-moe-slice $QWEN_LAYERS 1280M $((1536 << 20)) 8"
  "gpt-oss-slice gpt-oss-slice $GPTOSS_LAYERS 1G $((1120 << 20)) 16"
)
for line in "${slices[@]}"; do
  read -r name preset layers memory limit prompt <<< "$line"
  case " ${SLICES:-qwen3-moe-slice gpt-oss-slice} " in *" $name "*) ;; *) continue ;; esac
  model=$OUT/model-$name
  [ -f "$model/config.json" ] || "$SLUICE" synth --preset "$preset" --layers "$layers" \
    --ranks 8192 --out "$model"
  size=$(du -sb "$model" | cut -f1)
  if [ $((size / limit)) -lt 3 ] && [ "${SMALL:-0}" != 1 ]; then
    echo "$name: slice $size B is not 3x the cgroup limit $limit B" >&2
    exit 1
  fi
  args=(bench --model "$model" --memory "$memory" --json --prompt-len "$prompt"
        --max-new "$MAX_NEW" --runs "$RUNS" --cold --fadvise-only --probe-bytes "$PROBE"
        --config default= --config noprefetch=--no-prefetch)
  uptime > "$OUT/$name.load"
  if [ "$V2" = 1 ]; then
    echo "$limit" > "$CG/memory.max"
    echo 0 > "$CG/memory.peak" 2>/dev/null || true
    sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" env SLUICE_THREADS="$THREADS" \
      "$SLUICE" "${args[@]}" > "$OUT/$name.json"
    cat "$CG/memory.peak" > "$OUT/$name.peak" 2>/dev/null || true
  else
    SLUICE_THREADS="$THREADS" "$SLUICE" "${args[@]}" --cgroup-limit "$limit" > "$OUT/$name.json"
  fi
  uptime >> "$OUT/$name.load"
  echo "$name: slice $size B, cgroup $limit B ($((size / limit))x) -> $OUT/$name.json"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$model"
done
