#!/usr/bin/env python3
"""Which layer's input best predicts which MoE layer's experts, on real token sequences (issue 17): for each
MoE layer L of a mini-K3 checkpoint, the precision of guessing L's top-k experts by applying L's router (with its
selection bias) to an earlier hidden state of the same position, against the experts L then really chose.

Candidates, per MoE layer L (the engine's choice is `prev_mlp_in`; for the first MoE layer it is `own_pre_attn`):
  prev_mlp_in    L's router on layer L-1's MoE input (post-attention-norm output): known one MoE layer ahead
  own_pre_attn   L's router on L's input before its attention, normed with L's post-attention norm: known one
                 attention ahead
  prev2_mlp_in   L's router on layer L-2's MoE input: known two MoE layers ahead
Precision@k (guess k experts; for one decode row that is also the recall) and recall@2k (guess twice as many).

Input: `sluice run --json` outputs (their prompt_ids + generated_ids are the sequence), e.g. from the workload
suite. Usage: python3 tools/workloads/guess_stats.py [--model DIR] RUN.json...
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mini"))
import model as M  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "../../tests/fixtures/kimi_k3/mini-k3"))
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    m, c = M.load_checkpoint_dir(a.model, torch.float32)
    k = c["num_experts_per_token"]
    cands = ["prev_mlp_in", "own_pre_attn", "prev2_mlp_in"]
    for path in a.runs:
        with open(path) as f:
            run = json.load(f)
        ids = torch.tensor(run["prompt_ids"] + run["generated_ids"], dtype=torch.int64)[None]
        pre, mlp_in = {}, {}

        # Capture each layer's pre-attention input (the AttnRes mix) and MoE input.
        def pre_hook(i):
            def f(mod, args):
                pre[i] = args[0]
            return f

        def moe_hook(i):
            def f(mod, args):
                mlp_in[i] = args[0]
            return f

        hs = []
        for i, L in enumerate(m.layers):
            hs.append(L.input_layernorm.register_forward_pre_hook(pre_hook(i)))
            if L.is_moe:
                hs.append(L.block_sparse_moe.register_forward_pre_hook(moe_hook(i)))
        with torch.no_grad():
            m(ids)
        for h in hs:
            h.remove()
        moe = sorted(mlp_in)
        out = {"run": path, "tokens": ids.shape[1], "k": k, "layers": []}
        with torch.no_grad():
            for L in moe:
                blk = m.layers[L].block_sparse_moe
                actual = blk.route(mlp_in[L][0])[0]
                srcs = {
                    "prev_mlp_in": mlp_in.get(L - 1),
                    "own_pre_attn": m.layers[L].post_attention_layernorm(pre[L]),
                    "prev2_mlp_in": mlp_in.get(L - 2),
                }
                row = {"layer": L}
                for name in cands:
                    x = srcs[name]
                    if x is None:
                        row[name] = None
                        continue
                    x = x[0]
                    logits = x.float() @ blk.gate.weight.float().T
                    choice = torch.sigmoid(logits) + blk.gate.e_score_correction_bias.float()
                    order = torch.argsort(choice, dim=-1, descending=True)
                    hit = lambda n: (order[:, :n, None] == actual[:, None, :]).any(-1).sum().item()  # noqa: E731
                    T = actual.shape[0]
                    row[name] = {"precision_at_k": hit(k) / (T * k), "recall_at_2k": hit(2 * k) / (T * k)}
                out["layers"].append(row)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
