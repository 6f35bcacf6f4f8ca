#!/usr/bin/env python3
"""Which engine is exact on a slice at real dimensions: HF transformers' greedy run against
sluice's (and optionally llama.cpp's) on the same `sluice synth` checkpoint.

    hf_check.py --model DIR --ids 1,2,3 --steps N --sluice SLUICE [--peer-ids 4,5,6] [--out F.json]

The golden vectors prove sluice against transformers on tiny configurations; the peer benchmark
runs slices at a model's real dimensions, where llama.cpp's greedy ids can part from sluice's
early (on a 24-layer gpt-oss-20b slice, at step 0). This script settles, per slice, which one
follows the reference there:

1. sluice greedy-decodes `--steps` tokens from `--ids` with `--dump-logits` (its f32 logits of
   every step);
2. transformers loads the same directory (`AutoModelForCausalLM`, float32, eager attention and
   eager experts; the MXFP4 experts of GPT-OSS dequantized by `Mxfp4Config(dequantize=True)`;
   `--device`: on the GPU when there is one, TF32 off) and greedy-decodes the same steps, one
   token per pass through its cache;
3. it prints, per step, both engines' ids, the reference's top-2 logit margin and the largest
   |sluice - reference| logit difference, and the first step where sluice's ids (and
   `--peer-ids`, llama.cpp's from the peer benchmark, if given) differ from the reference's.

A step whose reference margin is below the logit differences of a run is a near tie that either
engine may break either way; the exactness claim is about the others. Exits 1 when sluice's
ids differ from the reference's at a step whose margin is larger than 10x the largest logit
difference seen before it (an engine that is exact must not do that).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def first_diff(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="prompt ids, comma-separated")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sluice", required=True, help="sluice binary")
    ap.add_argument("--peer-ids", help="llama.cpp's greedy ids for the same prompt")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where transformers runs (auto: the GPU when there is one)")
    ap.add_argument("--out", help="JSON file written")
    a = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    ids = [int(x) for x in a.ids.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.npy")
        run = subprocess.run([a.sluice, "run", "--model", a.model, "--json", "--no-warm-start",
                              "--prompt-ids", a.ids, "--max-new", str(a.steps),
                              "--dump-logits", dump], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"hf_check: sluice failed: {run.stderr[-2000:]}")
        s_ids = json.loads(run.stdout.strip().splitlines()[-1])["generated_ids"]
        s_logits = np.load(dump)

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    # Eager attention and eager experts (a loop over the experts hit, as the golden generators
    # run them): transformers 5 otherwise picks `grouped_mm` kernels for the experts.
    kw = {"dtype": torch.float32, "attn_implementation": "eager", "experts_implementation": "eager"}
    if cfg.get("quantization_config", {}).get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    dev = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # .float(): some transformers versions keep dequantized MXFP4 experts in bf16 (exact: an
    # E2M1 value times a power of two fits bf16) and then run the experts' matmuls in bf16.
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw).float().to(dev).eval()
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        sys.exit(f"hf_check: parameters not in float32: {bad[:4]}")

    r_ids, margins, diffs = [], [], []
    with torch.no_grad():
        out = model(torch.tensor([ids], device=dev), use_cache=True)
        for step in range(a.steps):
            logits = out.logits[0, -1].float().cpu().numpy()
            top = np.argsort(logits)[::-1][:2]
            r_ids.append(int(top[0]))
            margins.append(float(logits[top[0]] - logits[top[1]]))
            if step < len(s_logits):
                diffs.append(float(np.abs(s_logits[step] - logits).max()))
            if step + 1 < a.steps:
                # Feed the reference's own token, so its run is the reference's greedy run.
                nxt = torch.tensor([[r_ids[-1]]], device=dev)
                out = model(nxt, past_key_values=out.past_key_values, use_cache=True)

    peer = [int(x) for x in a.peer_ids.split(",")] if a.peer_ids else None
    print(f"hf_check: transformers {transformers.__version__}, torch {torch.__version__}, {dev}")
    print("| step | reference id | sluice id | reference top-2 margin | max abs logit diff |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(r_ids):
        s = s_ids[i] if i < len(s_ids) else "-"
        d = f"{diffs[i]:.2e}" if i < len(diffs) else "-"
        print(f"| {i} | {r} | {s} | {margins[i]:.4f} | {d} |")
    s_div, p_div = first_diff(r_ids, s_ids), (first_diff(r_ids, peer) if peer else None)
    print(f"first step where sluice differs from the reference: {s_div}; llama.cpp: "
          f"{p_div if peer else 'not given'}")
    res = {"model": a.model, "prompt_ids": ids, "reference_ids": r_ids, "sluice_ids": s_ids,
           "peer_ids": peer, "margins": margins, "max_abs_logit_diff": diffs,
           "sluice_first_diff": s_div, "peer_first_diff": p_div, "device": dev,
           "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if s_div is not None and s_div < len(diffs):
        seen = max(diffs[: s_div + 1])
        if margins[s_div] > 10 * seen:
            sys.exit(f"hf_check: sluice differs from the reference at step {s_div}, whose margin "
                     f"{margins[s_div]:.4f} is more than 10x the logit differences ({seen:.2e})")


if __name__ == "__main__":
    main()
