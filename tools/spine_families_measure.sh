#!/usr/bin/env bash
# Spine placement on a Qwen3-MoE or GPT-OSS slice at its real per-layer dimensions: the same
# `--memory` (smaller than spine + experts, so the experts stream) with the spine mapped whole
# (`--spine-placement mapped`, what these families ran before they placed their spine), every
# layer streamed through two buffers (`--spine-placement 0`) and planned (`auto`). Synthesizes
# the slice itself under OUT (nothing big travels), runs `sluice bench` with RUNS fresh processes
# per configuration, interleaved, every run's tokens checked against the first run's, and prints
# the medians of decode s/pass, spine bytes read per pass and peak RSS next to the budget.
# Deletes the slice afterwards (KEEP=1 keeps it).
#
#   tools/spine_families_measure.sh target/release/sluice /tmp/spine-measure
#
# OUT/<preset>.json holds every run and the summary; OUT/<preset>.load the load average before
# and after.
#
# Env: PRESET (gpt-oss-slice; or qwen3-moe-slice), LAYERS (2), RANKS (8192 vocabulary rows),
# MEMORY (512M), RUNS (3), MAX_NEW (8), PROMPT (8), THREADS (SLUICE_THREADS, all cores).
set -euo pipefail
SLUICE=$1 OUT=$2
PRESET=${PRESET:-gpt-oss-slice} LAYERS=${LAYERS:-2} RANKS=${RANKS:-8192}
MEMORY=${MEMORY:-512M} RUNS=${RUNS:-3} MAX_NEW=${MAX_NEW:-8} PROMPT=${PROMPT:-8}
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
model=$OUT/model-$PRESET
[ -f "$model/config.json" ] || "$SLUICE" synth --preset "$PRESET" --layers "$LAYERS" \
  --ranks "$RANKS" --out "$model"
size=$(du -sb "$model" | cut -f1)
echo "$PRESET: $LAYERS layers, $size bytes on disk, --memory $MEMORY" >&2
"$SLUICE" inspect "$model" >&2
uptime > "$OUT/$PRESET.load"
SLUICE_THREADS=$THREADS "$SLUICE" bench --model "$model" --memory "$MEMORY" --json \
  --prompt-len "$PROMPT" --max-new "$MAX_NEW" --runs "$RUNS" \
  --config mapped=--spine-placement=mapped --config streamed=--spine-placement=0 \
  --config auto=--spine-placement=auto > "$OUT/$PRESET.json"
uptime >> "$OUT/$PRESET.load"
python3 - "$OUT/$PRESET.json" "$MEMORY" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
for c in v["summary"]:
    m = c["metrics"]
    med = lambda k: m.get(k, {}).get("median")
    print(f'{c["config"]:9} {c["runs"]} runs: decode s/pass {med("s_per_pass")}, '
          f'other (spine) bytes read {med("other_bytes_read")}, peak RSS {med("peak_rss_bytes")} '
          f'(budget {sys.argv[2]})')
print("tokens match the oracle in every run:", all(r.get("tokens_match", True) for r in v["runs"]))
EOF
[ "${KEEP:-0}" = 1 ] || rm -rf "$model"
