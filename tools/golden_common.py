"""What every `transformers` golden generator does the same way (tools/gen_{qwen3,qwen3_moe,gpt_oss,deepseek_v3}_goldens.py
and tools/mini/gen_draft_goldens.py): the prompts and decode scenario, writing a checkpoint's shards, capturing the
per-stage tensors through forward hooks on HF's own modules, the cached greedy loops and their checks, the rejection
rules every draw obeys, the seed search, and the golden files (`golden.safetensors`, `golden.json`) that
crates/sluice-models/tests/common/golden.rs reads.

A family's generator keeps what is its own: its configs, its published layout and formats, its router hooks, its
independent float64 forward and its golden.json notes. Nothing here imports torch at module level, so a generator's
`--help` and `--tokenizer-only` paths run without it.
"""

import argparse
import importlib.metadata
import json
import math
import os
import platform

import numpy as np

# The prompts every family's goldens hold (token ids of these texts under the fixture's tokenizer, cut to the lengths).
PROMPT_TEXTS = [
    "The",
    "The river keeper opened the gate at dawn",
    "She said, \"It's not the river that's changed.\" 河流管理员在黎明时打开了闸门 and 3.14159",
]
PROMPT_LENS = [1, 6, 24]
DECODE_TEXT = "In the spring the water is high; in the autumn it is low"
DECODE_PROMPT_LEN = 7
DECODE_STEPS = 6
GREEDY_TOKENS = 8
MIN_MARGIN = 1e-3
MIN_DISTINCT = 4  # greedy runs that just repeat a token would test little
ROPE_POSITIONS = 40
LAYER_STAGES = ("attn_in", "attn_out", "mlp_in", "mlp_out", "out")
ROUTING_STAGES = ("router_logits", "topk_ids", "topk_weights")


def versions(note=None):
    """The versions of the packages a generator ran with (recorded in golden.json)."""
    v = {"python": platform.python_version()}
    for p in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
        try:
            v[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            v[p] = None
    if note is not None:
        v["generator_note"] = note
    return v


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def margin(row):
    """Top-1 minus top-2 of a logits row."""
    s = np.sort(np.asarray(row, dtype=np.float64))
    return float(s[-1] - s[-2])


def write_json(path, obj, indent=1, ensure_ascii=False):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=ensure_ascii)
        f.write("\n")


def cli(description, out_example, configs, versions_now, extra=None):
    """A generator's command line: `--out ROOT`, `--only NAME` and what `extra(parser)` adds. Creates ROOT, prints the
    versions, and returns (args, the names of the configs to generate, sorted)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help=f"output root, e.g. {out_example}")
    ap.add_argument("--only", choices=sorted(configs), help="generate one configuration")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("versions:", json.dumps(versions_now))
    return args, [n for n in sorted(configs) if not args.only or n == args.only]


def set_threads():
    import torch

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint files


def clear_model_files(out_dir):
    """Removes a previous draw's shards, index and configs."""
    for f in os.listdir(out_dir):
        if f.startswith("model") or f in ("config.json", "generation_config.json"):
            os.remove(os.path.join(out_dir, f))


