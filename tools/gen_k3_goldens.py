#!/usr/bin/env python3
"""Golden-vector generator for sluice's Kimi K3 implementation.

For each tiny configuration (`tiny-a`, `tiny-b`) this script

1. writes a random checkpoint directory in the *published* Kimi K3 layout (K3.md section 3): a multimodal
   `config.json` (`KimiK3ForConditionalGeneration`, `text_config` of model_type `kimi_linear`,
   compressed-tensors `mxfp4-pack-quantized` quantization_config), `generation_config.json`, three shards
   `model-0000{1,2,3}-of-000003.safetensors` plus `model.safetensors.index.json`, tensor names prefixed
   `language_model.`, BF16 everywhere except the F32 KDA conv/A_log/dt_bias/o_norm and router bias, routed
   experts as U8 MXFP4 `weight_packed`/`weight_scale` (the six tensors of one expert back to back, experts
   in a shuffled order inside the shard), and a tiny tiktoken tokenizer (`tiktoken.model` +
   `tokenizer_config.json` with K3's 256 reserved special tokens);
2. loads that directory with mlx-lm 0.32.2's own loader (`mlx_lm.utils.load_model`: `Model.sanitize` of the
   published names, native `mxfp4` experts, `load_weights(strict=True)`) on CPU, casts every floating
   parameter to float32 (the packed MXFP4 bytes and E8M0 scales stay as they are), and checks mlx's MXFP4
   dequantisation bit-exactly against a numpy decode of K3.md section 3.3;
3. runs a stage-by-stage driver that mirrors `KimiK3TextModel.__call__` but calls mlx-lm's own submodules,
   asserts its logits equal `model(ids)` bit for bit, and writes the captured stages, a cached decode
   scenario and greedy generations to `golden.safetensors` + `golden.json`;
4. cross-checks everything against the independent float64 numpy reference in tools/k3_numpy_ref.py and
   records the relative L2 errors.

Everything is deterministic from the seeds in CONFIGS. If a draw produces a near-tie (router k-th vs
(k+1)-th choice score within 1e-4, greedy top-2 logit margin within 1e-3) or a greedy token in the reserved
special range, the script moves to the next attempt (seed + attempt) so that f32-vs-f32 ordering noise can
never flip a routing decision or a greedy token in a consumer's test.

Usage:
    pip install -r tools/requirements-golden.txt
    python3 tools/gen_k3_goldens.py --out tests/fixtures/kimi_k3
"""

import argparse
import base64
import collections
import importlib.metadata
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_numpy_ref  # noqa: E402  (independent float64 reference, same directory)

# ----------------------------------------------------------------------------------------------------------
# Configurations

NUM_MERGES = 200
N_BASE = 256 + NUM_MERGES          # BPE ranks 0..N_BASE-1; reserved specials N_BASE..N_BASE+255
VOCAB = N_BASE + 256               # 712

CONFIGS = {
    # hidden 64, 9 layers, block 3 -> AttnRes boundaries at 0,3,6 (3 anchors at the output); MLA at 1-based
    # 4 (a block start), 8 and 9 (the last layer, like layer 93 of the release).
    "tiny-a": dict(
        seed=1001, hidden=64, layers=9, block=3, kda_heads=4, kda_head_dim=16, mla_layers=[4, 8, 9],
        mla_heads=4, q_lora=32, kv_lora=16, nope=16, rope=8, v=16, experts=16, topk=4, moe_inter=32,
        latent=32, inter=96, rsf=1.0,
    ),
    # Different shapes on every axis: hidden 48 (not a multiple of 32; KDA projection 96 = 2x hidden and MLA
    # heads*v 96 != hidden, like the release's 12288 vs 7168), 9 layers with block 4 -> boundaries 0,4,8, so
    # the last layer is a one-layer block of its own; MLA at 1-based 2, 5 (a block start) and 9 (last, also a
    # block start); 20 experts top-6; latent 32 != moe_intermediate 64 (w1/w3 [64,32] vs w2 [32,64]);
    # routed_scaling_factor 2.5.
    "tiny-b": dict(
        seed=2002, hidden=48, layers=9, block=4, kda_heads=6, kda_head_dim=16, mla_layers=[2, 5, 9],
        mla_heads=6, q_lora=40, kv_lora=24, nope=16, rope=8, v=16, experts=20, topk=6, moe_inter=64,
        latent=32, inter=128, rsf=2.5,
    ),
}

PROMPT_LENS = [1, 5, 12]
DECODE_PROMPT_LEN = 7
DECODE_STEPS = 6
GREEDY_NEW = 8
ROUTER_MARGIN_MIN = 1e-4
LOGIT_MARGIN_MIN = 1e-3
MAX_ATTEMPTS = 200

SPECIAL_NAMES = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
    19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]",
}

