#!/usr/bin/env python3
"""Golden-vector generator for sluice's GPT-OSS implementation (`GptOssForCausalLM`).

For each tiny configuration (see CONFIGS) this script

1. trains a small byte-level BPE tokenizer (tools/gen_qwen3_goldens.py's trainer) with the harmony special tokens
   (`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|return|>`, `<|call|>`, ...). It is NOT o200k_harmony
   (a tiktoken BPE of 200k ranks); it gives the fixture token ids and text and nothing more;
2. draws seeded random weights and writes them itself in the PUBLISHED layout of gpt-oss-20b/120b: bf16 attention
   (`q/k/v/o_proj.{weight,bias}`, `sinks`), router (`mlp.router.{weight,bias}`), norms, embedding and lm_head, and the
   experts in MXFP4 exactly as published: `mlp.experts.{gate_up,down}_proj_blocks` U8 `[E, out, in/32, 16]`,
   `..._scales` U8 `[E, out, in/32]` (E8M0), `..._bias` bf16 `[E, out]`; gate_up rows interleave gate (even) and up
   (odd). Two shards with `model.safetensors.index.json`, and a `config.json` with the published keys
   (`layer_types`, `sliding_window`, `rope_scaling` YaRN, `rope_theta`, `num_local_experts`, `experts_per_token`,
   `swiglu_limit`, `quantization_config {quant_method: mxfp4}`, ...);
3. loads it with `GptOssForCausalLM.from_pretrained(dir, dtype=float32, attn_implementation="eager",
   quantization_config=Mxfp4Config(dequantize=True))` on CPU: transformers dequantizes the MXFP4 experts
   (`integrations/mxfp4.py`). The script checks that every parameter, the dequantized experts included, equals the
   value the published bytes encode (lut[nibble] * 2^(scale - 127), computed here independently in numpy), so the
   reference computes exactly the stored weights. It records per-stage f32 tensors through forward hooks (embedding,
   each layer's input_layernorm / self_attn / post_attention_layernorm / mlp / layer output, the final norm, logits),
   each layer's router logits, top-k ids and weights, a prefill-then-decode run through a `DynamicCache` that runs
   past the sliding window, greedy generations, and `model.rotary_emb`'s YaRN inv_freq / cos / sin;
4. cross-checks the logits against an independent float64 numpy forward over the published bytes.

Rejection rules are those of tools/gen_qwen3_moe_goldens.py (greedy/decode margins, router k-th vs (k+1)-th logit gap,
distinct greedy tokens). The draw must also exercise the SwiGLU clamp: some gate value above the limit and some up value
outside +-limit in the prompts.

Usage (needs torch; see tools/requirements-qwen3-moe.txt):
    python3 tools/gen_gpt_oss_goldens.py --out tests/fixtures/gpt_oss
"""

import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_qwen3_goldens as q3  # noqa: E402  (the tokenizer trainer)
import gen_qwen3_moe_goldens as qm  # noqa: E402  (the router watch, rejection thresholds, pinned versions)
import golden_common as gc  # noqa: E402  (prompts, shards, stage capture, greedy loops, golden files)

HARMONY_SPECIALS = ["<|endoftext|>", "<|startoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                    "<|constrain|>", "<|return|>", "<|call|>"]
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
LIMIT, ALPHA = 7.0, 1.702

CONFIGS = {
    # The published shape in miniature: layers alternate sliding (window 8 here, 128 published) and full attention,
    # YaRN as published (factor 32, beta 32/1, original 4096, truncate false, theta 150000), 8 experts top-4.
    "tiny-a": dict(seed=7001, bpe_vocab=480, vocab=512, hidden=64, inter=64, layers=4, heads=4, kv_heads=2,
                   head_dim=16, experts=8, top_k=4, window=8, eps=1e-5, theta=150000.0,
                   yarn=dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=4096,
                             truncate=False),
                   layer_types=["sliding_attention", "full_attention"] * 2, embed_std=0.5, gain=1.0,
                   gate_up_gain=4.0, router_gain=3.0, sink_std=1.0),
    # Layer types read from the config, not assumed to alternate (full, sliding, sliding); window 4; YaRN with
    # truncate true and other betas; 6 experts top-2; head_dim 16 with 6 query heads over 3 KV heads; d = 96, I = 32.
    "tiny-b": dict(seed=8002, bpe_vocab=700, vocab=768, hidden=96, inter=32, layers=3, heads=6, kv_heads=3,
                   head_dim=16, experts=6, top_k=2, window=4, eps=1e-5, theta=10000.0,
                   yarn=dict(factor=8.0, beta_fast=16.0, beta_slow=2.0, original_max_position_embeddings=64,
                             truncate=True),
                   layer_types=["full_attention", "sliding_attention", "sliding_attention"], embed_std=0.5,
                   gain=1.0, gate_up_gain=4.0, router_gain=3.0, sink_std=1.0),
}


