#!/usr/bin/env python3
"""Golden-vector generator for sluice's Qwen3 dense implementation (`Qwen3ForCausalLM`).

For each tiny configuration (`tiny-a`: tied embeddings, `tiny-b`: untied lm_head and head_dim != hidden/heads)
this script

1. trains a small byte-level BPE tokenizer with the Python `tokenizers` library, laid out like Qwen3's
   (NFC normalizer, the Qwen2/Qwen3 split regex, ByteLevel pre-tokenizer without its own regex, ByteLevel
   decoder, `<|endoftext|>`/`<|im_start|>`/`<|im_end|>` special tokens and `<think>`/`</think>` plain added
   tokens after the BPE vocabulary), and saves `tokenizer.json` + `tokenizer_config.json`;
2. builds `Qwen3Config(...)` and a `Qwen3ForCausalLM` with seeded random weights (scaled so that logits have
   usable margins), rounds every weight to bf16 and writes the model with `save_pretrained` in bf16
   (`model.safetensors`, `config.json`, `generation_config.json`);
3. loads that directory back with `Qwen3ForCausalLM.from_pretrained(dir, dtype=float32,
   attn_implementation="eager")` on CPU, so the bf16 weights are widened exactly, checks that every loaded
   parameter equals the bf16-rounded original, and records per-stage f32 tensors through forward hooks on
   HF's own modules (embedding, each layer's input_layernorm / self_attn / post_attention_layernorm / mlp /
   layer output, the final norm, logits) for several prompts; a prefill-then-decode run through a
   `DynamicCache`; and greedy generations from `generate(do_sample=False)`;
4. cross-checks the logits against an independent float64 numpy implementation and against HF's `sdpa`
   attention, and records encode/decode results of the Python tokenizer on varied strings.

Everything is deterministic from the seeds in CONFIGS. A draw whose greedy or decode steps have a top-1/top-2
logit margin below MIN_MARGIN is rejected and the next seed (seed + attempt) is tried, so f32 rounding noise
can never flip a greedy token in a consumer's test; so is a draw with a greedy run of fewer than MIN_DISTINCT
distinct tokens (a run that repeats one token tests little).

Usage (needs torch; see tools/requirements-qwen3.txt):
    python3 tools/gen_qwen3_goldens.py --out tests/fixtures/qwen3
    python3 tools/gen_qwen3_goldens.py --out /tmp/q --tokenizer-only   # no torch needed
"""

import argparse
import importlib.metadata
import inspect
import json
import math
import os
import platform
import sys

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402  (shared training text and test strings, same directory)

# The pre-tokenizer split of Qwen2/Qwen2.5/Qwen3's tokenizer.json.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<think>", "</think>"]

CONFIGS = {
    # Tied embeddings, head_dim = hidden / heads, GQA 4 heads over 2 KV heads, Qwen3's rope_theta 1e6.
    "tiny-a": dict(seed=3001, bpe_vocab=480, vocab=512, hidden=64, inter=160, layers=3, heads=4, kv_heads=2,
                   head_dim=16, tie=True, theta=1_000_000.0, eps=1e-6, max_pos=512, embed_std=0.1, gain=2.0),
    # Untied lm_head, head_dim 32 != 48 / 6 (q_proj 192 wide), GQA 6 heads over 2 KV heads (groups of 3),
    # rope_theta 1e4, eps 1e-5, a model vocabulary padded past the tokenizer's (as the real Qwen3 is).
    "tiny-b": dict(seed=4002, bpe_vocab=700, vocab=768, hidden=48, inter=96, layers=4, heads=6, kv_heads=2,
                   head_dim=32, tie=False, theta=10_000.0, eps=1e-5, max_pos=256, embed_std=1.0, gain=0.9),
}

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
MAX_ATTEMPTS = 20


