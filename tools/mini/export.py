#!/usr/bin/env python3
"""Writes a trained mini-K3 in the published Kimi K3 layout (issue 17, item 5).

The layout of K3.md section 3 and of the tiny fixtures (tools/gen_k3_goldens.py): a multimodal `config.json`
(`KimiK3ForConditionalGeneration` with a `text_config` of model_type `kimi_linear` and the compressed-tensors
`mxfp4-pack-quantized` quantization_config), `generation_config.json`, `tiktoken.model` + `tokenizer_config.json`,
`model-{s:05d}-of-{n:06d}.safetensors` shards of at most 16 MiB (one layer never straddles two shards; the
embedding, lm_head and final norms in the last), `model.safetensors.index.json`. Names carry the
`language_model.` prefix; the spine is BF16 (round to nearest even) except the F32 KDA conv/A_log/dt_bias/o_norm
and router bias; routed experts are MXFP4 (`weight_packed` U8 [rows, cols/2], low nibble first, and
`weight_scale` U8 E8M0 [rows, cols/32]), the six tensors of one expert back to back, experts in a seeded shuffled
order inside the shard as in the release.

Library use from train.py: `export(model, tok_dir, out_dir)`. Command line: re-export a directory written by
this script (`--from DIR`), e.g. to change the shard size.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import gen_k3_goldens as G  # noqa: E402
import model as M  # noqa: E402

SHARD_LIMIT = 16 * 1024 * 1024
F32_SUFFIXES = ("_conv1d.weight", ".A_log", ".dt_bias", ".o_norm.weight", ".e_score_correction_bias")

# The mini-K3 shape (K3.md 1.2 at toy widths): 8 layers, KDA:MLA = 3:1 with the last layer MLA, AttnRes blocks
# of 2, dense layer 0, 64 routed experts top-4 in a 128-wide latent, 2 shared experts, SiTU-GLU.
MINI = dict(hidden=256, layers=8, block=2, kda_heads=4, kda_head_dim=64, mla_layers=[4, 8], mla_heads=4,
            q_lora=128, kv_lora=64, nope=64, rope=32, v=64, experts=64, topk=4, moe_inter=128, latent=128,
            inter=768, rsf=1.0)


def mini_config(n_ranks, c=None):
    """(top-level config.json dict, text_config dict) for a vocabulary of `n_ranks` BPE ranks + 256 specials."""
    c = dict(MINI if c is None else c)
    top = G.top_config_for(c)
    ids = {"bos_token_id": n_ranks, "eos_token_id": n_ranks + 2, "pad_token_id": n_ranks + 255}
    top.update(ids, media_placeholder_token_id=n_ranks + 21)
    top["text_config"].update(ids, vocab_size=n_ranks + 256)
    return top, top["text_config"]


def tensors_of(model, seed):
    """Returns (per-layer lists of G.Tensor, global list) with published names and dtypes."""
    sd = {n: p.detach().float().cpu() for n, p in list(model.named_parameters()) + list(model.named_buffers())}
    rng = np.random.default_rng(seed)
    layers = [[] for _ in model.layers]
    glob = []
    for n, t in sd.items():
        if n.endswith((".w1", ".w2", ".w3")):
            continue
        pub = "language_model." + M.MiniK3.published_name(n)
        if pub.endswith(F32_SUFFIXES):
            ten = G.Tensor(pub, "F32", t.shape, t.numpy().astype("<f4").tobytes())
        else:
            ten = G.Tensor(pub, "BF16", t.shape, G.bf16_bits(t.numpy()).tobytes())
        if n.startswith("layers."):
            layers[int(n.split(".")[1])].append(ten)
        else:
            glob.append(ten)
    for i, L in enumerate(model.layers):
        if not L.is_moe:
            continue
        moe = L.block_sparse_moe
        base = f"language_model.model.layers.{i}.block_sparse_moe.experts"
        packs = {}
        for wn in ("w1", "w2", "w3"):
            code, scale = M.mxfp4_quantize(getattr(moe, wn).detach().float().cpu())
            packs[wn] = (M.mxfp4_pack(code).numpy(), scale.numpy())
        for e in rng.permutation(moe.E):
            for wn in ("w1", "w2", "w3"):
                pk, sc = packs[wn][0][e], packs[wn][1][e]
                layers[i].append(G.Tensor(f"{base}.{e}.{wn}.weight_packed", "U8", pk.shape, pk.tobytes()))
                layers[i].append(G.Tensor(f"{base}.{e}.{wn}.weight_scale", "U8", sc.shape, sc.tobytes()))
    return layers, glob


def shard_plan(layers, glob, limit):
    """Greedy: consecutive layers fill a shard up to `limit` bytes; globals go in a shard of their own at the end
    when they do not fit the last layer shard."""
    size = lambda ts: sum(len(t.data) for t in ts) + 200 * len(ts)  # data + a generous header share
    shards, cur = [], []
    for ts in layers:
        if cur and size(cur) + size(ts) > limit:
            shards.append(cur)
            cur = []
        cur = cur + ts
    if size(cur) + size(glob) <= limit:
        shards.append(cur + glob)
    else:
        shards += [cur, glob]
    for s in shards:
        if size(s) > limit:
            raise ValueError(f"a shard of {size(s)} bytes exceeds the {limit}-byte limit")
    return shards


def export(model, tok_dir, out_dir, seed=17, limit=SHARD_LIMIT):
    """Writes the published-layout checkpoint of `model` into `out_dir` (created; existing model files replaced)."""
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith("model"):
            os.remove(os.path.join(out_dir, f))
    n_ranks = model.c["vocab_size"] - 256
    top, _ = mini_config(n_ranks)
    top["text_config"] = dict(model.c, quantization_config=top["text_config"]["quantization_config"])
    layers, glob = tensors_of(model, seed)
    shards = shard_plan(layers, glob, limit)
    n = len(shards)
    weight_map, total = {}, 0
    for s, ts in enumerate(shards):
        fname = f"model-{s + 1:05d}-of-{n:06d}.safetensors"
        G.write_safetensors(os.path.join(out_dir, fname), ts)
        for t in ts:
            weight_map[t.name] = fname
            total += len(t.data)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": n_ranks, "eos_token_id": n_ranks + 2}, f, indent=2)
        f.write("\n")
    for f in ("tiktoken.model", "tokenizer_config.json"):
        if tok_dir and os.path.exists(os.path.join(tok_dir, f)):
            shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    return [os.path.join(out_dir, f"model-{s + 1:05d}-of-{n:06d}.safetensors") for s in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="src", required=True, help="a published-layout mini-K3 directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tok", help="directory with tiktoken.model + tokenizer_config.json (default: --from)")
    ap.add_argument("--limit-mib", type=float, default=16)
    args = ap.parse_args()
    m, _ = M.load_checkpoint_dir(args.src, torch.float32)
    files = export(m, args.tok or args.src, args.out, limit=int(args.limit_mib * 1024 * 1024))
    print("\n".join(files))


if __name__ == "__main__":
    main()
