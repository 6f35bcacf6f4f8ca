#!/usr/bin/env bash
# Issues 18/19 on a Kimi K3 slice at real dimensions (docs/PERFORMANCE.md, "K3 slice: warm starts, the
# workload suite and the agent replay"). Synthesizes its own slice in OUT_DIR, then, by PARTS:
#   warm    first 32 tokens after a restart with and without the saved hot set: skewed routing, cold page
#           cache (posix_fadvise), a memory cgroup the hot set fits in but the slice does not; 3 runs each,
#           interleaved, after one priming run that writes the hot set
#   suite   the workload suite (prose code long chat tools) streamed in a cgroup 3x smaller than the slice
#   replay  the agent replay (tools/agent_replay.py: no cache / warm in-process / after restart)
# Usage: tools/k3_slice_measure.sh SLUICE OUT_DIR      (Linux, root: a writable v1 memory cgroup, or v2)
# Env: LAYERS (2) EXPERTS (64) SKEW (1: --route-skew) PARTS ("warm suite replay") RUNS (3) NEW (32)
#      WORKLOADS ("prose code long chat tools") MEMORY / CGROUP (default: a third of the slice)
#      CONDITIONS (the replay's conditions, "none,warm,restart"; a subset fits a shorter run)
#      TURNS (the replay's first N turns; default all)
#      CONFIGS ("plain ngram": the suite's configurations; "plain" alone halves a long run)
#      TOKENIZER (trained: synth --tokenizer trained, mini-K3's ranks, so the workloads keep their
#      sizes in mini-K3 tokens: the agent session 3,120 tokens, `long` about 8k; `synthetic` gives
#      7,637 and far more)
#      SESSION_MEMORY (the replay server's --session-memory, 160M: in a third of a 2 x 256-expert
#      slice, 512M makes the plan stream the spine in 88-token chunks, and 1 GiB does not fit).
set -euo pipefail
S=$(readlink -f "${1:?usage: k3_slice_measure.sh SLUICE OUT_DIR}")
OUT=${2:?usage: k3_slice_measure.sh SLUICE OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
LAYERS=${LAYERS:-2}; EXPERTS=${EXPERTS:-64}; SKEW=${SKEW:-1}; RUNS=${RUNS:-3}; NEW=${NEW:-32}
PARTS=${PARTS:-warm suite replay}
WORKLOADS=${WORKLOADS:-prose code long chat tools}
mkdir -p "$OUT"; M="$OUT/k3-slice"
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/log.txt" >&2; }
{ date -u; uptime; nproc; free -g | head -2; df -h "$OUT" | tail -1; } > "$OUT/machine.txt"
if [ ! -f "$M/config.json" ]; then
  SK=(); [ "$SKEW" = 1 ] && SK=(--route-skew)
  log "synth k3-slice --layers $LAYERS --experts $EXPERTS ${SK[*]}"
  "$S" synth --preset k3-slice --layers "$LAYERS" --experts "$EXPERTS" --seed 7 "${SK[@]}" \
    --tokenizer "${TOKENIZER:-trained}" --out "$M" 2>> "$OUT/log.txt"
fi
SIZE=$(du -sb "$M" | cut -f1)
# A cgroup a third of the slice (issue 19's "3x smaller"); sluice's own budget 512 MiB under it.
CG=${CGROUP:-$((SIZE / 3))}
MEM=${MEMORY:-$((CG - 512 * 1024 * 1024))}
log "slice $SIZE bytes; cgroup $CG; --memory $MEM"
COMMON=(--model "$M" --cold --fadvise-only --probe-bytes 1G --json)
# cgroup v1: `bench --cgroup-limit` puts each run in its own group. cgroup v2 (the device host):
# bench cannot, so this script runs its commands inside one v2 group of the same limit.
V2=()
if [ -w /sys/fs/cgroup/memory ]; then
  COMMON+=(--cgroup-limit "$CG")
else
  G=/sys/fs/cgroup/sluice-k3m-$$
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir -p "$G" && echo "$CG" > "$G/memory.max"
  V2=(sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$G")
fi
for part in $PARTS; do
  case $part in
  warm)
    rm -f "$M/.sluice-hotset.json"
    ARGS="--experts stream --memory $MEM"
    log "warm: priming run (writes the hot set)"
    "${V2[@]}" "$S" bench "${COMMON[@]}" --prompt-len 8 --max-new "$NEW" --runs 1 --warm-start \
      --config prime="$ARGS" > "$OUT/warm-prime.json"
    log "warm: $RUNS x (warm, --no-warm-start) interleaved"
    "${V2[@]}" "$S" bench "${COMMON[@]}" --prompt-len 8 --max-new "$NEW" --runs "$RUNS" --warm-start \
      --config warm="$ARGS" --config nowarm="$ARGS --no-warm-start" > "$OUT/warm.json"
    ;;
  suite)
    for w in $WORKLOADS; do
      R=$RUNS; [ "$w" = long ] && R=1
      log "suite: $w ($R runs per configuration)"
      CF=()
      for c in ${CONFIGS:-plain ngram}; do
        case $c in
        plain) CF+=(--config plain="--experts stream --memory $MEM") ;;
        ngram) CF+=(--config ngram="--experts stream --memory $MEM --draft ngram") ;;
        *) echo "unknown configuration $c" >&2; exit 2 ;;
        esac
      done
      "${V2[@]}" "$S" bench "${COMMON[@]}" --workload "$w" --max-new "$NEW" --runs "$R" \
        "${CF[@]}" > "$OUT/suite-$w.json"
    done
    ;;
  replay)
    log "replay: agent session, 3 conditions, $RUNS runs"
    "${V2[@]}" python3 "$HERE/agent_replay.py" --sluice "$S" --model "$M" --memory "$MEM" --runs "$RUNS" \
      --max-tokens 4 ${TURNS:+--turns "$TURNS"} --conditions "${CONDITIONS:-none,warm,restart}" --serve-arg=--experts --serve-arg=stream --serve-arg=--session-memory --serve-arg="${SESSION_MEMORY:-160M}" --json "$OUT/replay.json" > "$OUT/replay.txt"
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
uptime >> "$OUT/machine.txt"
python3 "$HERE/k3_slice_summary.py" "$OUT"
