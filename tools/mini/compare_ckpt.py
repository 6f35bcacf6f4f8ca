#!/usr/bin/env python3
"""Compares two checkpoint directories tensor by tensor (issue 17: how close a second training run comes).

    python3 tools/mini/compare_ckpt.py DIR_A DIR_B [--json OUT]

For every tensor name in both: bit-identical or not; for float tensors the relative L2 difference (over the larger norm) and the
largest absolute difference; for byte tensors (MXFP4 codes and scales) the fraction of differing bytes. Also
whether each shard file is byte-identical. Prints a summary; --json writes the whole comparison.
"""

import argparse
import hashlib
import json
import os
import sys

import torch
from safetensors.torch import load_file


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors") and f.startswith("model"):
            out.update(load_file(os.path.join(d, f)))
    return out


def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json")
    args = ap.parse_args()
    ta, tb = tensors(args.a), tensors(args.b)
    names = sorted(set(ta) & set(tb))
    rows, identical = [], 0
    for n in names:
        x, y = ta[n], tb[n]
        same = x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        identical += same
        r = {"name": n, "dtype": str(x.dtype), "identical": bool(same)}
        if not same and x.shape == y.shape:
            if x.is_floating_point():
                xf, yf = x.double(), y.double()
                r["rel_l2"] = float((xf - yf).norm() / max(float(xf.norm()), float(yf.norm())))  # symmetric, <= 2
                r["max_abs"] = float((xf - yf).abs().max())
            else:
                r["differing_fraction"] = float((x != y).double().mean())
        rows.append(r)
    files = sorted(f for f in os.listdir(args.a) if f.endswith(".safetensors"))
    same_files = {f: os.path.exists(os.path.join(args.b, f)) and sha(os.path.join(args.a, f)) ==
                  sha(os.path.join(args.b, f)) for f in files}
    floats = [r for r in rows if "rel_l2" in r]
    codes = [r for r in rows if "differing_fraction" in r]
    summary = {"tensors": len(names), "only_in_a": len(set(ta) - set(tb)), "only_in_b": len(set(tb) - set(ta)),
               "bit_identical_tensors": identical, "files_identical": same_files,
               "float_rel_l2_median": sorted(r["rel_l2"] for r in floats)[len(floats) // 2] if floats else 0.0,
               "float_rel_l2_max": max((r["rel_l2"] for r in floats), default=0.0),
               "byte_tensors_differing_fraction_max": max((r["differing_fraction"] for r in codes), default=0.0)}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "tensors": rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
