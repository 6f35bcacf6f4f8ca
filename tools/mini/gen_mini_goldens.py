#!/usr/bin/env python3
"""mlx-lm golden vectors for the trained mini-K3 (issue 17, item 6), exactly as tools/gen_k3_goldens.py writes
them for the tiny fixtures: mlx-lm 0.32.2 loads the published-layout directory with its own loader (native
MXFP4 experts, strict), every floating parameter is cast to float32, a stage-by-stage driver captures
embed / attn_in / attn_out / mlp_in / mlp_out / router_idx / router_w / final_hidden / logits per prompt, plus a
cached decode scenario and greedy generations, into DIR/golden.safetensors + DIR/golden.json. Then the
independent float64 numpy reference (tools/k3_numpy_ref.py) and the PyTorch model (tools/mini/model.py) are
compared with them.

Prompts are real text of the held-out split: candidates are taken in a fixed order and the first ones whose
router (k-th vs (k+1)-th choice score >= 1e-4 on every row of every layer) and greedy (top-2 logit margin >= 1e-3)
margins are safe are kept, so f32-vs-f32 ordering noise cannot flip a consumer's routing or greedy token.

Usage: pip install -r tools/requirements-golden.txt torch
       python3 tools/mini/gen_mini_goldens.py --model DIR --corpus /work/mini-artifacts/corpus
"""

import argparse
import importlib.metadata
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import gen_k3_goldens as G  # noqa: E402
import k3_numpy_ref as R  # noqa: E402
import tokenizer as TK  # noqa: E402

PROMPT_LENS = [1, 9, 24]
DECODE_PROMPT_LEN = 12
DECODE_STEPS = 8
GREEDY_NEW = 16


def candidates(enc, corpus, bos):
    """Prompt candidates in a fixed order: [BOS] + the first tokens of held-out documents, then fixed strings."""
    fixed = ["The Python interpreter", "fn main() {\n    let", "The kernel", "def __init__(self,",
             "A sluice is a water channel", "In this chapter we"]
    out = [[bos] + enc.encode_ordinary(s) for s in fixed]
    if corpus:
        with open(os.path.join(corpus, "heldout.txt"), encoding="utf-8") as f:
            for d in f.read().split("\x1e")[:60]:
                if d.strip():
                    out.append([bos] + enc.encode_ordinary(d[:400]))
    return out


