#!/usr/bin/env python3
"""transformers goldens for the trained mini-draft (issue 17, item 6), as tools/gen_qwen3_goldens.py makes them for
the tiny random Qwen3 fixtures: same tensors, same golden.json keys, same checks.

    python3 tools/mini/gen_draft_goldens.py --model tests/fixtures/qwen3/mini-draft

The checkpoint is trained, so no seed can be re-drawn when a greedy step is nearly tied: instead each prompt slot
has candidate texts, tried in order, and the first whose greedy run (and, for the decode scenario, whose decode
steps) all have a top-1/top-2 logit margin of at least MIN_MARGIN is used (golden.json records which). The
reference is transformers' Qwen3ForCausalLM on CPU in float32 from the bf16 checkpoint (eager attention), cross-
checked against the independent float64 numpy forward and against sdpa; tokenizer cases as for the tiny fixtures.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import gen_qwen3_goldens as G  # noqa: E402  (the float64 reference and the tokenizer cases)
import golden_common as gc  # noqa: E402  (stage capture, greedy loops, golden files)

# Candidates per slot: a single token, a short prose prompt, a code prompt of ~24 tokens (the first of each whose
# greedy margins clear MIN_MARGIN).
PROMPT_CANDIDATES = [
    ["The", "A", "In"],
    ["The Python interpreter is", "The standard library provides", "This function returns the"],
    ["def read_config(path):\n    \"\"\"Read the configuration file and return a dict.\"\"\"\n    with open(path) as f:",
     "fn main() {\n    let args: Vec<String> = std::env::args().collect();\n    if args.len() < 2 {",
     "The following example shows how to open a file, read its lines and close it again:\n\n"],
]
DECODE_CANDIDATES = ["In the spring the water is high; in the autumn it is low",
                     "Returns the number of elements in the vector, also referred to as its length.",
                     "This module provides access to some variables used or maintained by the interpreter"]
MIN_MARGIN = 1e-3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM

    gc.set_threads()
    dir_ = args.model
    tok = Tokenizer.from_file(os.path.join(dir_, "tokenizer.json"))
    ref = Qwen3ForCausalLM.from_pretrained(dir_, dtype=torch.float32, attn_implementation="eager").eval()
    sdpa = Qwen3ForCausalLM.from_pretrained(dir_, dtype=torch.float32, attn_implementation="sdpa").eval()
    cfg = gc.read_config(dir_)

    prompts, texts, greedy = [], [], []
    for slot in PROMPT_CANDIDATES:
        for text in slot:
            p = tok.encode(text).ids
            toks, lg = gc.cached_greedy(ref, p, gc.GREEDY_TOKENS - 1)
            margins = [gc.margin(r) for r in lg]
            if min(margins) >= MIN_MARGIN:
                gen = gc.hf_generate(ref, p, gc.GREEDY_TOKENS)
                assert gen == toks, f"generate {gen} != cached greedy loop {toks}"
                prompts.append(p)
                texts.append(text)
                greedy.append({"prompt": p, "tokens": toks, "margins": margins,
                               "generate": "generate() equals the cached greedy loop",
                               "text": tok.decode(toks, skip_special_tokens=False)})
                break
        else:
            raise RuntimeError(f"no candidate of {slot!r} has greedy margins >= {MIN_MARGIN}")
    for dt in DECODE_CANDIDATES:
        dprompt = tok.encode(dt).ids[:gc.DECODE_PROMPT_LEN]
        dtok, dlogits = gc.cached_greedy(ref, dprompt, gc.DECODE_STEPS)
        if min(gc.margin(r) for r in dlogits) >= MIN_MARGIN:
            break
    else:
        raise RuntimeError("no decode candidate has margins >= MIN_MARGIN")
    d = gc.decode_run(ref, dprompt)

    stages = [gc.capture_stages(ref, p) for p in prompts]
    sdpa_diff = gc.sdpa_diffs(sdpa, prompts, stages)
    f64 = [gc.rel_l2(st["logits"], G.numpy_f64_logits(ref, p)) for p, st in zip(prompts, stages)]
    assert max(f64) <= 1e-4, f"numpy float64 reference disagrees with transformers: {f64}"

    per_prompt, _ = gc.stage_lists(cfg["num_hidden_layers"], [])
    tensors = gc.golden_tensors(prompts, stages, d, gc.rope_tables(ref), per_prompt)
    gc.save_goldens(dir_, tensors)
    gj = {
        "config_name": "mini-draft",
        "generator": "tools/mini/gen_draft_goldens.py",
        "reference": "transformers Qwen3ForCausalLM on CPU, loaded with from_pretrained(dtype=float32, "
                     "attn_implementation='eager') from the bf16 checkpoint: an f32 computation of bf16 weights",
        "versions": gc.versions(),
        "config": cfg,
        "tokenizer_vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "prompts": prompts,
        "prompt_texts": texts,
        "stage_template": gc.stage_template(per_prompt),
        "stage_names": list(tensors),
        "decode": {"prompt_text": dt, **gc.decode_json(d, rows_note=False)},
        "greedy": greedy,
        "checks": {"sdpa_vs_eager_logits_max_abs": sdpa_diff, "numpy_f64_vs_hf_logits_rel_l2": f64,
                   "attn_implementation": getattr(ref.config, "_attn_implementation", None)},
        "tokenizer_cases": G.tokenizer_goldens(tok),
    }
    gc.write_json(os.path.join(dir_, "golden.json"), gj)
    worst = min(min(min(g["margins"]) for g in greedy), min(gj["decode"]["margins"]))
    print(f"prompts {[len(p) for p in prompts]} ({texts}); decode {dt!r}; numpy f64 logits relL2 {max(f64):.3e}; "
          f"sdpa vs eager {max(sdpa_diff):.3e}; decode vs full recompute {d['full_recompute_max_abs_diff']:.3e}; "
          f"min margin {worst:.3e}")
    for g in greedy:
        print("greedy:", repr(g["text"]))


if __name__ == "__main__":
    sys.exit(main())