# K3 pre-tokenizer (tokenization_kimi.py, K3.md 4.1), used for the optional tokenizer goldens.
K3_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# ASCII approximation of K3_PAT for the BPE trainer (stdlib `re` has no \p{..} classes).
TRAIN_PAT = re.compile(
    r"""[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[0-9]{1,3}| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

TRAIN_TEXT = """\
A sluice is a water channel controlled at its head by a movable gate. The gate holds the river back when the
fields are full and lets it through when the mill needs to turn. The keeper of the sluice walks the bank
every morning; he reads the level on the painted post, he listens to the wheel, and he decides how far the
gate should open. In the spring the water is high and fast, and the keeper opens the gate only a little. In
the summer the water is low and warm, and he opens it wide so that the wheel keeps turning.

The old mill stood by the river for three hundred years. Its wheel was made of oak, and its gears were made
of apple wood because apple wood is hard and does not split. The miller ground wheat for bread and barley for
the animals. When the harvest was good, the carts waited in a long line on the road, and the miller worked
through the night by the light of a lantern. When the harvest was poor, the mill was quiet and the miller
mended his nets and watched the water.

Numbers matter to a keeper: 12 inches of rain in April, 3 feet on the post in May, 45 turns of the wheel in a
minute when the gate is half open. He writes them in a little book with a pencil, one line for every day, and
at the end of the year he adds them up. The book is older than the keeper; the first pages were written by
his grandfather, and the ink has turned brown. "The river remembers," his grandfather wrote, "and so must we."

Today the gates are opened by motors, and the levels are read by sensors that send their numbers to a computer
in the town. The computer does not walk the bank, and it does not listen to the wheel. But it never sleeps,
and it never forgets to write the numbers down. The keeper still comes in the morning. He says the machine is
right most of the time, and that the river is right all of the time.

When the flood came in the autumn, the water rose over the post and over the bank and into the lower fields.
The keeper opened every gate, the motors hummed, and the river ran through the channels as it was meant to.
By the evening the water had fallen again, the fields were wet but safe, and the keeper wrote a long line in
the little book: the level, the time, the weather, and a single word at the end of it: enough.
"""


def text_config_for(c):
    """The `text_config` block, with every key of K3.md 1.2 (values scaled down)."""
    L = c["layers"]
    mla = sorted(c["mla_layers"])
    kda = [i for i in range(1, L + 1) if i not in mla]
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "transformers_version": "4.56.2",
        "dtype": "bfloat16",
        "hidden_size": c["hidden"],
        "num_hidden_layers": L,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": mla,
            "num_heads": c["kda_heads"],
            "head_dim": c["kda_head_dim"],
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
            "gate_lower_bound": -5.0,
        },
        "num_attention_heads": c["mla_heads"],
        "num_key_value_heads": c["mla_heads"],
        "q_lora_rank": c["q_lora"],
        "kv_lora_rank": c["kv_lora"],
        "qk_nope_head_dim": c["nope"],
        "qk_rope_head_dim": c["rope"],
        "v_head_dim": c["v"],
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "intermediate_size": c["inter"],
        "num_experts": c["experts"],
        "num_experts_per_token": c["topk"],
        "num_shared_experts": 2,
        "moe_intermediate_size": c["moe_inter"],
        "routed_expert_hidden_size": c["latent"],
        "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "topk_method": "noaux_tc",
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "moe_renormalize": True,
        "routed_scaling_factor": c["rsf"],
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "attn_res_block_size": c["block"],
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1048576,
        "vocab_size": VOCAB,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": N_BASE,
        "eos_token_id": N_BASE + 2,
        "pad_token_id": N_BASE + 255,
        "quantization_config": {
            "config_groups": {
                "group_0": {
                    "format": "mxfp4-pack-quantized",
                    "input_activations": None,
                    "output_activations": None,
                    "targets": ["Linear"],
                    "weights": {
                        "actorder": None,
                        "block_structure": None,
                        "dynamic": False,
                        "group_size": 32,
                        "num_bits": 4,
                        "observer": "minmax",
                        "observer_kwargs": {},
                        "scale_dtype": "torch.uint8",
                        "strategy": "group",
                        "symmetric": True,
                        "type": "float",
                        "zp_dtype": None,
                    },
                }
            },
            "format": "mxfp4-pack-quantized",
            "global_compression_ratio": None,
            "ignore": [
                "re:.*self_attn.*",
                "re:.*shared_experts.*",
                r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
                "re:.*lm_head.*",
                "re:.*vision_tower.*",
                "re:.*mm_projector.*",
            ],
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.20.0",
        },
    }


def top_config_for(c):
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "bos_token_id": N_BASE,
        "eos_token_id": N_BASE + 2,
        "pad_token_id": N_BASE + 255,
        "media_placeholder_token_id": N_BASE + 21,
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
        "text_config": text_config_for(c),
    }


# ----------------------------------------------------------------------------------------------------------
# bf16 + safetensors writing

def bf16_bits(x):
    """Round float32 to bf16 (nearest-even); returns the uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (((u >> 16) & 1) + 0x7FFF)
    return (u >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Tensor:
    """One checkpoint tensor: name, safetensors dtype string, shape and little-endian bytes."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, tuple(int(s) for s in shape), data


def write_safetensors(path, tensors, metadata=None):
    """Writes tensors in the given order (safetensors' own writers reorder; the release keeps the six tensors
    of one expert back to back, which this preserves)."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + len(t.data)]}
        off += len(t.data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for t in tensors:
            f.write(t.data)


# ----------------------------------------------------------------------------------------------------------
# Random weights in the published layout

class WeightGen:
    def __init__(self, rng):
        self.rng = rng

    def bf16(self, name, shape, std, mean=0.0):
        x = (mean + std * self.rng.standard_normal(shape)).astype(np.float32)
        return Tensor(name, "BF16", shape, bf16_bits(x).tobytes())

    def f32(self, name, arr):
        return Tensor(name, "F32", arr.shape, np.ascontiguousarray(arr, dtype="<f4").tobytes())

    def u8(self, name, arr):
        return Tensor(name, "U8", arr.shape, np.ascontiguousarray(arr, dtype=np.uint8).tobytes())

    def linear(self, name, out_f, in_f, gain=1.0):
        return self.bf16(name, (out_f, in_f), gain / np.sqrt(in_f))

    def norm(self, name, n):
        return self.bf16(name, (n,), 0.1, mean=1.0)

    def mxfp4(self, prefix, rows, cols):
        """Uniform random packed bytes (every nibble incl. 8 = -0 in both positions) and E8M0 scales around
        the exponent that gives one row's dot with a unit-RMS input an RMS of ~1 (the E2M1 RMS over uniform
        codes is ~2.93): 121..124 for 32 input columns, 120..123 for 64; expert outputs are then O(0.5)."""
        assert cols % 32 == 0
        packed = self.rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
        centre = 127 + int(round(np.log2(1.0 / (2.93 * np.sqrt(cols)))))
        scale = self.rng.integers(centre - 2, centre + 1, size=(rows, cols // 32), endpoint=True).astype(np.uint8)
        return [self.u8(f"{prefix}.weight_packed", packed), self.u8(f"{prefix}.weight_scale", scale)]


def make_weights(c, rng):
    """Returns (layer_groups, global_group): lists of Tensor with `language_model.` names."""
    g = WeightGen(rng)
    d = c["hidden"]
    H, D = c["kda_heads"], c["kda_head_dim"]
    assert D >= H, "A_log is stored padded to head_dim"
    P = H * D
    mla_set = {i - 1 for i in c["mla_layers"]}
    res_gain = 0.7  # AttnRes depth logits ~ N(0, 0.7^2): soft, non-trivial mixing
    layers = []
    for i in range(c["layers"]):
        p = f"language_model.model.layers.{i}"
        t = [
            g.norm(f"{p}.input_layernorm.weight", d),
            g.norm(f"{p}.post_attention_layernorm.weight", d),
            g.norm(f"{p}.self_attention_res_norm.weight", d),
            g.bf16(f"{p}.self_attention_res_proj.weight", (1, d), res_gain / np.sqrt(d)),
            g.norm(f"{p}.mlp_res_norm.weight", d),
            g.bf16(f"{p}.mlp_res_proj.weight", (1, d), res_gain / np.sqrt(d)),
        ]
        a = f"{p}.self_attn"
        if i not in mla_set:  # KDA
            t += [
                g.linear(f"{a}.q_proj.weight", P, d),
                g.linear(f"{a}.k_proj.weight", P, d),
                g.linear(f"{a}.v_proj.weight", P, d),
            ]
            for n in ("q", "k", "v"):
                t.append(g.f32(f"{a}.{n}_conv1d.weight", (0.5 * rng.standard_normal((P, 1, 4))).astype(np.float32)))
            a_log = np.zeros(D, dtype=np.float32)
            a_log[:H] = np.log(rng.uniform(0.5, 8.0, size=H))  # per head; entries H..D-1 stay exactly zero
            t += [
                g.linear(f"{a}.f_a_proj.weight", D, d),
                g.linear(f"{a}.f_b_proj.weight", P, D),
                g.linear(f"{a}.b_proj.weight", H, d),
                g.f32(f"{a}.A_log", a_log),
                g.f32(f"{a}.dt_bias", (0.5 * rng.standard_normal(P)).astype(np.float32)),
                g.f32(f"{a}.o_norm.weight", (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)),
                g.linear(f"{a}.g_proj.weight", P, d),
                g.linear(f"{a}.o_proj.weight", d, P),
            ]
        else:  # gated NoPE MLA
            Hm = c["mla_heads"]
            t += [
                g.linear(f"{a}.q_a_proj.weight", c["q_lora"], d),
                g.norm(f"{a}.q_a_layernorm.weight", c["q_lora"]),
                g.linear(f"{a}.q_b_proj.weight", Hm * (c["nope"] + c["rope"]), c["q_lora"]),
                g.linear(f"{a}.kv_a_proj_with_mqa.weight", c["kv_lora"] + c["rope"], d),
                g.norm(f"{a}.kv_a_layernorm.weight", c["kv_lora"]),
                g.linear(f"{a}.kv_b_proj.weight", Hm * (c["nope"] + c["v"]), c["kv_lora"]),
                g.linear(f"{a}.g_proj.weight", Hm * c["v"], d),
                g.linear(f"{a}.o_proj.weight", d, Hm * c["v"]),
            ]
        if i == 0:  # first_k_dense_replace = 1
            t += [
                g.linear(f"{p}.mlp.gate_proj.weight", c["inter"], d),
                g.linear(f"{p}.mlp.up_proj.weight", c["inter"], d),
                g.linear(f"{p}.mlp.down_proj.weight", d, c["inter"]),
            ]
        else:
            m = f"{p}.block_sparse_moe"
            E, mi, lat = c["experts"], c["moe_inter"], c["latent"]
            sh = 2 * mi
            t += [
                g.linear(f"{m}.gate.weight", E, d, gain=2.0),   # router logits ~N(0, 4): spread sigmoid scores
                g.f32(f"{m}.gate.e_score_correction_bias", rng.uniform(-0.25, 0.25, size=E).astype(np.float32)),
                g.linear(f"{m}.routed_expert_down_proj.weight", lat, d),
                g.norm(f"{m}.routed_expert_norm.weight", lat),
                g.linear(f"{m}.routed_expert_up_proj.weight", d, lat),
                g.linear(f"{m}.shared_experts.gate_proj.weight", sh, d),
                g.linear(f"{m}.shared_experts.up_proj.weight", sh, d),
                g.linear(f"{m}.shared_experts.down_proj.weight", d, sh),
            ]
            experts = []
            for e in range(E):
                ex = []
                ex += g.mxfp4(f"{m}.experts.{e}.w1", mi, lat)   # gate [moe_inter, latent]
                ex += g.mxfp4(f"{m}.experts.{e}.w2", lat, mi)   # down [latent, moe_inter]
                ex += g.mxfp4(f"{m}.experts.{e}.w3", mi, lat)   # up   [moe_inter, latent]
                experts.append(ex)
            for e in rng.permutation(E):  # the release does not store experts in id order
                t += experts[e]
        layers.append(t)
    gl = [
        g.bf16("language_model.model.embed_tokens.weight", (VOCAB, d), 1.0),
        g.norm("language_model.model.norm.weight", d),
        g.norm("language_model.model.output_attn_res_norm.weight", d),
        g.bf16("language_model.model.output_attn_res_proj.weight", (1, d), res_gain / np.sqrt(d)),
    ]
    # lm_head: reserved-special rows are ~untrained (small), as in a real checkpoint, so greedy text stays
    # in the BPE range.
    lm = (rng.standard_normal((VOCAB, d)) * 1.5 / np.sqrt(d)).astype(np.float32)
    lm[N_BASE:] *= 0.05
    gl.append(Tensor("language_model.lm_head.weight", "BF16", (VOCAB, d), bf16_bits(lm).tobytes()))
    return layers, gl


def write_checkpoint(out_dir, c, rng):
    layers, gl = make_weights(c, rng)
    nshards = 3
    shards = [[] for _ in range(nshards)]
    L = len(layers)
    for i, t in enumerate(layers):
        shards[i * nshards // L].extend(t)  # one layer never straddles shards
    shards[-1].extend(gl)                   # globals in the last shard (the release: shard 94 of 96)
    weight_map, total = {}, 0
    for s, ts in enumerate(shards):
        fname = f"model-{s + 1:05d}-of-{nshards:06d}.safetensors"
        write_safetensors(os.path.join(out_dir, fname), ts)
        for t in ts:
            weight_map[t.name] = fname
            total += len(t.data)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top_config_for(c), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": N_BASE, "eos_token_id": N_BASE + 2}, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------------
# Tokenizer

def train_bpe(text, num_merges):
    """Deterministic byte-level BPE: returns the list of merged token byte strings in rank order (the ranks
    256.. of a tiktoken file). Ties on pair frequency break on the smaller (left rank, right rank)."""
    words = collections.Counter(m.group(0).encode() for m in TRAIN_PAT.finditer(text))
    vocab = {bytes([b]): b for b in range(256)}
    seqs = {w: [bytes([b]) for b in w] for w in words}
    merges = []
    while len(merges) < num_merges:
        pairs = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            raise RuntimeError("training text too small for the requested merges")
        best = min(pairs, key=lambda ab: (-pairs[ab], vocab[ab[0]], vocab[ab[1]]))
        new = best[0] + best[1]
        if new not in vocab:  # two different pairs can spell the same bytes; rank it once
            vocab[new] = len(vocab)
            merges.append(new)
        for w in words:
            s, out, k = seqs[w], [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == best[0] and s[k + 1] == best[1]:
                    out.append(new)
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            seqs[w] = out
    return merges


def special_name(off):
    return SPECIAL_NAMES.get(off, f"<|reserved_token_{N_BASE + off}|>")


def write_tokenizer(out_dir, merges):
    ranks = [bytes([b]) for b in range(256)] + merges
    assert len(ranks) == N_BASE and len(set(ranks)) == N_BASE
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        for r, tok in enumerate(ranks):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")
    added = {
        str(N_BASE + off): {"content": special_name(off), "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True}
        for off in range(256)
    }
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"],
        "bos_token": "[BOS]",
        "eos_token": "<|end_of_msg|>",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return ranks


def tokenizer_goldens(ranks):
    """Encodings of a few strings by tiktoken with K3's pre-tokenizer regex over this tiny vocabulary.
    Returns None when tiktoken is not installed."""
    try:
        import tiktoken
    except ImportError:
        return None
    specials = {special_name(off): N_BASE + off for off in range(256)}
    enc = tiktoken.Encoding(name="k3-tiny", pat_str=K3_PAT, mergeable_ranks={t: r for r, t in enumerate(ranks)},
                            special_tokens=specials)
    texts = [
        "The keeper opened the gate.",
        "In the spring the water is high and fast, and the keeper opens the gate only a little.",
        "Numbers: 12 inches, 345678 turns, 3.14159!",
        "  leading spaces\n\nand blank lines\r\n",
        "He said \"the river remembers\" -- and we're sure it'll rain.",
        "Ünïcödé wörds, 中文字符 and emoji \U0001F30A mixed in.",
        "tabs\tand   runs of    spaces   ",
    ]
    cases = [{"text": s, "ids": enc.encode_ordinary(s)} for s in texts]
    # Structural specials are recognised only in trusted segments; this case encodes them as specials.
    s = "<|open|>message role=\"user\"<|sep|>Hello<|close|>message<|sep|><|end_of_msg|>"
    cases.append({"text": s, "ids": enc.encode(s, allowed_special="all"), "allowed_special": "all"})
    for cse in cases:
        assert enc.decode(cse["ids"]) == cse["text"]
    return {"pattern": K3_PAT, "tiktoken_version": importlib.metadata.version("tiktoken"), "cases": cases}


# ----------------------------------------------------------------------------------------------------------
# mlx-lm reference

def mlx_load(ckpt_dir):
    import mlx.core as mx
    from mlx_lm.utils import load_model
    mx.set_default_device(mx.cpu)
    model, _ = load_model(Path(ckpt_dir), strict=True)
    # f32 computation of the bf16 / MXFP4 weights: only floating parameters are cast (the default
    # predicate of Module.set_dtype), so the uint32-viewed MXFP4 bytes and uint8 E8M0 scales are untouched.
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def check_mxfp4(model, ckpt_dir, c):
    """mx.dequantize(mode='mxfp4') of every expert of every MoE layer must equal the numpy decode of the
    raw checkpoint bytes exactly."""
    import mlx.core as mx
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    cache, n, lo_neg0, hi_neg0 = {}, 0, 0, 0
    for i, layer in enumerate(model.language_model.model.layers):
        if i == 0:
            continue
        sw = layer.mlp.switch_mlp
        for src, proj in (("w1", sw.gate_proj), ("w2", sw.down_proj), ("w3", sw.up_proj)):
            assert isinstance(proj, QuantizedSwitchLinear) and proj.mode == "mxfp4", (i, src, type(proj))
            assert proj.weight.dtype == mx.uint32 and proj.scales.dtype == mx.uint8
            deq = np.array(mx.dequantize(proj.weight, proj.scales, group_size=32, bits=4, mode="mxfp4")
                           .astype(mx.float32))
            for e in range(c["experts"]):
                base = f"language_model.model.layers.{i}.block_sparse_moe.experts.{e}.{src}"
                f = wm[base + ".weight_packed"]
                if f not in cache:
                    cache[f] = k3_numpy_ref.read_safetensors(os.path.join(ckpt_dir, f))
                pk = k3_numpy_ref.to_array(*cache[f][base + ".weight_packed"])
                sc = k3_numpy_ref.to_array(*cache[f][base + ".weight_scale"])
                ref = k3_numpy_ref.mxfp4_decode(pk, sc).astype(np.float32)
                lo_neg0 += int(np.count_nonzero((pk & 0x0F) == 8))
                hi_neg0 += int(np.count_nonzero((pk >> 4) == 8))
                if not np.array_equal(deq[e].view(np.uint32), ref.view(np.uint32)):
                    raise AssertionError(f"mlx mxfp4 dequant differs from K3.md 3.3 decode: layer {i} expert {e} {src}")
                n += 1
    # -0 (code 8) must occur in both nibble positions so a decoder that mishandles it is caught.
    assert lo_neg0 > 0 and hi_neg0 > 0, (lo_neg0, hi_neg0)
    return n


def router_info(mo, x):
    """Replays the router of a KimiK3SparseMoE on its input with mlx-lm's own `_group_expert_select`."""
    import mlx.core as mx
    from mlx_lm.models import kimi_k3 as K
    a = mo.args
    gates = mo.gate(x)
    inds, w = K._group_expert_select(gates, mo.e_score_correction_bias, a.num_experts_per_token,
                                     a.num_expert_group, a.topk_group, a.routed_scaling_factor, a.moe_renormalize)
    s = mx.sigmoid(gates.astype(mx.float32))
    choice = s + mo.e_score_correction_bias.astype(mx.float32)
    return np.array(inds), np.array(w), np.array(choice), np.array(s)


def mlx_stages(model, ids):
    """Stage-by-stage replay of `KimiK3TextModel.__call__` (single pipeline rank, no cache, AttnRes on) using
    mlx-lm's submodules; asserts the logits equal `model(ids)` bit for bit."""
    import mlx.core as mx
    from mlx_lm.models import kimi_k3 as K
    from mlx_lm.models.base import create_attention_mask, create_ssm_mask
    lm = model.language_model
    tm = lm.model
    x_ids = mx.array(np.asarray(ids, dtype=np.int32))[None]
    ref_logits = model(x_ids)  # also fills the layers' lazily cached AttnRes w_eff
    mx.eval(ref_logits)
    st = {}
    h = tm.embed_tokens(x_ids)
    cache = [None] * tm.num_layers
    ssm_mask = create_ssm_mask(h, cache[tm.ssm_idx]) if tm.ssm_idx is not None else None
    attn_mask = create_attention_mask(h, cache[tm.attn_idx], return_array=True) if tm.attn_idx is not None else None
    blocks = K.ResidualBlocks(tm.args.rms_norm_eps)
    st["embed"] = h[0]
    router = {}
    for i in range(tm.num_layers):
        layer = tm.layers[i]
        mask = ssm_mask if layer.is_linear else attn_mask
        partial = h
        hm = K._attn_res_mix(blocks, partial, layer._attn_res_w_eff, layer.eps, not layer.training)
        if layer.is_block_start:
            blocks.append(partial)
            partial = None
        a_in = layer.input_layernorm(hm)
        y = layer.self_attn(a_in, mask, None)
        partial = y if partial is None else partial + y
        hm = K._attn_res_mix(blocks, partial, layer._mlp_res_w_eff, layer.eps, not layer.training)
        m_in = layer.post_attention_layernorm(hm)
        m = layer.mlp(m_in)
        st[f"layer{i}.attn_in"], st[f"layer{i}.attn_out"] = a_in[0], y[0]
        st[f"layer{i}.mlp_in"], st[f"layer{i}.mlp_out"] = m_in[0], m[0]
        if isinstance(layer.mlp, K.KimiK3SparseMoE):
            inds, w, choice, s = router_info(layer.mlp, m_in)
            inds, w, choice, s = inds[0], w[0], choice[0], s[0]
            order = np.argsort(inds, axis=-1, kind="stable")
            st[f"layer{i}.router_idx"] = np.take_along_axis(inds, order, -1).astype(np.int32)
            st[f"layer{i}.router_w"] = np.take_along_axis(w, order, -1).astype(np.float32)
            router[i] = (choice, s)
        partial = partial + m
        h = partial
    final = K._attn_res_mix(blocks, h, tm._output_res_w_eff, tm.args.rms_norm_eps, not tm.training)
    logits = lm.lm_head(tm.norm(final))
    mx.eval(logits)
    st["final_hidden"] = final[0]
    st["logits"] = logits[0]
    a, b = np.array(logits), np.array(ref_logits)
    if not np.array_equal(a, b):
        raise AssertionError(f"driver logits differ from model(ids): max {np.abs(a - b).max():.3e}")
    st = {k: (np.array(v) if not isinstance(v, np.ndarray) else v) for k, v in st.items()}
    return st, router


def router_margins(router, k):
    """Per layer: min over rows of (k-th best - (k+1)-th best) biased choice score; and how many rows' /
    experts' selections the bias changes relative to the unbiased scores."""
    out = {}
    for i, (choice, s) in router.items():
        srt = -np.sort(-choice, axis=-1)
        margin = float((srt[:, k - 1] - srt[:, k]).min())
        sel_b = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
        sel_u = np.argsort(-s, axis=-1, kind="stable")[:, :k]
        rows_changed, experts_changed = 0, 0
        for r in range(choice.shape[0]):
            diff = len(set(sel_b[r]) - set(sel_u[r]))
            rows_changed += diff > 0
            experts_changed += diff
        out[i] = {"min_margin": margin, "rows": int(choice.shape[0]), "rows_changed_by_bias": int(rows_changed),
                  "experts_changed_by_bias": int(experts_changed)}
    return out


def greedy_cached(model, prompt, n_new):
    """Prefill with mlx-lm's cache, then single-token steps; returns (tokens, logits rows, top-2 margins)."""
    import mlx.core as mx
    cache = model.make_cache()
    out = model(mx.array(np.asarray(prompt, dtype=np.int32))[None], cache=cache)
    rows, toks, margins = [], [], []
    for step in range(n_new):
        row = np.array(out[0, -1].astype(mx.float32))
        rows.append(row)
        srt = np.sort(row)
        margins.append(float(srt[-1] - srt[-2]))
        tok = int(np.argmax(row))
        toks.append(tok)
        if step + 1 < n_new:
            out = model(mx.array([[tok]], dtype=mx.int32), cache=cache)
    return toks, np.stack(rows), margins


def full_logits(model, ids):
    import mlx.core as mx
    out = model(mx.array(np.asarray(ids, dtype=np.int32))[None])
    return np.array(out[0])


# ----------------------------------------------------------------------------------------------------------

def attempt(name, c, out_dir, a):
    """One deterministic draw. Returns (ok, reasons, payload)."""
    seed = c["seed"] + a
    rng = np.random.default_rng(seed)
    if os.path.isdir(out_dir):
        for f in os.listdir(out_dir):
            if f.startswith("model") or f.startswith("golden"):
                os.remove(os.path.join(out_dir, f))
    os.makedirs(out_dir, exist_ok=True)
    write_checkpoint(out_dir, c, rng)
    model = mlx_load(out_dir)
    prng = np.random.default_rng([seed, 7])
    prompts = [prng.integers(0, N_BASE, size=n).tolist() for n in PROMPT_LENS]
    dprompt = prng.integers(0, N_BASE, size=DECODE_PROMPT_LEN).tolist()

    k = c["topk"]
    reasons = []
    stages, margins_prompts = [], {}
    for j, p in enumerate(prompts):
        st, router = mlx_stages(model, p)
        stages.append(st)
        for i, r in router_margins(router, k).items():
            agg = margins_prompts.setdefault(i, {"min_margin": np.inf, "rows": 0, "rows_changed_by_bias": 0,
                                                 "experts_changed_by_bias": 0})
            agg["min_margin"] = min(agg["min_margin"], r["min_margin"])
            for key in ("rows", "rows_changed_by_bias", "experts_changed_by_bias"):
                agg[key] += r[key]

    # Decode scenario: prefill DECODE_PROMPT_LEN tokens then DECODE_STEPS single-token steps.
    dtoks, dlogits, dmargins = greedy_cached(model, dprompt, DECODE_STEPS + 1)
    dfull = full_logits(model, dprompt + dtoks[:-1])[DECODE_PROMPT_LEN - 1:]
    decode_diff = float(np.abs(dlogits - dfull).max())

    greedy = []
    for p in prompts:
        toks, _, margins = greedy_cached(model, p, GREEDY_NEW)
        greedy.append({"prompt": p, "tokens": toks, "margins": margins})

    # Router margins over every routed row of the decode and greedy runs too (via full-sequence replays).
    margins_all = {i: dict(v) for i, v in margins_prompts.items()}
    for seq in [dprompt + dtoks[:-1]] + [g["prompt"] + g["tokens"][:-1] for g in greedy]:
        _, router = mlx_stages(model, seq)
        for i, r in router_margins(router, k).items():
            margins_all[i]["min_margin"] = min(margins_all[i]["min_margin"], r["min_margin"])

    worst_router = min(v["min_margin"] for v in margins_all.values())
    if worst_router < ROUTER_MARGIN_MIN:
        reasons.append(f"router margin {worst_router:.2e}")
    worst_logit = min([min(g["margins"]) for g in greedy] + [min(dmargins)])
    if worst_logit < LOGIT_MARGIN_MIN:
        reasons.append(f"greedy logit margin {worst_logit:.2e}")
    gen = [t for g in greedy for t in g["tokens"]] + dtoks
    if any(t >= N_BASE for t in gen):
        reasons.append("greedy produced a reserved special token")
    changed = sum(v["rows_changed_by_bias"] for v in margins_prompts.values())
    if changed == 0:
        reasons.append("e_score_correction_bias changed no selection")
    payload = dict(seed=seed, model=model, prompts=prompts, stages=stages, margins_prompts=margins_prompts,
                   margins_all=margins_all, decode=dict(prompt=dprompt, tokens=dtoks, logits=dlogits,
                                                        margins=dmargins, full_recompute_max_abs_diff=decode_diff),
                   greedy=greedy)
    return not reasons, reasons, payload


def generate(name, c, root, merges, tok_golden):
    out_dir = os.path.join(root, name)
    for a in range(MAX_ATTEMPTS):
        ok, reasons, pl = attempt(name, c, out_dir, a)
        if ok:
            break
        print(f"[{name}] attempt {a} (seed {c['seed'] + a}) rejected: {'; '.join(reasons)}")
    else:
        raise RuntimeError(f"{name}: no acceptable draw in {MAX_ATTEMPTS} attempts")
    write_tokenizer(out_dir, merges)
    nmx = check_mxfp4(pl["model"], out_dir, c)

    # golden.safetensors
    tensors, stage_names = [], []

    def add(n, arr):
        arr = np.ascontiguousarray(arr)
        if arr.dtype == np.int32 or arr.dtype == np.int64:
            tensors.append(Tensor(n, "I32", arr.shape, arr.astype("<i4").tobytes()))
        else:
            tensors.append(Tensor(n, "F32", arr.shape, arr.astype("<f4").tobytes()))
        stage_names.append(n)

    per_prompt = ["ids", "embed"]
    for i in range(c["layers"]):
        per_prompt += [f"layer{i}.attn_in", f"layer{i}.attn_out", f"layer{i}.mlp_in", f"layer{i}.mlp_out"]
        if i >= 1:
            per_prompt += [f"layer{i}.router_idx", f"layer{i}.router_w"]
    per_prompt += ["final_hidden", "logits"]
    for j, (p, st) in enumerate(zip(pl["prompts"], pl["stages"])):
        st = dict(st, ids=np.array(p, dtype=np.int32))
        for s in per_prompt:
            add(f"p{j}.{s}", st[s])
    dec = pl["decode"]
    add("decode.prompt", np.array(dec["prompt"], dtype=np.int32))
    add("decode.tokens", np.array(dec["tokens"], dtype=np.int32))
    add("decode.logits", dec["logits"])
    write_safetensors(os.path.join(out_dir, "golden.safetensors"), tensors, {"format": "sluice-golden"})

    versions = {p: importlib.metadata.version(p) for p in ("mlx", "mlx-lm", "numpy")}
    gj = {
        "config_name": name,
        "seed": pl["seed"],
        "generator": "tools/gen_k3_goldens.py",
        "reference": "mlx-lm kimi_k3 on CPU; checkpoint loaded by mlx_lm.utils.load_model (sanitize + native "
                     "mxfp4 experts + load_weights(strict=True)); every floating parameter cast to float32 "
                     "afterwards, so this is an f32 computation of the bf16/MXFP4 weights",
        "versions": versions,
        "vocab": {"bpe_ranks": N_BASE, "vocab_size": VOCAB, "bos": N_BASE, "eos": N_BASE + 2, "pad": N_BASE + 255},
        "text_config": {k: v for k, v in text_config_for(c).items() if k != "quantization_config"},
        "prompts": pl["prompts"],
        "stage_template": [f"p{{j}}.{s}" for s in per_prompt],
        "stage_names": stage_names,
        "stage_notes": {
            "embed": "embed_tokens rows [T,d]",
            "attn_in": "input_layernorm(AttnRes mix) = the normed input of self_attn [T,d]",
            "attn_out": "self_attn output (after o_proj) [T,d]",
            "mlp_in": "post_attention_layernorm(AttnRes mix) [T,d]",
            "mlp_out": "dense MLP (layer 0) or latent MoE output incl. shared experts [T,d]",
            "router_idx": "I32 [T,k] selected experts (biased choice), sorted ascending per row",
            "router_w": "F32 [T,k] weights aligned with router_idx: unbiased sigmoid, renormalised (+1e-20), "
                        "times routed_scaling_factor",
            "final_hidden": "output AttnRes mix, before model.norm [T,d]",
            "logits": "lm_head(model.norm(final_hidden)) [T,V]",
        },
        "router_margins_prompts": {str(i): v for i, v in sorted(pl["margins_prompts"].items())},
        "router_min_margin_all_rows": {str(i): v["min_margin"] for i, v in sorted(pl["margins_all"].items())},
        "decode": {
            "prompt": dec["prompt"],
            "tokens": dec["tokens"],
            "logits_tensor": "decode.logits",
            "logits_rows": "row 0 = last row of the prefill; row s = after feeding tokens[s-1]",
            "margins": dec["margins"],
            "full_recompute_max_abs_diff": dec["full_recompute_max_abs_diff"],
        },
        "greedy": pl["greedy"],
        "mxfp4_dequant_exact_matrices": nmx,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(gj, f, indent=1)
        f.write("\n")

    # Independent float64 cross-check.
    print(f"[{name}] numpy float64 reference:")
    r = k3_numpy_ref.compare_with_goldens(out_dir)
    gj["numpy_f64_check"] = r
    worst = max(p["logits_rel_l2"] for p in r["prompts"])
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(gj, f, indent=1)
        f.write("\n")
    if tok_golden is not None:
        with open(os.path.join(root, "tokenizer_golden.json"), "w") as f:
            json.dump(tok_golden, f, indent=1, ensure_ascii=False)
            f.write("\n")

    print(f"[{name}] seed {pl['seed']}; decode vs full recompute max abs {dec['full_recompute_max_abs_diff']:.3e}")
    for i, v in sorted(pl["margins_prompts"].items()):
        print(f"[{name}]   layer {i}: router min margin {v['min_margin']:.3e} (all rows "
              f"{pl['margins_all'][i]['min_margin']:.3e}); bias changed {v['rows_changed_by_bias']}/{v['rows']} "
              f"rows, {v['experts_changed_by_bias']} experts")
    print(f"[{name}]   greedy min margin {min(min(g['margins']) for g in pl['greedy']):.3e}; "
          f"mxfp4 matrices checked {nmx}")
    if worst > 1e-4 or not r["routing_equal"]:
        raise AssertionError(f"{name}: numpy f64 reference disagrees with mlx-lm (logits relL2 {worst:.3e}, "
                             f"routing equal {r['routing_equal']}, worst stage {r['worst_stage']})")


def main():
    ap = argparse.ArgumentParser(description="Generate Kimi K3 tiny checkpoints and mlx-lm golden vectors.")
    ap.add_argument("--out", required=True, help="output root, e.g. tests/fixtures/kimi_k3")
    ap.add_argument("--only", choices=sorted(CONFIGS), help="generate one configuration")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    merges = train_bpe(TRAIN_TEXT, NUM_MERGES)
    ranks = [bytes([b]) for b in range(256)] + merges
    tok_golden = tokenizer_goldens(ranks)
    for name in sorted(CONFIGS):
        if args.only and name != args.only:
            continue
        generate(name, CONFIGS[name], args.out, merges, tok_golden)


if __name__ == "__main__":
    main()
