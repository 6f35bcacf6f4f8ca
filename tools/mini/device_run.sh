#!/usr/bin/env bash
# The one command run on the GPU machine (issue 17): install the fla wheels carried in tmp/mini, check fla and
# the model against the fixtures, measure throughput, train for about TRAIN_S seconds of steps, evaluate and
# export. Results under $OUT (at most 8 files come back): the shards, and meta.tar.gz with config/index/metrics.
set -euo pipefail
TRAIN_S=${TRAIN_S:-320}
DATA=tmp/mini/data
pip install --no-deps --target /tmp/fla tmp/mini/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/fla:tools:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 tools/mini/gpu_check.py 2>&1 | tee $OUT/gpu_check.log
python3 tools/mini/train.py --data $DATA --out /tmp/bench --bench 20 ${TRAIN_ARGS:-} 2>&1 | tee /tmp/bench.log | tail -3
RATE=$(grep BENCH /tmp/bench.log | awk '{print $3}')
STEPS=$(python3 -c "print(int($TRAIN_S * $RATE / (64 * 512)) // 10 * 10)")
echo "steps $STEPS at $RATE tok/s"
python3 tools/mini/train.py --data $DATA --out /tmp/run --steps $STEPS --deadline-s $((TRAIN_S + 60)) ${TRAIN_ARGS:-} 2>&1 | tee $OUT/train.log | tail -30
cp /tmp/run/ckpt/model-*.safetensors $OUT/
tar -czf $OUT/meta.tar.gz -C /tmp/run metrics.json ckpt/config.json ckpt/model.safetensors.index.json ckpt/generation_config.json
ls -la $OUT
