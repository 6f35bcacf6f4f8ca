#!/usr/bin/env bash
# Speculative-decoding benchmark on a streamed Kimi K3 slice (docs/PERFORMANCE.md, issue 5).
# Runs every configuration as a fresh process inside a memory cgroup, interleaving
# configurations run by run, and appends one JSON line per run to $OUT. Summarise with
# tools/bench_draft_summary.py.
#
#   tools/bench_draft.sh /tmp/k3slice tests/fixtures/qwen3/tiny-a /tmp/draft-bench.jsonl
#
# Env: RUNS (3), MAX_NEW (8), CTRL_NEW (12), LIMIT (cgroup bytes, 4.5 GiB), SLUICE, SPEC
# (the spec_policy example binary), PARTS (main cold ctrl).
set -euo pipefail
MODEL=$1 DRAFT=$2 OUT=$3
RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-8} CTRL_NEW=${CTRL_NEW:-12} LIMIT=${LIMIT:-4831838208}
SLUICE=${SLUICE:-target/release/sluice} SPEC=${SPEC:-target/release/examples/spec_policy}
PARTS=${PARTS:-main cold ctrl}
CG=/sys/fs/cgroup/memory/sluice-draft-bench
mkdir -p "$CG"
echo "$LIMIT" > "$CG/memory.limit_in_bytes"

code=$'Rename x to total in this function and print it again.\ndef add(x, y):\n    x = x + y\n    return x\n\ndef add(total, y):\n    total'
free='The river keeper opened the gate at dawn, and the water'
chat='What should I pack for a two-day hike in the mountains?'

drop_cache() {
  python3 - "$MODEL" <<'PY'
import os, sys, glob
for f in glob.glob(os.path.join(sys.argv[1], "*")):
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

# run LABEL CACHE PROMPT_KIND DRAFT
one() {
  local label=$1 cache=$2 kind=$3 draft=$4 args=()
  case $kind in
    code) args=(--prompt "$code") ;;
    free) args=(--prompt "$free") ;;
    chat) args=(--chat --no-think --prompt "$chat") ;;
  esac
  [ "$cache" = cold ] && drop_cache
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  local j
  j=$(sh -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' sh \
      "$SLUICE" run --model "$MODEL" "${args[@]}" --max-new "$MAX_NEW" --draft "$draft" \
      --draft-max 4 --json 2>/dev/null)
  echo "{\"part\":\"$label\",\"cache\":\"$cache\",\"prompt\":\"$kind\",\"draft\":\"${draft##*/}\",\"load\":$load,\"run\":$j}" >> "$OUT"
}

for r in $(seq "$RUNS"); do
  if [[ " $PARTS " == *" main "* ]]; then
    for kind in code free chat; do
      for d in none ngram "$DRAFT"; do one main warm $kind "$d"; done
    done
  fi
  if [[ " $PARTS " == *" cold "* ]]; then
    for d in none ngram "$DRAFT"; do one cold cold free "$d"; done
  fi
done

if [[ " $PARTS " == *" ctrl "* ]]; then
  plain=$(mktemp)
  sh -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' sh "$SLUICE" run --model "$MODEL" \
    --prompt "$free" --max-new "$CTRL_NEW" --json 2>/dev/null > "$plain"
  for r in $(seq "$RUNS"); do
    for cfg in "0 0 fixed" "1.0 4 fixed" "1.0 4 policy" "0.5 4 fixed" "0.5 4 policy" \
               "0.0 4 fixed" "0.0 4 policy"; do
      set -- $cfg
      load=$(cut -d' ' -f1 /proc/loadavg)
      j=$(sh -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' sh "$SPEC" "$MODEL" "$plain" "$1" "$2" "$3" 2>/dev/null)
      echo "{\"part\":\"ctrl\",\"load\":$load,\"run\":$j}" >> "$OUT"
    done
  done
  rm -f "$plain"
fi