def write_sharded(tensors, out_dir, shards=2):
    """Writes `tensors` over `shards` safetensors files (model-0000i-of-0000n) and the index, as published."""
    from safetensors.torch import save_file

    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    write_json(os.path.join(out_dir, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, ensure_ascii=True)


def write_config(out_dir, cfg):
    write_json(os.path.join(out_dir, "config.json"), cfg, indent=2, ensure_ascii=True)


# ---------------------------------------------------------------------------------------------------------------
# The reference runs


def prompts_of(encode):
    """The goldens' prompts as ids under `encode` (text -> ids)."""
    prompts = [encode(s)[:n] for s, n in zip(PROMPT_TEXTS, PROMPT_LENS)]
    assert [len(p) for p in prompts] == PROMPT_LENS, [len(p) for p in prompts]
    return prompts


def capture_stages(ref, ids, router=None):
    """One no-cache forward of `ids` with hooks on HF's own modules: `embed`, each layer's `attn_in` (input_layernorm),
    `attn_out` (self_attn), `mlp_in` (post_attention_layernorm), `mlp_out` (mlp), `out` (the layer), `final_norm`,
    `logits`; and, with a `router` (an object with `record` and `calls` {layer: (logits, ids, weights)} that the
    family's router hooks fill while `record` is set), each MoE layer's `router_logits`, `topk_ids`, `topk_weights`."""
    import torch

    rec, hooks = {}, []

    def put(name):
        def hook(_mod, _args, out):
            o = out[0] if isinstance(out, tuple) else out
            rec[name] = o.detach()[0].to(torch.float32).clone().numpy()
        return hook

    m = ref.model
    hooks.append(m.embed_tokens.register_forward_hook(put("embed")))
    for i, layer in enumerate(m.layers):
        hooks.append(layer.input_layernorm.register_forward_hook(put(f"layer{i}.attn_in")))
        hooks.append(layer.self_attn.register_forward_hook(put(f"layer{i}.attn_out")))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(put(f"layer{i}.mlp_in")))
        hooks.append(layer.mlp.register_forward_hook(put(f"layer{i}.mlp_out")))
        hooks.append(layer.register_forward_hook(put(f"layer{i}.out")))
    hooks.append(m.norm.register_forward_hook(put("final_norm")))
    if router is not None:
        router.record, router.calls = True, {}
    try:
        with torch.no_grad():
            out = ref(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        if router is not None:
            router.record = False
        for h in hooks:
            h.remove()
    rec["logits"] = out.logits[0].to(torch.float32).numpy().copy()
    for i, (lg, ids_, wts) in (router.calls.items() if router is not None else ()):
        rec[f"layer{i}.router_logits"] = lg
        rec[f"layer{i}.topk_ids"] = ids_
        rec[f"layer{i}.topk_weights"] = wts
    return rec


def check_hooks_kept_logits(ref, prompts, stages):
    """A plain forward gives the logits the hooked one recorded."""
    import torch

    for p, st in zip(prompts, stages):
        with torch.no_grad():
            plain = ref(input_ids=torch.tensor([p]), use_cache=False).logits[0].numpy()
        assert np.array_equal(plain, st["logits"]), "hooks changed the logits"


def sdpa_diffs(sdpa, prompts, stages):
    """Max abs difference of the logits of the `sdpa` model against the eager ones recorded, per prompt."""
    import torch

    out = []
    for p, st in zip(prompts, stages):
        with torch.no_grad():
            out.append(float(np.abs(sdpa(input_ids=torch.tensor([p])).logits[0].numpy() - st["logits"]).max()))
    return out


def cached_greedy(ref, prompt, steps):
    """Prefill then `steps` single-token steps through a DynamicCache: (tokens, last-row logits per step)."""
    import inspect

    import torch
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=ref.config)
    except TypeError:
        cache = DynamicCache()
    kw = "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"
    logits, tokens = [], []
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([prompt]), use_cache=True, **{kw: cache})
        for s in range(steps + 1):
            row = out.logits[0, -1].to(torch.float32).numpy().copy()
            logits.append(row)
            tokens.append(int(np.argmax(row)))
            if s < steps:
                out = ref(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, **{kw: cache})
    assert cache.get_seq_length() == len(prompt) + steps, "the cache was not used"
    return tokens, np.stack(logits)


def hf_generate(ref, prompt, n):
    import torch
    from transformers import GenerationConfig

    ref.generation_config.eos_token_id = None
    gc = GenerationConfig(max_new_tokens=n, min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=None,
                          pad_token_id=ref.config.pad_token_id)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        seq = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return [int(t) for t in seq[0, len(prompt):]]


def decode_run(ref, dprompt):
    """The prefill-then-decode scenario from `dprompt`: DECODE_STEPS cached greedy steps, each checked against a full
    recompute. Returns {prompt, tokens, logits, margins, full_recompute_max_abs_diff}."""
    import torch

    dtok, dlogits = cached_greedy(ref, dprompt, DECODE_STEPS)
    full = []
    for s in range(DECODE_STEPS + 1):
        with torch.no_grad():
            lg = ref(input_ids=torch.tensor([dprompt + dtok[:s]]), use_cache=False).logits[0, -1].numpy()
        full.append(float(np.abs(lg - dlogits[s]).max()))
    assert max(full) < 1e-3, f"cached decode disagrees with a full recompute ({max(full):.3e})"
    return {"prompt": dprompt, "tokens": dtok, "logits": dlogits, "margins": [margin(r) for r in dlogits],
            "full_recompute_max_abs_diff": max(full)}


def greedy_runs(ref, prompts, generate="strict"):
    """GREEDY_TOKENS cached greedy tokens after each prompt, with their margins. `generate`: "strict" checks that
    `generate()` gives the same tokens, "lenient" records when it stops early or fails, None leaves it out."""
    runs = []
    for p in prompts:
        toks, lg = cached_greedy(ref, p, GREEDY_TOKENS - 1)
        run = {"prompt": p, "tokens": toks, "margins": [margin(r) for r in lg]}
        if generate == "strict":
            gen = hf_generate(ref, p, GREEDY_TOKENS)
            if gen != toks:
                raise AssertionError(f"generate {gen} != cached greedy loop {toks}")
            run["generate"] = "generate() equals the cached greedy loop"
        elif generate == "lenient":
            try:
                gen, note = hf_generate(ref, p, GREEDY_TOKENS), "generate() equals the cached greedy loop"
            except Exception as e:  # noqa: BLE001  (recorded; the cached loop is the same computation)
                gen, note = None, f"generate() failed: {type(e).__name__}: {e}"
            if gen is not None and gen != toks:
                if len(gen) == len(toks):
                    raise AssertionError(f"generate {gen} != cached greedy loop {toks}")
                note = f"generate() stopped early with {gen}"
            run["generate"] = note
        runs.append(run)
    return runs


