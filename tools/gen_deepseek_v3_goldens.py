#!/usr/bin/env python3
"""Golden-vector generator for sluice's DeepSeek-V3 family (`DeepseekV3ForCausalLM`: DeepSeek V3/R1, Kimi K2).

Two tiny checkpoints, each written by this script in a PUBLISHED layout (transformers cannot write either: it
neither saves FP8 block-quantized nor compressed-tensors checkpoints of this model):

- tiny-a, DeepSeek-V3 / R1 style (`model_type` deepseek_v3): every linear layer FP8 e4m3 with an F32
  `weight_scale_inv` of shape [ceil(M/128), ceil(N/128)] (hidden 200 and widths 160 / 200 make partial blocks on
  both axes), `quantization_config` as published ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
  [128, 128], "activation_scheme": "dynamic"}); bf16 embedding, norms, lm_head and router `mlp.gate.weight`, F32
  `e_score_correction_bias`; q LoRA, kv LoRA, decoupled RoPE (interleaved, `rope_interleave` default), YaRN
  (`factor`, `mscale`, `mscale_all_dim`), `first_k_dense_replace` 1, `n_group` 4 with `topk_group` 2,
  `norm_topk_prob`, `routed_scaling_factor` 2.5, one shared expert, sigmoid scores plus the correction bias; a
  `tokenizer.json` (byte-level BPE) with DeepSeek's special tokens and the DeepSeek V3/R1 chat template.
- tiny-b, Kimi K2 Thinking style (`model_type` kimi_k2): bf16 spine, routed experts in compressed-tensors
  `pack-quantized` INT4 (`weight_packed` I32 [out, in/8] with element e at bits 4*(e%8) of word e/8, stored as
  q + 8; `weight_scale` bf16 [out, in/32]; `weight_shape` I32 [2]; symmetric, group 32), `quantization_config`
  as Kimi K2 Thinking publishes it, `q_lora_rank` null (V2-Lite-style `q_proj`), n_group 1, YaRN with mscale !=
  mscale_all_dim; a tiny tiktoken model (`tiktoken.model`) with Kimi K2's special tokens and chat template.

The reference is transformers' `DeepseekV3ForCausalLM` in float32 on CPU (eager attention), built from the config
and loaded with the DEQUANTIZED weights (FP8 value = f32(q) * scale per 128x128 block, DeepSeek-V3
`inference/kernel.py` weight_dequant; INT4 value = (nibble - 8) * f32(bf16 scale)), so the reference computes
exactly the values the published-format tensors hold. Stages are recorded with forward hooks on HF's modules.

Routing follows DeepSeek's reference (`inference/model.py`, `Gate.forward`): groups scored by the sum of their top-2
biased scores, excluded groups masked with -inf, top-k sorted by biased score, weights the unbiased sigmoid scores
of the chosen experts, normalised, times `routed_scaling_factor`. transformers 4.x `DeepseekV3TopkRouter` filled
excluded groups with 0.0 instead, which picks experts from excluded groups whenever fewer than k biased scores in
the kept groups are positive. The script replaces the router's forward with DeepSeek's (ROUTER below; it also
records the routing and sorts the top-k, which transformers leaves unsorted), checks on every call that the stock
transformers 5.17 router picks the same experts (5.x masks with -inf too), and requires tiny-a to contain router
calls where a 0.0 fill would have routed differently (its layer-2 correction biases are strongly negative), so the
goldens pin that corner.

A draw is rejected (next seed) when a greedy/decode step has a top-1/top-2 logit margin below MIN_MARGIN, when any
router call has a gap below MIN_ROUTER_GAP between its k-th and (k+1)-th biased score in the kept groups or between
its topk_group-th and next group score, or when a greedy run has fewer than MIN_DISTINCT distinct tokens.
An independent float64 numpy forward over the dequantized tensors (published names) checks the logits.

Usage (see tools/requirements-deepseek-v3.txt):
    python3 tools/gen_deepseek_v3_goldens.py --out tests/fixtures/deepseek_v3
"""

import base64
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_qwen3_goldens as q3  # noqa: E402  (the BPE tokenizer trainer)
import golden_common as gc  # noqa: E402  (prompts, shards, stage capture, greedy loops, golden files)

