#!/usr/bin/env python3
"""A sensitivity baseline for docs/INT8.md: the published checkpoint with every matrix that the
int8 conversion quantizes perturbed by one bf16 ulp (+1 or -1 at random, seeded; zeros kept).

That is a relative change of about 2^-8 per element, below int8's error (up to half a step of
absmax/127 per row). Comparing it with `sluice accuracy SRC --int8 OUT` shows how much of the
int8 spine's disagreement a model would show under any perturbation of that size.

Usage: int8_ulp_baseline.py SRC CONVERTED OUT
  SRC        the published checkpoint
  CONVERTED  its `sluice convert --spine int8` output (for the list of quantized tensors)
  OUT        new directory; gets SRC's files, the perturbed shards and CONVERTED's manifest
             (so that `sluice accuracy` accepts it as the candidate)
"""
import glob
import json
import os
import shutil
import struct
import sys

import numpy as np


def main(src, converted, out):
    rng = np.random.default_rng(0)
    os.makedirs(out)
    manifest = os.path.join(converted, "sluice-int8-manifest.json")
    quantized = set(json.load(open(manifest))["quantized"])
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), out)
    shutil.copy(manifest, out)
    for path in sorted(glob.glob(os.path.join(src, "model*.safetensors"))):
        data = bytearray(open(path, "rb").read())
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + n])
        base = 8 + n
        for name, t in header.items():
            if name not in quantized:
                continue
            start, end = t["data_offsets"]
            bits = np.frombuffer(bytes(data[base + start : base + end]), np.uint16).copy()
            nonzero = (bits & 0x7FFF) != 0
            step = rng.choice([-1, 1], int(nonzero.sum()))
            bits[nonzero] = (bits[nonzero].astype(np.int32) + step).astype(np.uint16)
            data[base + start : base + end] = bits.tobytes()
        with open(os.path.join(out, os.path.basename(path)), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