def safe(model, ids, k, n_new):
    _, router = G.mlx_stages(model, ids)
    if min(v["min_margin"] for v in G.router_margins(router, k).values()) < G.ROUTER_MARGIN_MIN:
        return False
    toks, _, margins = G.greedy_cached(model, ids, n_new)
    if min(margins) < G.LOGIT_MARGIN_MIN:
        return False
    _, router = G.mlx_stages(model, ids + toks[:-1])
    return min(v["min_margin"] for v in G.router_margins(router, k).values()) >= G.ROUTER_MARGIN_MIN


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", default="/work/mini-artifacts/corpus")
    args = ap.parse_args()
    d = args.model
    top = json.load(open(os.path.join(d, "config.json")))
    c = top["text_config"]
    k = c["num_experts_per_token"]
    enc = TK.encoding(TK.load_ranks(os.path.join(d, "tiktoken.model")))
    bos = top["bos_token_id"]
    model = G.mlx_load(d)
    try:
        nmx = G.check_mxfp4(model, d, {"experts": c["num_experts"]})
    except AssertionError as e:
        # check_mxfp4 compares every matrix first, then asserts that the -0 code occurs in both nibble positions
        # (a property of the random fixtures); a quantiser that rounds to +0 never writes -0.
        if not (e.args and isinstance(e.args[0], tuple)):
            raise
        nmx = "every routed expert matrix (the checkpoint holds no -0 codes)"
    cands = candidates(enc, args.corpus if os.path.isdir(args.corpus or "") else None, bos)

    prompts, used = [], set()
    for n in PROMPT_LENS:
        for ci, cand in enumerate(cands):
            if ci in used or len(cand) < n:
                continue
            if safe(model, cand[:n], k, GREEDY_NEW):
                prompts.append(cand[:n])
                used.add(ci)
                break
        else:
            raise RuntimeError(f"no safe prompt of length {n}")
    for ci, cand in enumerate(cands):
        if ci not in used and len(cand) >= DECODE_PROMPT_LEN and safe(model, cand[:DECODE_PROMPT_LEN], k,
                                                                      DECODE_STEPS + 1):
            dprompt = cand[:DECODE_PROMPT_LEN]
            break
    else:
        raise RuntimeError("no safe decode prompt")

    stages, margins = [], {}
    for p in prompts:
        st, router = G.mlx_stages(model, p)
        stages.append(st)
        for i, r in G.router_margins(router, k).items():
            margins[i] = min(margins.get(i, np.inf), r["min_margin"])
    dtoks, dlogits, dmargins = G.greedy_cached(model, dprompt, DECODE_STEPS + 1)
    dfull = G.full_logits(model, dprompt + dtoks[:-1])[DECODE_PROMPT_LEN - 1:]
    greedy = []
    for p in prompts:
        toks, _, gm = G.greedy_cached(model, p, GREEDY_NEW)
        greedy.append({"prompt": p, "tokens": toks, "margins": gm, "text": enc.decode(p[1:] + toks)})

    tensors, names = [], []

    def add(n, arr):
        arr = np.ascontiguousarray(arr)
        if arr.dtype in (np.int32, np.int64):
            tensors.append(G.Tensor(n, "I32", arr.shape, arr.astype("<i4").tobytes()))
        else:
            tensors.append(G.Tensor(n, "F32", arr.shape, arr.astype("<f4").tobytes()))
        names.append(n)

    per = ["ids", "embed"]
    for i in range(c["num_hidden_layers"]):
        per += [f"layer{i}.attn_in", f"layer{i}.attn_out", f"layer{i}.mlp_in", f"layer{i}.mlp_out"]
        if i >= c["first_k_dense_replace"]:
            per += [f"layer{i}.router_idx", f"layer{i}.router_w"]
    per += ["final_hidden", "logits"]
    for j, (p, st) in enumerate(zip(prompts, stages)):
        st = dict(st, ids=np.array(p, dtype=np.int32))
        for s in per:
            add(f"p{j}.{s}", st[s])
    add("decode.prompt", np.array(dprompt, dtype=np.int32))
    add("decode.tokens", np.array(dtoks, dtype=np.int32))
    add("decode.logits", dlogits)
    G.write_safetensors(os.path.join(d, "golden.safetensors"), tensors, {"format": "sluice-golden"})
    gj = {
        "config_name": "mini-k3",
        "generator": "tools/mini/gen_mini_goldens.py",
        "reference": "mlx-lm kimi_k3 on CPU, loaded by mlx_lm.utils.load_model (native mxfp4 experts, strict); "
                     "floating parameters cast to float32",
        "versions": {p: importlib.metadata.version(p) for p in ("mlx", "mlx-lm", "numpy")},
        "vocab": {"bpe_ranks": bos, "vocab_size": c["vocab_size"], "bos": bos, "eos": bos + 2, "pad": bos + 255},
        "prompts": prompts,
        "stage_template": [f"p{{j}}.{s}" for s in per],
        "stage_names": names,
        "router_min_margin": {str(i): float(v) for i, v in sorted(margins.items())},
        "decode": {"prompt": dprompt, "tokens": dtoks, "logits_tensor": "decode.logits",
                   "logits_rows": "row 0 = last row of the prefill; row s = after feeding tokens[s-1]",
                   "margins": dmargins, "full_recompute_max_abs_diff": float(np.abs(dlogits - dfull).max())},
        "greedy": greedy,
        "mxfp4_dequant_exact_matrices": nmx,
    }
    with open(os.path.join(d, "golden.json"), "w") as f:   # compare_with_goldens reads it
        json.dump(gj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("numpy float64 reference:")
    gj["numpy_f64_check"] = R.compare_with_goldens(d)
    try:
        import torch
        import model as M
        w, r, g, rd = M.check_fixture(d, torch.float64)
        gj["torch_f64_check"] = {"worst_stage_rel_l2": w, "routing_equal": r, "greedy_equal": g,
                                 "decode_rel_l2": rd}
    except ImportError:
        pass
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(gj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for g in greedy:
        print(repr(g["text"]))
    worst = max(p["logits_rel_l2"] for p in gj["numpy_f64_check"]["prompts"])
    if worst > 1e-4 or not gj["numpy_f64_check"]["routing_equal"]:
        raise AssertionError(f"numpy f64 reference disagrees with mlx-lm: logits relL2 {worst:.3e}")


if __name__ == "__main__":
    main()
