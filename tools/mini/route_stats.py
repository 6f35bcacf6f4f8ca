#!/usr/bin/env python3
"""Routing statistics of a mini-K3 checkpoint on held-out text (issue 17): per MoE layer, the share of all
selections taken by the 8 most used experts (uniform routing: 8/E) and the mean fraction of a token's top-k
experts that the previous token also chose (uniform: k/E). A first look at how far trained routing is from the
random demo model's; the cache and prefetch measurements belong in docs/PERFORMANCE.md.

Usage: python3 tools/mini/route_stats.py [--model DIR] [--heldout FILE.u16] [--windows 4]
"""

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import model as M  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "../../tests/fixtures/kimi_k3/mini-k3"))
    ap.add_argument("--heldout", default="/work/mini-artifacts/tok/heldout.u16")
    ap.add_argument("--windows", type=int, default=4)
    args = ap.parse_args()
    m, c = M.load_checkpoint_dir(args.model, torch.float32)
    held = np.fromfile(args.heldout, dtype="<u2")
    E, k = c["num_experts"], c["num_experts_per_token"]
    rows = {}

    def hook(i):
        def f(mod, inp, out):
            idx, _, _ = mod.route(inp[0].reshape(-1, inp[0].shape[-1]))
            rows.setdefault(i, []).append(idx.numpy())
        return f

    for i, L in enumerate(m.layers):
        if L.is_moe:
            L.block_sparse_moe.register_forward_hook(hook(i))
    step = max(512, (len(held) - 512) // args.windows)
    with torch.no_grad():
        for w in range(args.windows):
            m(torch.from_numpy(held[w * step:w * step + 512].astype(np.int64))[None])
    print(f"layer  top-8 experts' share (uniform {800 / E:.1f}%)  overlap with previous token (uniform {100 * k / E:.2f}%)")
    for i, lst in sorted(rows.items()):
        idx = np.concatenate(lst)
        cnt = np.bincount(idx.ravel(), minlength=E)
        share = np.sort(cnt)[::-1][:8].sum() / cnt.sum()
        ov = np.mean([len(set(a) & set(b)) / k for blk in lst for a, b in zip(blk[1:], blk[:-1])])
        print(f"{i:5d}  {share * 100:6.1f}%  {ov * 100:6.1f}%")


if __name__ == "__main__":
    main()