def tokenizer_cases():
    """(name, text) pairs: the shared tokenizer test strings (long ones left out) plus Qwen chat markup."""
    cases = [(n, t) for n, t in tokenizer_corpus.test_cases() if isinstance(t, str) and not n.startswith("long_")]
    cases = [(n, t) for n, t in cases if not n.startswith("random_") or int(n[7:]) < 8]
    cases += [
        ("qwen_chat", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                      "<|im_start|>assistant\n"),
        ("qwen_think", "<think>\nLet me think: 2 + 2 = 4.\n</think>\n\nThe answer is 4.<|im_end|>"),
        ("qwen_eot", "end of text<|endoftext|>next document"),
        ("qwen_glued_specials", "<|im_end|><|im_start|><think></think><|endoftext|>"),
        ("qwen_partial_special", "<|im_sta <think <|endoftext| im_end|>"),
    ]
    return cases


def build_tokenizer(bpe_vocab, specials=None, plain_added=None):
    """A Qwen3-shaped byte-level BPE tokenizer trained on the shared corpus (other special tokens on request)."""
    specials = SPECIALS if specials is None else specials
    plain_added = PLAIN_ADDED if plain_added is None else plain_added
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([tokenizer_corpus.corpus()], trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain_added])
    return tok


def write_tokenizer(tok, out_dir):
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    decoder = {}
    for s in SPECIALS + PLAIN_ADDED:
        decoder[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": s in SPECIALS}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder, "bos_token": None,
           "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
           "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
           "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def tokenizer_goldens(tok):
    out = []
    for name, text in tokenizer_cases():
        ids = tok.encode(text).ids
        out.append({"name": name, "text": text, "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


# ---------------------------------------------------------------------------------------------------------------
# Model


def make_config(c, tok):
    from transformers import Qwen3Config

    kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["inter"],
              num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
              head_dim=c["head_dim"], hidden_act="silu", max_position_embeddings=c["max_pos"],
              rms_norm_eps=c["eps"], tie_word_embeddings=c["tie"], attention_bias=False,
              use_sliding_window=False, bos_token_id=tok.token_to_id("<|endoftext|>"),
              eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"))
    if "rope_parameters" in inspect.signature(Qwen3Config).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": c["theta"]}
    else:  # transformers 4.x
        kw["rope_theta"] = c["theta"]
        kw["rope_scaling"] = None
    return Qwen3Config(**kw)


def init_weights(model, seed, embed_std, gain):
    """Seeded weights with O(1) activations and logits; every value is rounded to bf16 in place.

    Norm weights are 1 + N(0, 0.25^2), embedding rows N(0, embed_std^2), projections N(0, gain^2 / fan_in). With tied
    embeddings the logit of the current token contains |e_tok|^2 and greedy decoding of a smooth random model
    repeats its input; small embedding rows and a larger gain (tiny-a) leave the layers in charge.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.25 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g) * embed_std
            else:
                v = torch.randn(p.shape, generator=g) * (gain / math.sqrt(p.shape[1]))
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def capture_stages(ref, ids):
    """One no-cache forward of `ids` with hooks on HF's own modules."""
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
    try:
        with torch.no_grad():
            out = ref(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    rec["logits"] = out.logits[0].to(torch.float32).numpy().copy()
    return rec


def margin(row):
    s = np.sort(np.asarray(row, dtype=np.float64))
    return float(s[-1] - s[-2])


def cached_greedy(ref, prompt, steps):
    """Prefill then `steps` single-token steps through a DynamicCache: (tokens, last-row logits per step)."""
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


def numpy_f64_logits(ref, ids):
    """Independent float64 Qwen3 forward (no HF code) over the loaded f32 parameters."""
    cfg = ref.config
    p = {k: v.detach().to("cpu").double().numpy() for k, v in ref.state_dict().items()}
    hd, nh, nkv, eps = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps
    theta = cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta

    def rms(x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    t = len(ids)
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [t, heads, hd]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    h = p["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(cfg.num_hidden_layers):
        L = f"model.layers.{i}."
        x = rms(h, p[L + "input_layernorm.weight"])
        q = rope(rms((x @ p[L + "self_attn.q_proj.weight"].T).reshape(t, nh, hd), p[L + "self_attn.q_norm.weight"]))
        k = rope(rms((x @ p[L + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd), p[L + "self_attn.k_norm.weight"]))
        v = (x @ p[L + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd)
        att = np.zeros((t, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kv].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        h = h + att.reshape(t, nh * hd) @ p[L + "self_attn.o_proj.weight"].T
        x = rms(h, p[L + "post_attention_layernorm.weight"])
        gt, up = x @ p[L + "mlp.gate_proj.weight"].T, x @ p[L + "mlp.up_proj.weight"].T
        h = h + (gt / (1.0 + np.exp(-gt)) * up) @ p[L + "mlp.down_proj.weight"].T
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    return rms(h, p["model.norm.weight"]) @ head.T


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def attempt(c, seed, tok, out_dir):
    """Writes the checkpoint for `seed`, runs the reference; returns (ok, reasons, results)."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = make_config(c, tok)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    init_weights(model, seed, c["embed_std"], c["gain"])
    for f in os.listdir(out_dir):
        if f.startswith("model") or f in ("config.json", "generation_config.json"):
            os.remove(os.path.join(out_dir, f))
    model.to(torch.bfloat16).save_pretrained(out_dir)
    saved = load_file(os.path.join(out_dir, "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in saved.values()), "weights must be saved as bf16"
    assert ("lm_head.weight" in saved) != c["tie"], "lm_head.weight must be saved iff untied"

    kw = {"dtype": torch.float32} if int(importlib.metadata.version("transformers").split(".")[0]) >= 5 \
        else {"torch_dtype": torch.float32}
    ref = Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="eager", **kw).eval()
    sd = ref.state_dict()
    for k, v in saved.items():
        assert torch.equal(sd[k], v.to(torch.float32)), f"{k}: loaded f32 differs from the stored bf16"
    attn_impl = getattr(ref.config, "_attn_implementation", None)

    vocab_tok = tok.get_vocab_size(with_added_tokens=True)
    prompts = [tok.encode(s).ids[:n] for s, n in zip(PROMPT_TEXTS, PROMPT_LENS)]
    assert [len(p) for p in prompts] == PROMPT_LENS, [len(p) for p in prompts]
    stages = [capture_stages(ref, p) for p in prompts]
    for p, st in zip(prompts, stages):
        with torch.no_grad():
            plain = ref(input_ids=torch.tensor([p]), use_cache=False).logits[0].numpy()
        assert np.array_equal(plain, st["logits"]), "hooks changed the logits"

    sdpa = Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="sdpa", **kw).eval()
    sdpa_diff, f64 = [], []
    for p, st in zip(prompts, stages):
        with torch.no_grad():
            sdpa_diff.append(float(np.abs(sdpa(input_ids=torch.tensor([p])).logits[0].numpy() - st["logits"]).max()))
        f64.append(rel_l2(st["logits"], numpy_f64_logits(ref, p)))

    dprompt = tok.encode(DECODE_TEXT).ids[:DECODE_PROMPT_LEN]
    dtok, dlogits = cached_greedy(ref, dprompt, DECODE_STEPS)
    full = []
    for s in range(DECODE_STEPS + 1):
        with torch.no_grad():
            lg = ref(input_ids=torch.tensor([dprompt + dtok[:s]]), use_cache=False).logits[0, -1].numpy()
        full.append(float(np.abs(lg - dlogits[s]).max()))
    assert max(full) < 1e-3, f"cached decode disagrees with a full recompute ({max(full):.3e})"
    decode = {"prompt": dprompt, "tokens": dtok, "logits": dlogits, "margins": [margin(r) for r in dlogits],
              "full_recompute_max_abs_diff": max(full)}

    greedy = []
    for p in prompts:
        toks, lg = cached_greedy(ref, p, GREEDY_TOKENS - 1)
        try:
            gen, gen_note = hf_generate(ref, p, GREEDY_TOKENS), "generate() equals the cached greedy loop"
        except Exception as e:  # noqa: BLE001  (recorded; the cached loop is the same computation)
            gen, gen_note = None, f"generate() failed: {type(e).__name__}: {e}"
        if gen is not None and gen != toks:
            if len(gen) == len(toks):
                raise AssertionError(f"generate {gen} != cached greedy loop {toks}")
            gen_note = f"generate() stopped early with {gen}"
        greedy.append({"prompt": p, "tokens": toks, "margins": [margin(r) for r in lg], "generate": gen_note})

    reasons = []
    worst = min(min(decode["margins"]), min(min(g["margins"]) for g in greedy))
    if worst < MIN_MARGIN:
        reasons.append(f"greedy/decode top-2 margin {worst:.2e} < {MIN_MARGIN:e}")
    runs = [g["tokens"] for g in greedy] + [dtok]
    if min(len(set(t)) for t in runs) < MIN_DISTINCT:
        reasons.append(f"a greedy run has fewer than {MIN_DISTINCT} distinct tokens: {runs}")
    rot = ref.model.rotary_emb
    pos = torch.arange(ROPE_POSITIONS)[None, :]
    with torch.no_grad():
        cos, sin = rot(torch.zeros(1, dtype=torch.float32), pos)
    rope = {"inv_freq": rot.inv_freq.to(torch.float32).numpy().copy(), "cos": cos[0].numpy().copy(),
            "sin": sin[0].numpy().copy(), "inv_freq_dtype": str(rot.inv_freq.dtype)}
    res = {"seed": seed, "rope": rope, "attn_impl": attn_impl, "config": cfg, "prompts": prompts, "stages": stages,
           "decode": decode, "greedy": greedy, "sdpa_max_abs_diff": sdpa_diff, "numpy_f64_logits_rel_l2": f64,
           "vocab_tok": vocab_tok}
    return not reasons, reasons, res


def versions():
    v = {"python": platform.python_version()}
    for p in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
        try:
            v[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            v[p] = None
    return v


def generate(name, c, root, tokenizer_only):
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(c["bpe_vocab"])
    write_tokenizer(tok, out_dir)
    tok_cases = tokenizer_goldens(tok)
    if tokenizer_only:
        with open(os.path.join(out_dir, "tokenizer_golden.json"), "w") as f:
            json.dump({"versions": versions(), "cases": tok_cases}, f, indent=1, ensure_ascii=False)
        print(f"[{name}] tokenizer: {tok.get_vocab_size(with_added_tokens=True)} ids, {len(tok_cases)} cases")
        return
    import torch
    from safetensors.numpy import save_file

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    for a in range(MAX_ATTEMPTS):
        ok, reasons, r = attempt(c, c["seed"] + a, tok, out_dir)
        if ok:
            break
        print(f"[{name}] attempt {a} (seed {c['seed'] + a}) rejected: {'; '.join(reasons)}")
    else:
        raise RuntimeError(f"{name}: no acceptable draw in {MAX_ATTEMPTS} attempts")

    tensors, stage_names = {}, []
    per_prompt = ["embed"] + [f"layer{i}.{s}" for i in range(c["layers"])
                              for s in ("attn_in", "attn_out", "mlp_in", "mlp_out", "out")] + ["final_norm", "logits"]
    for j, (p, st) in enumerate(zip(r["prompts"], r["stages"])):
        tensors[f"p{j}.ids"] = np.array(p, dtype=np.int32)
        for s in per_prompt:
            tensors[f"p{j}.{s}"] = np.ascontiguousarray(st[s], dtype=np.float32)
    d = r["decode"]
    tensors["decode.prompt"] = np.array(d["prompt"], dtype=np.int32)
    tensors["decode.tokens"] = np.array(d["tokens"], dtype=np.int32)
    tensors["decode.logits"] = np.ascontiguousarray(d["logits"], dtype=np.float32)
    tensors["rope.inv_freq"] = r["rope"]["inv_freq"]
    tensors["rope.cos"] = r["rope"]["cos"]
    tensors["rope.sin"] = r["rope"]["sin"]
    stage_names = list(tensors)
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata={"format": "sluice-golden"})

    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    gj = {
        "config_name": name,
        "seed": r["seed"],
        "generator": "tools/gen_qwen3_goldens.py",
        "reference": "transformers Qwen3ForCausalLM on CPU, loaded with from_pretrained(dtype=float32, "
                     "attn_implementation='eager') from the bf16 checkpoint: an f32 computation of bf16 weights",
        "versions": versions(),
        "config": cfg,
        "tokenizer_vocab_size": r["vocab_tok"],
        "prompts": r["prompts"],
        "prompt_texts": PROMPT_TEXTS,
        "stage_template": [f"p{{j}}.{s}" for s in ["ids"] + per_prompt],
        "stage_names": stage_names,
        "stage_notes": {
            "embed": "embed_tokens(ids) [T,d]",
            "attn_in": "input_layernorm output [T,d]",
            "attn_out": "self_attn output after o_proj [T,d]",
            "mlp_in": "post_attention_layernorm output [T,d]",
            "mlp_out": "mlp output [T,d]",
            "out": "decoder layer output (residual stream) [T,d]",
            "final_norm": "model.norm output [T,d]",
            "logits": "lm_head(final_norm) [T,V]",
        },
        "decode": {"prompt": d["prompt"], "tokens": d["tokens"], "logits_tensor": "decode.logits",
                   "logits_rows": "row 0 = last row of the prefill; row s = after feeding tokens[s-1] through "
                                  "the DynamicCache",
                   "margins": d["margins"], "full_recompute_max_abs_diff": d["full_recompute_max_abs_diff"]},
        "greedy": r["greedy"],
        "rope": {"inv_freq_dtype": r["rope"]["inv_freq_dtype"],
                 "tensors": f"rope.inv_freq [head_dim/2], rope.cos and rope.sin [{ROPE_POSITIONS}, head_dim] from "
                            f"model.rotary_emb for positions 0..{ROPE_POSITIONS - 1}"},
        "checks": {"sdpa_vs_eager_logits_max_abs": r["sdpa_max_abs_diff"],
                   "numpy_f64_vs_hf_logits_rel_l2": r["numpy_f64_logits_rel_l2"],
                   "attn_implementation": r["attn_impl"]},
        "tokenizer_cases": tok_cases,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(gj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"[{name}] seed {r['seed']}; decode vs full recompute max abs {d['full_recompute_max_abs_diff']:.3e}; "
          f"sdpa vs eager {max(r['sdpa_max_abs_diff']):.3e}; numpy f64 logits relL2 "
          f"{max(r['numpy_f64_logits_rel_l2']):.3e}; min margin "
          f"{min(min(d['margins']), min(min(g['margins']) for g in r['greedy'])):.3e}")
    if max(r["numpy_f64_logits_rel_l2"]) > 1e-4:
        raise AssertionError(f"{name}: numpy float64 reference disagrees with transformers")


def main():
    ap = argparse.ArgumentParser(description="Generate tiny Qwen3 checkpoints and HF transformers goldens.")
    ap.add_argument("--out", required=True, help="output root, e.g. tests/fixtures/qwen3")
    ap.add_argument("--only", choices=sorted(CONFIGS), help="generate one configuration")
    ap.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer files (no torch)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("versions:", json.dumps(versions()))
    for name in sorted(CONFIGS):
        if args.only and name != args.only:
            continue
        generate(name, CONFIGS[name], args.out, args.tokenizer_only)


if __name__ == "__main__":
    main()
