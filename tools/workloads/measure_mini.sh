#!/usr/bin/env bash
# The trained-routing measurements of docs/PERFORMANCE.md ("Trained routing: mini-K3", issue 17) on the built-in
# model: route traces of the workload suite, their replay through the cache-policy simulation, the prefetch
# predictors, the streamed runs at ~4% cache and the draft widths. Usage: tools/workloads/measure_mini.sh OUT_DIR
# (needs a release build: cargo build --release -p sluice-cli && cargo build --release -p sluice-engine --example
# replay_routes; guess_stats.py needs torch). Takes ~30 minutes on the 2-core development machine.
set -euo pipefail
OUT=${1:?usage: measure_mini.sh OUT_DIR}
mkdir -p "$OUT"
T=${CARGO_TARGET_DIR:-target}/release
S="$T/sluice"
NEW=${NEW:-128}
RUNS=${RUNS:-2}
# 4% of mini-K3's 448 routed experts (K3's 64 GB : 1.45 TB); one position needs 28.
SLOTS=${SLOTS:-18}
WORKLOADS=${WORKLOADS:-prose code long chat tools}
for w in $WORKLOADS; do
  # The long prompt (7,846 tokens) takes minutes per run here: one run per configuration, no width runs.
  R=$RUNS; [ "$w" = long ] && R=1
  # 1. A route trace and the run's tokens (routing does not depend on the cache: all resident here).
  "$S" bench --workload "$w" --runs 1 --config plain= --max-new "$NEW" --probe-bytes 64M \
    --trace-routes "$OUT/$w.jsonl" --json > "$OUT/$w-trace.json"
  python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1]))['raw'][0], open(sys.argv[2],'w'))" \
    "$OUT/$w-trace.json" "$OUT/$w-run.json"
  # 2. Streamed with a cache of ~4% of the experts: plain, n-gram drafts, and everything resident for reference.
  "$S" bench --workload "$w" --runs "$R" --max-new "$NEW" --probe-bytes 64M --cgroup-limit 256M \
    --config resident="--experts mapped" \
    --config s4="--experts stream --cache-slots $SLOTS" \
    --config s4ngram="--experts stream --cache-slots $SLOTS --draft ngram" \
    --config s4noprefetch="--experts stream --cache-slots $SLOTS --draft ngram --no-prefetch" \
    --json > "$OUT/$w-stream.json"
  # 3. The width policy against fixed widths (n-gram drafts, everything resident).
  [ "$w" = long ] && continue
  "$S" bench --workload "$w" --runs "$RUNS" --max-new "$NEW" --probe-bytes 64M \
    --config policy8="--draft ngram --draft-max 8" \
    --config fixed2="--draft ngram --draft-max 2 --draft-fixed" \
    --config fixed4="--draft ngram --draft-max 4 --draft-fixed" \
    --config fixed8="--draft ngram --draft-max 8 --draft-fixed" \
    --config none="--draft none" \
    --json > "$OUT/$w-width.json"
done
# 4. Replay (LRU vs S3-FIFO at 4/8/16/32% of the experts) and the model-free predictors.
"$T/examples/replay_routes" "$OUT"/*.jsonl > "$OUT/replay.jsonl"
# 5. Which layer's input predicts which layer's experts (router on earlier hidden states; torch).
python3 "$(dirname "$0")/guess_stats.py" "$OUT"/*-run.json > "$OUT/guess.jsonl"