def rope_tables(ref):
    """`model.rotary_emb`'s inv_freq and its cos / sin rows for positions 0..ROPE_POSITIONS-1 (f32)."""
    import torch

    rot = ref.model.rotary_emb
    pos = torch.arange(ROPE_POSITIONS)[None, :]
    with torch.no_grad():
        cos, sin = rot(torch.zeros(1, dtype=torch.float32), pos)
    return {"inv_freq": rot.inv_freq.to(torch.float32).numpy().copy(), "cos": cos[0].numpy().copy(),
            "sin": sin[0].numpy().copy()}


def draw_reasons(decode, greedy, min_margin=MIN_MARGIN, router_gap=None, min_router_gap=None):
    """Why a draw is rejected: a greedy or decode step with a top-1/top-2 margin below `min_margin`, a router call
    with a gap below `min_router_gap` (when given), a greedy run of fewer than MIN_DISTINCT distinct tokens."""
    reasons = []
    worst = min(min(decode["margins"]), min(min(g["margins"]) for g in greedy))
    if worst < min_margin:
        reasons.append(f"greedy/decode top-2 margin {worst:.2e} < {min_margin:e}")
    if min_router_gap is not None and router_gap < min_router_gap:
        reasons.append(f"router k-th/(k+1)-th logit gap {router_gap:.2e} < {min_router_gap:e}")
    runs = [g["tokens"] for g in greedy] + [decode["tokens"]]
    if min(len(set(t)) for t in runs) < MIN_DISTINCT:
        reasons.append(f"a greedy run has fewer than {MIN_DISTINCT} distinct tokens: {runs}")
    return reasons


def min_margin_of(r):
    """The smallest greedy or decode margin of a result."""
    return min(min(r["decode"]["margins"]), min(min(g["margins"]) for g in r["greedy"]))


def search(name, seed, max_attempts, attempt):
    """The first acceptable draw: `attempt(seed + a)` returns (ok, reasons, result) for a = 0, 1, ..."""
    for a in range(max_attempts):
        ok, reasons, r = attempt(seed + a)
        if ok:
            return r
        print(f"[{name}] attempt {a} (seed {seed + a}) rejected: {'; '.join(reasons)}")
    raise RuntimeError(f"{name}: no acceptable draw in {max_attempts} attempts")


# ---------------------------------------------------------------------------------------------------------------
# Golden files


def stage_lists(layers, moe_layers):
    """(per-prompt stages, per-prompt routing stages) of a model with `layers` layers, MoE on `moe_layers`."""
    per_prompt = ["embed"] + [f"layer{i}.{s}" for i in range(layers) for s in LAYER_STAGES] + ["final_norm", "logits"]
    routing = [f"layer{i}.{s}" for i in moe_layers for s in ROUTING_STAGES]
    return per_prompt, routing


def stage_template(stages):
    return [f"p{{j}}.{s}" for s in ["ids"] + stages]


def golden_tensors(prompts, stages, decode, rope, names):
    """The tensors of golden.safetensors, in file order: per prompt `p{j}.ids` and each of `names` (i32 stays i32,
    the rest f32), the decode scenario, the rope tables."""
    tensors = {}
    for j, (p, st) in enumerate(zip(prompts, stages)):
        tensors[f"p{j}.ids"] = np.array(p, dtype=np.int32)
        for s in names:
            v = st[s]
            tensors[f"p{j}.{s}"] = np.ascontiguousarray(v, dtype=np.int32 if v.dtype == np.int32 else np.float32)
    tensors["decode.prompt"] = np.array(decode["prompt"], dtype=np.int32)
    tensors["decode.tokens"] = np.array(decode["tokens"], dtype=np.int32)
    tensors["decode.logits"] = np.ascontiguousarray(decode["logits"], dtype=np.float32)
    for k in ("inv_freq", "cos", "sin"):
        tensors[f"rope.{k}"] = rope[k]
    return tensors


def save_goldens(out_dir, tensors):
    from safetensors.numpy import save_file

    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata={"format": "sluice-golden"})


def decode_json(d, rows_note=True):
    """golden.json's `decode` entry."""
    out = {"prompt": d["prompt"], "tokens": d["tokens"], "logits_tensor": "decode.logits"}
    if rows_note:
        out["logits_rows"] = ("row 0 = last row of the prefill; row s = after feeding tokens[s-1] through the "
                              "DynamicCache")
    out["margins"] = d["margins"]
    out["full_recompute_max_abs_diff"] = d["full_recompute_max_abs_diff"]
    return out


def read_config(out_dir):
    with open(os.path.join(out_dir, "config.json")) as f:
        return json.load(f)


def check_f64(name, rel_l2s):
    if max(rel_l2s) > 1e-4:
        raise AssertionError(f"{name}: numpy float64 reference disagrees with transformers")
