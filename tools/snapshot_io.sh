#!/usr/bin/env bash
# Kimi K3 prompt-state size, write and restore time against the disk (issue 18; docs/PERFORMANCE.md,
# "Size of one Kimi K3 prompt state"). No model needed: states at the published dimensions are built,
# written through the real state cache (chunked checksums, temp, fsync, rename) and restored cold,
# interleaved with a plain-file write and cold read of the same size on the same disk.
#   tools/snapshot_io.sh SLUICE OUT_DIR [RUNS]      (OUT_DIR on the disk to measure; needs ~3 GB free)
# Before/after: SLUICE_BEFORE=/path/to/old/sluice runs the old binary too, interleaved run by run
# with SLUICE (before, after, before, after, ...), and prints both. TOKENS=1024,4096,16384 by default.
# The machine's state (cores, load before and after, SLUICE_THREADS) goes to OUT_DIR/machine.txt.
set -euo pipefail
S=${1:?usage: snapshot_io.sh SLUICE OUT_DIR [RUNS]}
OUT=${2:?usage: snapshot_io.sh SLUICE OUT_DIR [RUNS]}
RUNS=${3:-3}
TOKENS=${TOKENS:-1024,4096,16384}
mkdir -p "$OUT"
{ date -u; uptime; echo "nproc $(nproc) SLUICE_THREADS=${SLUICE_THREADS:-unset}"; df -h "$OUT" | tail -1; } \
  > "$OUT/machine.txt"
BINS=("after:$S")
if [ -n "${SLUICE_BEFORE:-}" ]; then BINS=("before:$SLUICE_BEFORE" "after:$S"); fi
rm -f "$OUT"/snapshot_io.*.jsonl
for r in $(seq 1 "$RUNS"); do
  for b in "${BINS[@]}"; do
    name=${b%%:*}; bin=${b#*:}
    "$bin" bench --snapshot-io "$OUT/work" --snapshot-tokens "$TOKENS" --runs 1 --json \
      >> "$OUT/snapshot_io.$name.jsonl"
    echo "run $r $name done: $(uptime)" >&2
  done
done
uptime >> "$OUT/machine.txt"
rm -rf "$OUT/work"
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
med = statistics.median
print("binary | tokens | state file | write s [runs] | restore s [runs] | plain write GB/s | cold read GB/s | write/plain | restore/cold read")
for path in sorted(glob.glob(os.path.join(out, "snapshot_io.*.jsonl"))):
    name = path.split(".")[-2]
    rows = {}
    for line in open(path):
        for r in json.loads(line)["snapshot_io"]:
            rows.setdefault(r["tokens"], []).append(r)
    for tokens, rs in sorted(rows.items()):
        w, rd = [r["write_s"] for r in rs], [r["restore_s"] for r in rs]
        dw, dr = [r["disk_write_s"] for r in rs], [r["disk_read_s"] for r in rs]
        gb = rs[0]["bytes"] / 1e9
        print(f'{name} | {tokens} | {rs[0]["bytes"]} | {med(w):.3f} {[round(x, 3) for x in w]} | '
              f'{med(rd):.3f} {[round(x, 3) for x in rd]} | {gb / med(dw):.2f} | {gb / med(dr):.2f} | '
              f'{med(w) / med(dw):.2f} | {med(rd) / med(dr):.2f}')
PY
