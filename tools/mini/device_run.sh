#!/usr/bin/env bash
# The command run on the GPU machine (issue 17): install the fla wheels carried in tmp/mini, optionally check fla
# and the model against the fixtures (GPU_CHECK=1; its triton autotuning over many shapes costs minutes), train
# for about TRAIN_S seconds (the total step count is fixed at step 45 from the measured rate and printed), evaluate
# and export. Results under $OUT (at most 8 files come back): the shards, train.log and meta.tar.gz.
set -euo pipefail
TRAIN_S=${TRAIN_S:-400}
DATA=tmp/mini/data
pip install --no-deps --target /tmp/fla tmp/mini/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/fla:tools:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
if [ "${GPU_CHECK:-0}" = 1 ]; then python3 tools/mini/gpu_check.py 2>&1 | tee $OUT/gpu_check.log; fi
python3 tools/mini/train.py --data $DATA --out /tmp/run --train-s $TRAIN_S --deadline-s $((TRAIN_S + 50)) \
    ${TRAIN_ARGS:-} 2>&1 | tee $OUT/train.log | grep -v Warning | tail -25
cp /tmp/run/ckpt/model-*.safetensors $OUT/
tar -czf $OUT/meta.tar.gz -C /tmp/run metrics.json ckpt/config.json ckpt/model.safetensors.index.json ckpt/generation_config.json
ls -la $OUT