def published_config(c, tok):
    y = c["yarn"]
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": tok.token_to_id("<|return|>"), "experts_per_token": c["top_k"], "head_dim": c["head_dim"],
        "hidden_act": "silu", "hidden_size": c["hidden"],
        "initial_context_length": y["original_max_position_embeddings"], "initializer_range": 0.02,
        "intermediate_size": c["inter"], "layer_types": c["layer_types"],
        "max_position_embeddings": int(y["original_max_position_embeddings"] * y["factor"]), "model_type": "gpt_oss",
        "num_attention_heads": c["heads"], "num_experts_per_tok": c["top_k"], "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["kv_heads"], "num_local_experts": c["experts"], "output_router_logits": False,
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rms_norm_eps": c["eps"],
        "rope_scaling": {"beta_fast": y["beta_fast"], "beta_slow": y["beta_slow"], "factor": y["factor"],
                         "original_max_position_embeddings": y["original_max_position_embeddings"],
                         "rope_type": "yarn", "truncate": y["truncate"]},
        "rope_theta": c["theta"], "router_aux_loss_coef": 0.9, "sliding_window": c["window"], "swiglu_limit": LIMIT,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": c["vocab"],
    }


def mxfp4_draw(g, experts, out, inn, std):
    """Random MXFP4 blocks/scales [E, out, in/32, 16] / [E, out, in/32] with element std about `std`."""
    import torch

    blocks = torch.randint(0, 256, (experts, out, inn // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    # E2M1 codes have an rms of 2.93; per-block exponents vary by +-1 around the one that gives `std`.
    e0 = int(round(math.log2(std / 2.93)))
    scales = (127 + e0 + torch.randint(-1, 2, (experts, out, inn // 32), generator=g, dtype=torch.int32))
    return blocks, scales.to(torch.uint8)


def mxfp4_values(blocks, scales):
    """The published bytes' values [E, out, in] in float64: byte k of a block holds element 2k (low nibble) and 2k+1
    (high nibble); value = lut[nibble] * 2^(scale - 127). Independent of transformers' dequantizer."""
    b = blocks.numpy().astype(np.int64)
    lo, hi = FP4[b & 0x0F], FP4[b >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], 32)
    vals = vals * np.exp2(scales.numpy().astype(np.float64) - 127.0)[..., None]
    return vals.reshape(b.shape[0], b.shape[1], -1)


def draw_weights(c, seed):
    """Seeded tensors under their published names (bf16 torch tensors; experts as U8 blocks/scales)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d, hd, q, kv, E, inter = (c["hidden"], c["head_dim"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"],
                              c["experts"], c["inter"])
    w = {}

    def bf(t):
        return t.to(torch.bfloat16)

    def mat(name, rows, cols, gain):
        w[name] = bf(torch.randn(rows, cols, generator=g) * (gain / math.sqrt(cols)))

    def vec(name, n, std, mean=0.0):
        w[name] = bf(mean + std * torch.randn(n, generator=g))

    w["model.embed_tokens.weight"] = bf(torch.randn(c["vocab"], d, generator=g) * c["embed_std"])
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", d, 0.25, 1.0)
        for n, rows, cols in (("q_proj", q, d), ("k_proj", kv, d), ("v_proj", kv, d), ("o_proj", d, q)):
            mat(p + f"self_attn.{n}.weight", rows, cols, c["gain"])
            vec(p + f"self_attn.{n}.bias", rows, 0.1)
        vec(p + "self_attn.sinks", c["heads"], c["sink_std"])
        vec(p + "post_attention_layernorm.weight", d, 0.25, 1.0)
        mat(p + "mlp.router.weight", E, d, c["router_gain"])
        vec(p + "mlp.router.bias", E, 0.5)
        gb, gs = mxfp4_draw(g, E, 2 * inter, d, c["gate_up_gain"] / math.sqrt(d))
        w[p + "mlp.experts.gate_up_proj_blocks"], w[p + "mlp.experts.gate_up_proj_scales"] = gb, gs
        w[p + "mlp.experts.gate_up_proj_bias"] = bf(0.1 * torch.randn(E, 2 * inter, generator=g))
        db, ds = mxfp4_draw(g, E, d, inter, c["gain"] / math.sqrt(inter) / 4.0)
        w[p + "mlp.experts.down_proj_blocks"], w[p + "mlp.experts.down_proj_scales"] = db, ds
        w[p + "mlp.experts.down_proj_bias"] = bf(0.1 * torch.randn(E, d, generator=g))
    vec("model.norm.weight", d, 0.25, 1.0)
    mat("lm_head.weight", c["vocab"], d, 1.0)
    return w


def check_loaded_equals_published(ref, w, c):
    """Every HF parameter equals the value its published bytes encode (experts dequantized independently)."""
    import torch

    sd = ref.state_dict()
    for k, v in sd.items():
        assert v.dtype == torch.float32, f"{k} is {v.dtype}, not float32"
    seen = set()
    for i in range(c["layers"]):
        p = f"model.layers.{i}.mlp.experts."
        for proj in ("gate_up_proj", "down_proj"):
            want = mxfp4_values(w[p + proj + "_blocks"], w[p + proj + "_scales"])  # [E, out, in]
            got = sd[p + proj].double().numpy()  # transformers keeps the transpose [E, in, out]
            assert np.array_equal(got, want.transpose(0, 2, 1)), f"layer {i} {proj}: dequantized experts differ"
            assert torch.equal(sd[p + proj + "_bias"], w[p + proj + "_bias"].float()), f"layer {i} {proj}_bias"
            seen |= {p + proj, p + proj + "_bias"}
    for k, v in w.items():
        if ".experts." in k:
            continue
        assert torch.equal(sd[k], v.float()), f"{k}: loaded f32 differs from the stored bf16"
        seen.add(k)
    missing = set(sd) - seen
    assert not missing, f"parameters not checked: {sorted(missing)}"


class RouterWatch(qm.RouterWatch):
    """qm.RouterWatch on GptOssTopKRouter (`mlp.router`), whose top-k is over the biased logits."""

    def __init__(self, ref, c):  # noqa: super().__init__ not called: a different module per layer
        self.c, self.min_gap, self.record, self.calls, self.hooks = c, math.inf, False, {}, []
        for i, layer in enumerate(ref.model.layers):
            self.hooks.append(layer.mlp.router.register_forward_hook(self.hook(i)))


def yarn_f64(c):
    """YaRN inv_freq and attention factor in float64 (the paper's formulas, as transformers' _compute_yarn_parameters)."""
    y, hd, base = c["yarn"], c["head_dim"], c["theta"]
    factor, orig = y["factor"], y["original_max_position_embeddings"]

    def corr_dim(rot):
        return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(y["beta_fast"]), corr_dim(y["beta_slow"])
    if y["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(hd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos = base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    return inv, 0.1 * math.log(factor) + 1.0


def numpy_f64_forward(w, c, ids):
    """Independent float64 GPT-OSS forward over the published bytes: (logits, clamp counts)."""
    p = {k: v.float().numpy().astype(np.float64) for k, v in w.items() if not k.endswith(("_blocks", "_scales"))}
    hd, nh, nkv, eps, t = c["head_dim"], c["heads"], c["kv_heads"], c["eps"], len(ids)
    inv, att_factor = yarn_f64(c)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang) * att_factor, np.sin(ang) * att_factor

    def rope(x):  # [t, heads, hd]: halves rotated (transformers _apply_rotary_emb)
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        cc, ss = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * cc - b * ss, b * cc + a * ss], -1)

    def rms(x, wt):
        return wt * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    clamps = [0, 0]
    h = p["model.embed_tokens.weight"][ids]
    for i in range(c["layers"]):
        L = f"model.layers.{i}."
        x = rms(h, p[L + "input_layernorm.weight"])
        proj = {n: x @ p[L + f"self_attn.{n}.weight"].T + p[L + f"self_attn.{n}.bias"] for n in ("q_proj", "k_proj",
                                                                                              "v_proj")}
        q, k = rope(proj["q_proj"].reshape(t, nh, hd)), rope(proj["k_proj"].reshape(t, nkv, hd))
        v = proj["v_proj"].reshape(t, nkv, hd)
        qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
        allowed = ki <= qi
        if c["layer_types"][i] == "sliding_attention":
            allowed &= ki > qi - c["window"]
        att = np.zeros((t, nh, hd))
        for hh in range(nh):
            kvh = hh // (nh // nkv)
            s = np.where(allowed, q[:, hh] @ k[:, kvh].T / math.sqrt(hd), -np.inf)
            sink = p[L + "self_attn.sinks"][hh]
            m = np.maximum(s.max(-1, keepdims=True), sink)
            e = np.exp(s - m)
            att[:, hh] = (e / (e.sum(-1, keepdims=True) + np.exp(sink - m))) @ v[:, kvh]
        h = h + att.reshape(t, nh * hd) @ p[L + "self_attn.o_proj.weight"].T + p[L + "self_attn.o_proj.bias"]
        x = rms(h, p[L + "post_attention_layernorm.weight"])
        logits = x @ p[L + "mlp.router.weight"].T + p[L + "mlp.router.bias"]
        wgu = mxfp4_values(w[L + "mlp.experts.gate_up_proj_blocks"], w[L + "mlp.experts.gate_up_proj_scales"])
        wdn = mxfp4_values(w[L + "mlp.experts.down_proj_blocks"], w[L + "mlp.experts.down_proj_scales"])
        out = np.zeros_like(x)
        for r in range(t):
            top = np.argsort(-logits[r], kind="stable")[:c["top_k"]]
            wts = np.exp(logits[r, top] - logits[r, top].max())
            wts /= wts.sum()
            for e, wt in zip(top, wts):
                gu = wgu[e] @ x[r] + p[L + "mlp.experts.gate_up_proj_bias"][e]
                gate, up = gu[0::2], gu[1::2]
                clamps[0] += int((gate > LIMIT).sum())
                clamps[1] += int((np.abs(up) > LIMIT).sum())
                gate, up = np.minimum(gate, LIMIT), np.clip(up, -LIMIT, LIMIT)
                act = (up + 1) * gate / (1 + np.exp(-ALPHA * gate))
                out[r] += wt * (wdn[e] @ act + p[L + "mlp.experts.down_proj_bias"][e])
        h = h + out
    return rms(h, p["model.norm.weight"]) @ p["lm_head.weight"].T, clamps


def attempt(c, seed, tok, out_dir):
    import torch
    from transformers import GptOssForCausalLM, Mxfp4Config

    w = draw_weights(c, seed)
    gc.clear_model_files(out_dir)
    gc.write_sharded(w, out_dir)
    gc.write_config(out_dir, published_config(c, tok))

    ref = GptOssForCausalLM.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32,
                                            quantization_config=Mxfp4Config(dequantize=True)).eval()
    ref = ref.float()
    check_loaded_equals_published(ref, w, c)
    watch = RouterWatch(ref, c)
    try:
        prompts = gc.prompts_of(lambda s: tok.encode(s).ids)
        stages = [gc.capture_stages(ref, p, watch) for p in prompts]
        gc.check_hooks_kept_logits(ref, prompts, stages)
        dprompt = tok.encode(gc.DECODE_TEXT).ids[:gc.DECODE_PROMPT_LEN]
        assert len(dprompt) + gc.DECODE_STEPS > c["window"], "the decode scenario must pass the sliding window"
        decode = gc.decode_run(ref, dprompt)
        greedy = gc.greedy_runs(ref, prompts)
        router_gap = watch.min_gap
    finally:
        watch.remove()

    f64, clamps = [], [0, 0]
    for p, st in zip(prompts, stages):
        lg, cl = numpy_f64_forward(w, c, p)
        f64.append(gc.rel_l2(st["logits"], lg))
        clamps = [clamps[0] + cl[0], clamps[1] + cl[1]]

    reasons = gc.draw_reasons(decode, greedy, router_gap=router_gap, min_router_gap=qm.MIN_ROUTER_GAP)
    if min(clamps) == 0:
        reasons.append(f"the SwiGLU clamp is not exercised (gate > limit {clamps[0]}, |up| > limit {clamps[1]})")
    rope = dict(gc.rope_tables(ref), attention_scaling=float(ref.model.rotary_emb.attention_scaling))
    res = {"seed": seed, "rope": rope, "prompts": prompts, "stages": stages, "decode": decode, "greedy": greedy,
           "numpy_f64_logits_rel_l2": f64, "router_min_gap": router_gap, "clamps": clamps,
           "vocab_tok": tok.get_vocab_size(with_added_tokens=True)}
    return not reasons, reasons, res


def write_tokenizer(tok, out_dir):
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    decoder = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": True} for s in HARMONY_SPECIALS}
    cfg = {"added_tokens_decoder": decoder, "bos_token": "<|startoftext|>", "clean_up_tokenization_spaces": False,
           "eos_token": "<|return|>", "model_max_length": 131072, "pad_token": "<|endoftext|>",
           "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def generate(name, c, root):
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    tok = q3.build_tokenizer(c["bpe_vocab"], specials=HARMONY_SPECIALS, plain_added=[])
    write_tokenizer(tok, out_dir)
    import gen_family_chat_goldens  # the published chat template, as gpt-oss ships it (chat_template.jinja)

    gen_family_chat_goldens.install_chat_template(out_dir, "gpt_oss")
    gc.set_threads()
    r = gc.search(name, c["seed"], qm.MAX_ATTEMPTS, lambda seed: attempt(c, seed, tok, out_dir))

    per_prompt, routing = gc.stage_lists(c["layers"], range(c["layers"]))
    gc.save_goldens(out_dir, gc.golden_tensors(r["prompts"], r["stages"], r["decode"], r["rope"],
                                               per_prompt + routing))
    d = r["decode"]
    gj = {
        "config_name": name,
        "seed": r["seed"],
        "generator": "tools/gen_gpt_oss_goldens.py",
        "reference": "transformers GptOssForCausalLM on CPU, from_pretrained(dtype=float32, attn_implementation="
                     "'eager', quantization_config=Mxfp4Config(dequantize=True)): f32 computation of the published "
                     "bf16 and MXFP4 weights (dequantized values checked equal to lut[nibble] * 2^(scale - 127))",
        "versions": qm.versions(),
        "config": gc.read_config(out_dir),
        "tokenizer_vocab_size": r["vocab_tok"],
        "prompts": r["prompts"],
        "prompt_texts": gc.PROMPT_TEXTS,
        "stage_template": gc.stage_template(per_prompt + routing),
        "stage_notes": {
            "attn_out": "self_attn output after o_proj (+ bias) [T,d]",
            "mlp_out": "GptOssMLP output [T,d]",
            "router_logits": "GptOssTopKRouter logits (with bias) [T,E]",
            "topk_ids": "top-k expert ids over the router logits [T,k], I32, logit descending",
            "topk_weights": "softmax over the k chosen logits [T,k]",
        },
        "decode": gc.decode_json(d),
        "greedy": r["greedy"],
        "rope": {"attention_scaling": r["rope"]["attention_scaling"],
                 "tensors": "rope.inv_freq [head_dim/2], rope.cos / rope.sin [40, head_dim/2] (YaRN, scaled by "
                            "attention_scaling) from model.rotary_emb"},
        "checks": {"numpy_f64_vs_hf_logits_rel_l2": r["numpy_f64_logits_rel_l2"],
                   "router_min_topk_gap": r["router_min_gap"],
                   "swiglu_clamped_in_prompts": {"gate_above_limit": r["clamps"][0],
                                                 "up_outside_limit": r["clamps"][1]}},
    }
    gc.write_json(os.path.join(out_dir, "golden.json"), gj)
    print(f"[{name}] seed {r['seed']}; decode vs full recompute max abs {d['full_recompute_max_abs_diff']:.3e}; "
          f"numpy f64 logits relL2 {max(r['numpy_f64_logits_rel_l2']):.3e}; router gap {r['router_min_gap']:.3e}; "
          f"clamps {r['clamps']}; min margin {gc.min_margin_of(r):.3e}")
    gc.check_f64(name, r["numpy_f64_logits_rel_l2"])


def main():
    args, names = gc.cli("Generate tiny GPT-OSS checkpoints and HF transformers goldens.", "tests/fixtures/gpt_oss",
                         CONFIGS, qm.versions())
    for name in names:
        generate(name, CONFIGS[name], args.out)

if __name__ == "__main__":
    main()