CONFIGS = {
    "tiny-a": dict(
        kind="deepseek_v3", seed=7001, bpe_vocab=470, vocab=512, hidden=200, inter=160, moe_inter=48, layers=3,
        heads=4, q_lora=96, kv_lora=64, nope=32, rope=16, v=32, experts=16, top_k=4, n_group=4, topk_group=2,
        shared=1, first_dense=1, rsf=2.5, norm_topk=True, eps=1e-6, theta=10000.0,
        yarn=dict(factor=40.0, mscale=1.0, mscale_all_dim=1.0, original_max_position_embeddings=64,
                  beta_fast=32, beta_slow=1),
        max_pos=2560, bias=[(0.0, 0.05), (-0.5, 0.08)], embed_std=0.5, gain=1.5, router_gain=2.5,
    ),
    "tiny-b": dict(
        kind="kimi_k2", seed=8001, merges=144, hidden=96, inter=128, moe_inter=64, layers=3, heads=3,
        q_lora=None, kv_lora=48, nope=32, rope=16, v=24, experts=12, top_k=3, n_group=1, topk_group=1,
        shared=1, first_dense=1, rsf=2.827, norm_topk=True, eps=1e-5, theta=50000.0,
        yarn=dict(factor=32.0, mscale=0.707, mscale_all_dim=1.0, original_max_position_embeddings=64,
                  beta_fast=32, beta_slow=1),
        max_pos=2048, bias=[(0.02, 0.05), (0.0, 0.05)], embed_std=0.5, gain=1.5, router_gain=2.5,
    ),
}

MIN_ROUTER_GAP = 2e-4
MAX_ATTEMPTS = 40

# DeepSeek V3's special tokens (tokenizer_config.json of deepseek-ai/DeepSeek-V3; the ids there are 0, 1 and
# 128798.. for the user/assistant/tool markers; here they follow the tiny BPE vocabulary).
DS_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
               "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
               "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
               "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]
DS_PLAIN = ["<think>", "</think>"]

# Kimi K2's special tokens at their offsets past the BPE ranks (tokenizer_config.json of moonshotai/Kimi-K2-Thinking
# puts them at 163584 + offset); other offsets are <|reserved_token_N|>.
K2_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
               6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
               11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
               14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
               22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}


def is_moe(c, i):
    """DeepseekV3DecoderLayer.__init__: MoE from layer first_k_dense_replace on."""
    return i >= c["first_dense"]


def qk_head(c):
    return c["nope"] + c["rope"]


# ----------------------------------------------------------------------------------------------------------
# Config and tokenizers


