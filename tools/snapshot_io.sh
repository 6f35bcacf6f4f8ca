#!/usr/bin/env bash
# Kimi K3 prompt-state size, write and restore time against the disk (issue 18; docs/PERFORMANCE.md,
# "Size of one Kimi K3 prompt state"). No model needed: states at the published dimensions are built,
# written through the real state cache (temp, fsync, rename) and restored cold, interleaved with a
# plain-file write and cold read of the same size on the same disk.
#   tools/snapshot_io.sh SLUICE OUT_DIR [RUNS]      (OUT_DIR on the disk to measure; needs ~3 GB free)
set -euo pipefail
S=${1:?usage: snapshot_io.sh SLUICE OUT_DIR [RUNS]}
OUT=${2:?usage: snapshot_io.sh SLUICE OUT_DIR [RUNS]}
RUNS=${3:-3}
mkdir -p "$OUT"
{ date -u; uptime; nproc; df -h "$OUT" | tail -1; } > "$OUT/machine.txt"
"$S" bench --snapshot-io "$OUT/work" --snapshot-tokens 1024,4096,16384 --runs "$RUNS" --json \
  > "$OUT/snapshot_io.json"
uptime >> "$OUT/machine.txt"
rm -rf "$OUT/work"
python3 - "$OUT/snapshot_io.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["snapshot_io"]
print("tokens | state file | write s | restore s | plain write GB/s | cold read GB/s | write/plain | restore/cold read")
for r in rows:
    print(f'{r["tokens"]} | {r["bytes"]} | {r["write_s"]:.3f} | {r["restore_s"]:.3f} | '
          f'{r["disk_write_gbps"]:.2f} | {r["disk_read_gbps"]:.2f} | {r["write_vs_disk"]:.2f} | {r["restore_vs_disk"]:.2f}')
PY
