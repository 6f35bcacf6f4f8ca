#!/usr/bin/env bash
# Two sluice binaries' prefill and decode on a Kimi K3 slice held in memory, alternating (issue 20;
# docs/PERFORMANCE.md, sessions 21, 26 and 27). Synthesizes the slice once in OUT_DIR (2 layers of
# 384 experts at K3's real dimensions, 14.62 GiB: its page cache must fit the machine's memory), then
# for each thread count and prompt runs `sluice run --prompt-ids ... --max-new 4 --json` with each
# binary in turn, pinned to the first N CPUs, and prints one line per run: prompt, threads, binary,
# prefill s, decode s/token, generated ids (the ids must agree across every run of a prompt; the
# script fails if they do not).
#
# With 384 experts, a 96-token prompt gives each expert about 4 rows (96 x 16 / 384), full K3's
# share at 256 tokens; 256 tokens give about 10.7.
#
# Usage: tools/k3_slice_prefill.sh OLD_SLUICE NEW_SLUICE OUT_DIR
# Env: THREADS ("16 2"), PROMPTS ("96 256"), ROUNDS (3), EXPERTS (384)
set -euo pipefail
OLD=$(readlink -f "${1:?usage: k3_slice_prefill.sh OLD_SLUICE NEW_SLUICE OUT_DIR}")
NEW=$(readlink -f "${2:?usage: k3_slice_prefill.sh OLD_SLUICE NEW_SLUICE OUT_DIR}")
OUT=${3:?usage: k3_slice_prefill.sh OLD_SLUICE NEW_SLUICE OUT_DIR}
THREADS=${THREADS:-16 2}; PROMPTS=${PROMPTS:-96 256}; ROUNDS=${ROUNDS:-3}; EXPERTS=${EXPERTS:-384}
mkdir -p "$OUT"; M="$OUT/k3-slice-$EXPERTS"
{ date -u; nproc; lscpu | grep -E "Model name|L2 cache|L3 cache"; free -g | head -2; } \
  > "$OUT/machine.txt"
if [ ! -f "$M/config.json" ]; then
  "$NEW" synth --preset k3-slice --layers 2 --experts "$EXPERTS" --ranks 4096 --seed 1 \
    --out "$M" >&2
fi
# Prompt ids: a fixed pseudo-random sequence below the slice's 4,096 tokenizer ranks.
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(256, 4096)) for _ in range($1)))"; }
for p in $PROMPTS; do
  IDS=$(ids "$p"); FIRST=""
  for t in $THREADS; do
    for _ in $(seq "$ROUNDS"); do
      for b in old new; do
        S=$OLD; [ "$b" = new ] && S=$NEW
        LINE=$(SLUICE_THREADS=$t taskset -c "0-$((t - 1))" "$S" run --model "$M" --prompt-ids "$IDS" \
          --max-new 4 --json 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin); s = d['stats']
print(round(s['prefill_s'], 3), round(s['s_per_token'], 4), ','.join(map(str, d['generated_ids'])))")
        read -r PRE DEC GEN <<< "$LINE"
        [ -z "$FIRST" ] && FIRST=$GEN
        if [ "$GEN" != "$FIRST" ]; then
          echo "pp$p t$t $b: generated $GEN, the first run generated $FIRST" >&2; exit 1
        fi
        echo "pp$p t$t $b prefill_s $PRE decode_s_per_token $DEC ids $GEN" | tee -a "$OUT/runs.txt"
      done
    done
  done
done