def published_config(c, bos, eos):
    """config.json with the keys of the published checkpoints (DeepSeek-V3 / Kimi-K2-Thinking)."""
    y = c["yarn"]
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": bos, "eos_token_id": eos, "first_k_dense_replace": c["first_dense"], "hidden_act": "silu",
        "hidden_size": c["hidden"], "initializer_range": 0.02, "intermediate_size": c["inter"],
        "kv_lora_rank": c["kv_lora"], "max_position_embeddings": c["max_pos"], "model_type": c["kind"],
        "moe_intermediate_size": c["moe_inter"], "moe_layer_freq": 1, "n_group": c["n_group"],
        "n_routed_experts": c["experts"], "n_shared_experts": c["shared"], "norm_topk_prob": c["norm_topk"],
        "num_attention_heads": c["heads"], "num_experts_per_tok": c["top_k"], "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["heads"], "num_nextn_predict_layers": 0, "q_lora_rank": c["q_lora"],
        "qk_nope_head_dim": c["nope"], "qk_rope_head_dim": c["rope"], "rms_norm_eps": c["eps"],
        "rope_scaling": {"beta_fast": y["beta_fast"], "beta_slow": y["beta_slow"], "factor": y["factor"],
                         "mscale": y["mscale"], "mscale_all_dim": y["mscale_all_dim"],
                         "original_max_position_embeddings": y["original_max_position_embeddings"],
                         "type": "yarn"},
        "rope_theta": c["theta"], "routed_scaling_factor": c["rsf"], "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": c["topk_group"], "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": True,
        "v_head_dim": c["v"], "vocab_size": c["vocab"],
    }
    if c["kind"] == "deepseek_v3":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [128, 128]}
    else:
        cfg["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                           "AutoModel": "modeling_deepseek.DeepseekV3Model",
                           "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}
        cfg["quantization_config"] = {
            "config_groups": {"group_0": {
                "input_activations": None, "output_activations": None, "targets": ["Linear"],
                "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                            "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                            "symmetric": True, "type": "int"}}},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    return cfg


def deepseek_tokenizer(c, out_dir):
    """Byte-level BPE tokenizer.json with DeepSeek's specials; returns (encode, bos, eos)."""
    tok = q3.build_tokenizer(c["bpe_vocab"], specials=DS_SPECIALS, plain_added=DS_PLAIN)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    decoder = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": True, "rstrip": False,
                                        "single_word": False, "special": s in DS_SPECIALS}
               for s in DS_SPECIALS + DS_PLAIN}
    cfg = {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": decoder,
           "bos_token": DS_SPECIALS[0], "clean_up_tokenization_spaces": False, "eos_token": DS_SPECIALS[1],
           "legacy": True, "model_max_length": 131072, "pad_token": DS_SPECIALS[1], "sp_model_kwargs": {},
           "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    assert tok.get_vocab_size(with_added_tokens=True) <= c["vocab"]
    return (lambda s: tok.encode(s).ids), tok.token_to_id(DS_SPECIALS[0]), tok.token_to_id(DS_SPECIALS[1])


def kimi_tokenizer(c, out_dir):
    """tiktoken.model + tokenizer_config.json with Kimi K2's specials; returns (encode, bos, eos)."""
    import tiktoken

    import gen_k3_goldens as k3

    merges = k3.train_bpe(k3.TRAIN_TEXT, c["merges"])
    ranks = [bytes([b]) for b in range(256)] + merges
    n_base = len(ranks)
    c["vocab"] = n_base + 256
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        for r, t in enumerate(ranks):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    name = lambda off: K2_SPECIALS.get(off, f"<|reserved_token_{n_base + off}|>")  # noqa: E731
    added = {str(n_base + off): {"content": name(off), "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False, "special": True} for off in range(256)}
    cfg = {"added_tokens_decoder": added,
           "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
                                         "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"],
           "bos_token": "[BOS]", "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
           "extra_special_tokens": {}, "model_max_length": 1000000000000000019884624838656,
           "pad_token": "[PAD]", "tokenizer_class": "TikTokenTokenizer", "unk_token": "[UNK]",
           "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    enc = tiktoken.Encoding(name="k2-tiny", pat_str=k3.K3_PAT, mergeable_ranks={t: r for r, t in enumerate(ranks)},
                            special_tokens={name(o): n_base + o for o in range(256)})
    return enc.encode_ordinary, n_base + 0, n_base + 2


# ----------------------------------------------------------------------------------------------------------
# Weights: draw in f32, quantize into the published formats, dequantize for the reference


def fp8_block(w):
    """FP8 e4m3 with one F32 scale per 128x128 block (DeepSeek-V3 `act_quant`/`weight_dequant` convention: the
    stored `weight_scale_inv` multiplies). Returns (q float8, scale_inv f32, dequantized f32)."""
    import torch

    m, n = w.shape
    bm, bn = math.ceil(m / 128), math.ceil(n / 128)
    s = torch.zeros(bm, bn)
    for i in range(bm):
        for j in range(bn):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s[i, j] = blk.abs().max().clamp(min=1e-12) / 448.0
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:m, :n]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, s.float(), q.float() * full


def int4_pack(w):
    """compressed-tensors pack-quantized INT4, symmetric, group 32: (weight_packed I32 [m, n/8], weight_scale bf16
    [m, n/32], weight_shape I32 [2], dequantized f32)."""
    import torch

    m, n = w.shape
    assert n % 32 == 0
    g = w.reshape(m, n // 32, 32)
    scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).to(torch.int64)
    deq = (q.float() * scale.float()[..., None]).reshape(m, n)
    nib = (q.reshape(m, n) + 8).reshape(m, n // 8, 8)
    shifts = torch.arange(8, dtype=torch.int64) * 4
    words = (nib << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words, scale, torch.tensor([m, n], dtype=torch.int32), deq


def draw_weights(c, seed):
    """Seeded tensors under their published names (stored) and the dequantized f32 values (for the reference)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d, h = c["hidden"], c["heads"]
    stored, deq = {}, {}
    fp8 = c["kind"] == "deepseek_v3"

    def bf16(name, t):
        t = t.to(torch.bfloat16)
        stored[name], deq[name] = t, t.float()

    def norm(name, n):
        bf16(name, 1.0 + 0.25 * torch.randn(n, generator=g))

    def raw(rows, cols, gain):
        return torch.randn(rows, cols, generator=g) * (gain / math.sqrt(cols))

    def linear(name, rows, cols, gain, int4=False):
        w = raw(rows, cols, gain)
        if fp8:
            q, s, v = fp8_block(w)
            stored[name + ".weight"], stored[name + ".weight_scale_inv"], deq[name + ".weight"] = q, s, v
        elif int4:
            p, s, shape, v = int4_pack(w)
            stored[name + ".weight_packed"], stored[name + ".weight_scale"] = p, s
            stored[name + ".weight_shape"], deq[name + ".weight"] = shape, v
        else:
            bf16(name + ".weight", w)

    def mlp(p, inter, int4=False):
        linear(p + "gate_proj", inter, d, c["gain"], int4)
        linear(p + "up_proj", inter, d, c["gain"], int4)
        linear(p + "down_proj", d, inter, c["gain"], int4)

    bf16("model.embed_tokens.weight", torch.randn(c["vocab"], d, generator=g) * c["embed_std"])
    qd = qk_head(c)
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", d)
        a = p + "self_attn."
        if c["q_lora"] is None:
            linear(a + "q_proj", h * qd, d, c["gain"])
        else:
            linear(a + "q_a_proj", c["q_lora"], d, c["gain"])
            norm(a + "q_a_layernorm.weight", c["q_lora"])
            linear(a + "q_b_proj", h * qd, c["q_lora"], c["gain"])
        linear(a + "kv_a_proj_with_mqa", c["kv_lora"] + c["rope"], d, c["gain"])
        norm(a + "kv_a_layernorm.weight", c["kv_lora"])
        linear(a + "kv_b_proj", h * (c["nope"] + c["v"]), c["kv_lora"], c["gain"])
        linear(a + "o_proj", d, h * c["v"], c["gain"])
        norm(p + "post_attention_layernorm.weight", d)
        if is_moe(c, i):
            bf16(p + "mlp.gate.weight", raw(c["experts"], d, c["router_gain"]))
            mean, std = c["bias"][min(i - c["first_dense"], len(c["bias"]) - 1)]
            b = (mean + std * torch.randn(c["experts"], generator=g)).float()
            stored[p + "mlp.gate.e_score_correction_bias"], deq[p + "mlp.gate.e_score_correction_bias"] = b, b
            for e in range(c["experts"]):
                mlp(p + f"mlp.experts.{e}.", c["moe_inter"], int4=not fp8)
            mlp(p + "mlp.shared_experts.", c["moe_inter"] * c["shared"])
        else:
            mlp(p + "mlp.", c["inter"])
    norm("model.norm.weight", d)
    bf16("lm_head.weight", raw(c["vocab"], d, 1.0))
    return stored, deq


def hf_state_dict(deq, c):
    """The dequantized tensors under transformers 5.17's parameter names (experts merged)."""
    import torch

    sd = {}
    for k, v in deq.items():
        if ".mlp.experts." not in k:
            sd[k] = v
    for i in range(c["layers"]):
        if not is_moe(c, i):
            continue
        p = f"model.layers.{i}.mlp.experts."
        sd[p + "gate_up_proj"] = torch.stack([torch.cat([deq[p + f"{e}.gate_proj.weight"],
                                                         deq[p + f"{e}.up_proj.weight"]])
                                              for e in range(c["experts"])])
        sd[p + "down_proj"] = torch.stack([deq[p + f"{e}.down_proj.weight"] for e in range(c["experts"])])
    return sd


# ----------------------------------------------------------------------------------------------------------
# Router: DeepSeek's reference, with recording and the corner check


def deepseek_route(logits, bias, c, fill=float("-inf")):
    """DeepSeek-V3 `inference/model.py` Gate.forward (sigmoid, noaux_tc) on f32 logits [T, E]; `fill` is the value
    excluded groups get (-inf as DeepSeek; 0.0 as transformers 4.x did). Returns (ids [T,k] sorted by biased
    score, weights [T,k], biased scores, min gap)."""
    import torch

    scores = logits.sigmoid()
    original = scores
    biased = scores + bias
    t, e = biased.shape
    ng, kg, k = c["n_group"], c["topk_group"], c["top_k"]
    gs = biased.view(t, ng, e // ng).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = gs.topk(kg, dim=-1)[1]
    mask = torch.ones(t, ng, dtype=torch.bool).scatter_(1, gidx, False)
    choice = biased.view(t, ng, e // ng).masked_fill(mask.unsqueeze(-1), fill).flatten(1)
    ids = torch.topk(choice, k, dim=-1)[1]
    w = original.gather(1, ids)
    if c["norm_topk"]:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    w = w * c["rsf"]
    # Gaps that decide the routing: k-th vs (k+1)-th biased score among the kept groups, and the topk_group-th vs
    # next group score.
    kept = biased.view(t, ng, e // ng).masked_fill(mask.unsqueeze(-1), float("-inf")).flatten(1)
    srt = kept.double().sort(dim=-1, descending=True)[0]
    gap = float((srt[:, k - 1] - srt[:, k]).min()) if k < kept.shape[1] else math.inf
    if kg < ng:
        gsr = gs.double().sort(dim=-1, descending=True)[0]
        gap = min(gap, float((gsr[:, kg - 1] - gsr[:, kg]).min()))
    return ids, w, biased, gap


class Router:
    """Replaces every DeepseekV3TopkRouter.forward with DeepSeek's reference; records routing while `record`."""

    def __init__(self, ref, c):
        self.c, self.min_gap, self.record, self.calls, self.corner_rows, self.rows = c, math.inf, False, {}, 0, 0
        self.stock = {}
        for i, layer in enumerate(ref.model.layers):
            if is_moe(c, i):
                gate = layer.mlp.gate
                self.stock[i] = gate.forward
                gate.forward = self.patched(i, gate)

    def patched(self, i, gate):
        import torch
        import torch.nn.functional as F

        def forward(hidden_states):
            x = hidden_states.view(-1, gate.hidden_dim)
            logits = F.linear(x.type(torch.float32), gate.weight.type(torch.float32))
            ids, w, _, gap = deepseek_route(logits, gate.e_score_correction_bias, self.c)
            # transformers 5.17's own router masks with -inf too: it must choose the same set.
            _, _, stock_ids = self.stock[i](hidden_states)
            assert torch.equal(stock_ids.sort(-1)[0], ids.sort(-1)[0]), "stock router disagrees"
            zero_ids = deepseek_route(logits, gate.e_score_correction_bias, self.c, fill=0.0)[0]
            differ = (zero_ids.sort(-1)[0] != ids.sort(-1)[0]).any(-1)
            self.corner_rows += int(differ.sum())
            self.rows += differ.numel()
            self.min_gap = min(self.min_gap, gap)
            if self.record:
                self.calls[i] = (logits.detach().numpy().copy(), ids.numpy().astype(np.int32),
                                 w.detach().numpy().copy())
            return logits, w, ids
        return forward


# ----------------------------------------------------------------------------------------------------------
# Independent float64 forward


def yarn_tables(c):
    y, dim, base = c["yarn"], c["rope"], c["theta"]

    def corr(rot):
        return dim * math.log(y["original_max_position_embeddings"] / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(corr(y["beta_fast"])), math.ceil(corr(y["beta_slow"]))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1 / (y["factor"] * pos)) * (1 - extra) + (1 / pos) * extra

    def ms(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attn_factor = ms(y["factor"], y["mscale"]) / ms(y["factor"], y["mscale_all_dim"])
    softmax_scale = qk_head(c) ** -0.5 * ms(y["factor"], y["mscale_all_dim"]) ** 2
    return inv, attn_factor, softmax_scale


def numpy_f64_logits(deq, c, ids):
    p = {k: v.double().numpy() for k, v in deq.items()}
    eps, h, nope, rope, vd, kl = c["eps"], c["heads"], c["nope"], c["rope"], c["v"], c["kv_lora"]
    inv, af, scale = yarn_tables(c)
    t = len(ids)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang) * af, np.sin(ang) * af

    def rms(x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    def rot(x):  # interleaved pairs (x0, x1), (x2, x3) ... -> de-interleaved halves, as rope_interleave
        a, b = x[..., 0::2], x[..., 1::2]
        cs, sn = (cos[:, None, :], sin[:, None, :]) if x.ndim == 3 else (cos, sin)
        return np.concatenate([a * cs - b * sn, b * cs + a * sn], -1)

    def silu(x):
        return x / (1 + np.exp(-x))

    def mlp(x, pre):
        return (silu(x @ p[pre + "gate_proj.weight"].T) * (x @ p[pre + "up_proj.weight"].T)) @ p[pre + "down_proj.weight"].T

    hs = p["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(c["layers"]):
        L = f"model.layers.{i}."
        A = L + "self_attn."
        x = rms(hs, p[L + "input_layernorm.weight"])
        if c["q_lora"] is None:
            q = x @ p[A + "q_proj.weight"].T
        else:
            q = rms(x @ p[A + "q_a_proj.weight"].T, p[A + "q_a_layernorm.weight"]) @ p[A + "q_b_proj.weight"].T
        q = q.reshape(t, h, nope + rope)
        q_nope, q_pe = q[..., :nope], rot(q[..., nope:])
        ckv = x @ p[A + "kv_a_proj_with_mqa.weight"].T
        lat, k_pe = rms(ckv[:, :kl], p[A + "kv_a_layernorm.weight"]), rot(ckv[:, kl:])
        kv = (lat @ p[A + "kv_b_proj.weight"].T).reshape(t, h, nope + vd)
        out = np.zeros((t, h, vd))
        for hh in range(h):
            s = (q_nope[:, hh] @ kv[:, hh, :nope].T + q_pe[:, hh] @ k_pe.T) * scale + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ kv[:, hh, nope:]
        hs = hs + out.reshape(t, h * vd) @ p[A + "o_proj.weight"].T
        x = rms(hs, p[L + "post_attention_layernorm.weight"])
        if is_moe(c, i):
            import torch
            logits = x @ p[L + "mlp.gate.weight"].T
            top, wts, _, _ = deepseek_route(torch.from_numpy(logits), torch.from_numpy(
                p[L + "mlp.gate.e_score_correction_bias"]), c)
            y = mlp(x, L + "mlp.shared_experts.")
            for r in range(t):
                for e, wt in zip(top[r].tolist(), wts[r].tolist()):
                    y[r] += wt * mlp(x[r:r + 1], L + f"mlp.experts.{e}.")[0]
            hs = hs + y
        else:
            hs = hs + mlp(x, L + "mlp.")
    return rms(hs, p["model.norm.weight"]) @ p["lm_head.weight"].T


# ----------------------------------------------------------------------------------------------------------
# Reference run


def reference_model(cfg_json):
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    keep = {k: v for k, v in cfg_json.items() if k not in ("quantization_config", "auto_map", "model_type",
                                                            "architectures", "transformers_version",
                                                            "torch_dtype")}
    cfg = DeepseekV3Config(**keep)
    cfg._attn_implementation = "eager"
    ref = DeepseekV3ForCausalLM(cfg).to(torch.float32).eval()
    return ref


def attempt(c, seed, encode, bos, eos, out_dir):
    stored, deq = draw_weights(c, seed)
    gc.clear_model_files(out_dir)
    gc.write_sharded(stored, out_dir)
    cfg_json = published_config(c, bos, eos)
    gc.write_config(out_dir, cfg_json)

    ref = reference_model(cfg_json)
    missing, unexpected = ref.load_state_dict(hf_state_dict(deq, c), strict=False)
    assert not unexpected, f"unexpected tensors {unexpected}"
    assert not missing, f"parameters not loaded {missing}"
    router = Router(ref, c)
    prompts = gc.prompts_of(encode)
    stages = [gc.capture_stages(ref, p, router) for p in prompts]
    corner_prompt_rows = router.corner_rows
    decode = gc.decode_run(ref, encode(gc.DECODE_TEXT)[:gc.DECODE_PROMPT_LEN])
    greedy = gc.greedy_runs(ref, prompts, generate=None)
    f64 = [gc.rel_l2(st["logits"], numpy_f64_logits(deq, c, p)) for p, st in zip(prompts, stages)]

    reasons = gc.draw_reasons(decode, greedy, router_gap=router.min_gap, min_router_gap=MIN_ROUTER_GAP)
    if c["kind"] == "deepseek_v3" and corner_prompt_rows == 0:
        reasons.append("no prompt row where a 0.0 group fill would route differently")
    res = {"seed": seed, "rope": gc.rope_tables(ref), "prompts": prompts, "stages": stages, "decode": decode,
           "greedy": greedy, "f64": f64, "router_min_gap": router.min_gap, "corner_rows": corner_prompt_rows,
           "router_rows": router.rows, "corner_rows_all": router.corner_rows,
           "softmax_scale": float(ref.model.layers[0].self_attn.scaling)}
    return not reasons, reasons, res


def generate(name, c, root):
    import gen_family_chat_goldens as chat

    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith(("tokenizer", "tiktoken", "chat_template")):
            os.remove(os.path.join(out_dir, f))
    if c["kind"] == "deepseek_v3":
        encode, bos, eos = deepseek_tokenizer(c, out_dir)
    else:
        encode, bos, eos = kimi_tokenizer(c, out_dir)
    chat.install_chat_template(out_dir, c["kind"])
    gc.set_threads()
    r = gc.search(name, c["seed"], MAX_ATTEMPTS, lambda seed: attempt(c, seed, encode, bos, eos, out_dir))

    moe_layers = [i for i in range(c["layers"]) if is_moe(c, i)]
    per_prompt, routing = gc.stage_lists(c["layers"], moe_layers)
    gc.save_goldens(out_dir, gc.golden_tensors(r["prompts"], r["stages"], r["decode"], r["rope"],
                                               per_prompt + routing))
    gj = {
        "config_name": name, "seed": r["seed"], "generator": "tools/gen_deepseek_v3_goldens.py",
        "reference": "transformers DeepseekV3ForCausalLM on CPU in float32 (eager attention), loaded with the "
                     "dequantized values of the stored FP8 / INT4 / bf16 tensors; router replaced by DeepSeek's "
                     "reference Gate (-inf group mask, top-k sorted by biased score)",
        "versions": gc.versions(), "config": gc.read_config(out_dir),
        "moe_layers": moe_layers, "prompts": r["prompts"],
        "stage_template": gc.stage_template(per_prompt + routing),
        "stage_notes": {
            "router_logits": "router logits [T,E] before the sigmoid (MoE layers)",
            "topk_ids": "chosen expert ids [T,k], I32, sorted by biased score descending",
            "topk_weights": "their weights [T,k]: sigmoid scores, normalised, times routed_scaling_factor",
            "mlp_out": "MoE block output (routed + shared experts) or the dense MLP",
        },
        "decode": gc.decode_json(r["decode"], rows_note=False),
        "greedy": r["greedy"],
        "checks": {"numpy_f64_vs_hf_logits_rel_l2": r["f64"], "router_min_gap": r["router_min_gap"],
                   "softmax_scale": r["softmax_scale"],
                   "rows_where_a_zero_group_fill_routes_differently": {
                       "prompt_rows": r["corner_rows"], "all_router_rows": r["router_rows"],
                       "all_rows_differing": r["corner_rows_all"]}},
    }
    gc.write_json(os.path.join(out_dir, "golden.json"), gj)
    print(f"[{name}] seed {r['seed']}; f64 relL2 {max(r['f64']):.3e}; router gap {r['router_min_gap']:.3e}; "
          f"corner rows {r['corner_rows']} (prompts), {r['corner_rows_all']}/{r['router_rows']} (all)")
    gc.check_f64(name, r["f64"])


def main():
    args, names = gc.cli("Generate tiny DeepSeek-V3 / Kimi K2 checkpoints and goldens.",
                         "tests/fixtures/deepseek_v3", CONFIGS, gc.versions())
    for name in names:
        generate(name, dict(CONFIGS[name]), args.out)

if __name__ == "__main__":
    main()
