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

import importlib.metadata
import inspect
import json
import math
import os
import sys

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402  (prompts, stage capture, greedy loops, golden files)
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


def numpy_f64_logits(ref, ids):
    """Independent float64 Qwen3 forward (no HF code) over the loaded f32 parameters."""
    cfg = ref.config
    p = {k: v.detach().to("cpu").double().numpy() for k, v in ref.state_dict().items()}
    theta = cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta
    dims = dict(head_dim=cfg.head_dim, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                eps=cfg.rms_norm_eps, theta=theta, layers=cfg.num_hidden_layers, tie=cfg.tie_word_embeddings)

    def mlp(i, x):
        L = f"model.layers.{i}."
        gt, up = x @ p[L + "mlp.gate_proj.weight"].T, x @ p[L + "mlp.up_proj.weight"].T
        return (gt / (1.0 + np.exp(-gt)) * up) @ p[L + "mlp.down_proj.weight"].T

    return qwen_f64_logits(p, dims, ids, mlp)


def qwen_f64_logits(p, dims, ids, mlp):
    """The float64 Qwen3 decoder (no HF code) over `p`, float64 arrays under the published names: pre-norm GQA
    attention with q/k RMSNorm and RoPE, then `mlp(i, x)`, layer i's MLP on its normed input (dense here, the
    sparse block in tools/gen_qwen3_moe_goldens.py); `dims` holds head_dim, heads, kv_heads, eps, theta, layers and
    tie. Returns the logits [T, V]."""
    hd, nh, nkv, eps = dims["head_dim"], dims["heads"], dims["kv_heads"], dims["eps"]

    def rms(x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    t = len(ids)
    inv = 1.0 / dims["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [t, heads, hd]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    h = p["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(dims["layers"]):
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
        h = h + mlp(i, x)
    head = p["model.embed_tokens.weight"] if dims["tie"] else p["lm_head.weight"]
    return rms(h, p["model.norm.weight"]) @ head.T


def attempt(c, seed, tok, out_dir):
    """Writes the checkpoint for `seed`, runs the reference; returns (ok, reasons, results)."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = make_config(c, tok)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    init_weights(model, seed, c["embed_std"], c["gain"])
    gc.clear_model_files(out_dir)
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
    prompts = gc.prompts_of(lambda s: tok.encode(s).ids)
    stages = [gc.capture_stages(ref, p) for p in prompts]
    gc.check_hooks_kept_logits(ref, prompts, stages)

    sdpa = Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="sdpa", **kw).eval()
    sdpa_diff = gc.sdpa_diffs(sdpa, prompts, stages)
    f64 = [gc.rel_l2(st["logits"], numpy_f64_logits(ref, p)) for p, st in zip(prompts, stages)]
    decode = gc.decode_run(ref, tok.encode(gc.DECODE_TEXT).ids[:gc.DECODE_PROMPT_LEN])
    greedy = gc.greedy_runs(ref, prompts, generate="lenient")
    reasons = gc.draw_reasons(decode, greedy)
    rope = dict(gc.rope_tables(ref), inv_freq_dtype=str(ref.model.rotary_emb.inv_freq.dtype))
    res = {"seed": seed, "rope": rope, "attn_impl": attn_impl, "config": cfg, "prompts": prompts, "stages": stages,
           "decode": decode, "greedy": greedy, "sdpa_max_abs_diff": sdpa_diff, "numpy_f64_logits_rel_l2": f64,
           "vocab_tok": vocab_tok}
    return not reasons, reasons, res


def generate(name, c, root, tokenizer_only):
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(c["bpe_vocab"])
    write_tokenizer(tok, out_dir)
    tok_cases = tokenizer_goldens(tok)
    if tokenizer_only:
        with open(os.path.join(out_dir, "tokenizer_golden.json"), "w") as f:
            json.dump({"versions": gc.versions(), "cases": tok_cases}, f, indent=1, ensure_ascii=False)
        print(f"[{name}] tokenizer: {tok.get_vocab_size(with_added_tokens=True)} ids, {len(tok_cases)} cases")
        return
    gc.set_threads()
    r = gc.search(name, c["seed"], MAX_ATTEMPTS, lambda seed: attempt(c, seed, tok, out_dir))

    per_prompt, _ = gc.stage_lists(c["layers"], [])
    tensors = gc.golden_tensors(r["prompts"], r["stages"], r["decode"], r["rope"], per_prompt)
    gc.save_goldens(out_dir, tensors)
    d = r["decode"]
    gj = {
        "config_name": name,
        "seed": r["seed"],
        "generator": "tools/gen_qwen3_goldens.py",
        "reference": "transformers Qwen3ForCausalLM on CPU, loaded with from_pretrained(dtype=float32, "
                     "attn_implementation='eager') from the bf16 checkpoint: an f32 computation of bf16 weights",
        "versions": gc.versions(),
        "config": gc.read_config(out_dir),
        "tokenizer_vocab_size": r["vocab_tok"],
        "prompts": r["prompts"],
        "prompt_texts": gc.PROMPT_TEXTS,
        "stage_template": gc.stage_template(per_prompt),
        "stage_names": list(tensors),
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
        "decode": gc.decode_json(d),
        "greedy": r["greedy"],
        "rope": {"inv_freq_dtype": r["rope"]["inv_freq_dtype"],
                 "tensors": f"rope.inv_freq [head_dim/2], rope.cos and rope.sin [{gc.ROPE_POSITIONS}, head_dim] from "
                            f"model.rotary_emb for positions 0..{gc.ROPE_POSITIONS - 1}"},
        "checks": {"sdpa_vs_eager_logits_max_abs": r["sdpa_max_abs_diff"],
                   "numpy_f64_vs_hf_logits_rel_l2": r["numpy_f64_logits_rel_l2"],
                   "attn_implementation": r["attn_impl"]},
        "tokenizer_cases": tok_cases,
    }
    gc.write_json(os.path.join(out_dir, "golden.json"), gj)
    print(f"[{name}] seed {r['seed']}; decode vs full recompute max abs {d['full_recompute_max_abs_diff']:.3e}; "
          f"sdpa vs eager {max(r['sdpa_max_abs_diff']):.3e}; numpy f64 logits relL2 "
          f"{max(r['numpy_f64_logits_rel_l2']):.3e}; min margin {gc.min_margin_of(r):.3e}")
    gc.check_f64(name, r["numpy_f64_logits_rel_l2"])


def main():
    args, names = gc.cli("Generate tiny Qwen3 checkpoints and HF transformers goldens.", "tests/fixtures/qwen3",
                         CONFIGS, gc.versions(),
                         lambda ap: ap.add_argument("--tokenizer-only", action="store_true",
                                                    help="write only the tokenizer files (no torch)"))
    for name in names:
        generate(name, CONFIGS[name], args.out, args.tokenizer_only)

if __name__ == "__main__":
    main()
