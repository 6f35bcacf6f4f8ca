#!/usr/bin/env python3
"""Independent float64 numpy reference for the Kimi K3 text model.

Written from docs/K3.md section 2 (forward math) and section 3 (checkpoint layout, MXFP4), not from
mlx-lm: it reads a checkpoint directory in the published layout (config.json with `text_config`,
`model.safetensors.index.json`, sharded safetensors with `language_model.` names, MXFP4 routed experts) with
its own safetensors parser and runs the whole forward pass in float64.

It exists to cross-check the mlx-lm golden vectors produced by tools/gen_k3_goldens.py: two independent
implementations that agree to ~1e-5 relative L2 on logits (fp32 vs fp64 noise) make it unlikely that both
misread the same formula.

Usage:
    python3 tools/k3_numpy_ref.py tests/fixtures/kimi_k3/tiny-a

With a directory that holds golden.json/golden.safetensors, every prompt's logits (and every captured stage)
are compared with the goldens and the relative L2 errors are printed. Library use: `K3Ref(dir).forward(ids)`.

Math implemented (K3.md section references):
  * 2.1 Attention Residuals: keys RMS-normalised without weight (eps = rms_norm_eps), logit = dot(key,
    norm_w * proj_w), softmax over depth, mix of RAW values; block boundary at 0-based `i % B == 0` banks the
    raw layer input and restarts the partial sum at the attention output.
  * 2.2 KDA: causal depthwise conv(4) + SiLU on q, k, v; l2norm x / sqrt(sum x^2 + 1e-6), q scaled by D^-0.5;
    gate g = lb * sigmoid(exp(A_log[h]) * (f_b(f_a(x)) + dt_bias)) with A_log per HEAD (first H entries);
    beta = sigmoid(b_proj x); recurrence decay -> predict -> write -> read; RMSNorm(o_norm, rms_norm_eps) per
    head, times sigmoid(g_proj x), then o_proj.
  * 2.3 NoPE MLA: q_a/kv_a RMSNorm eps 1e-6, k_pe shared across heads and never rotated, scale
    (nope+rope)^-0.5, sigmoid output gate before o_proj.
  * 2.4 latent MoE: sigmoid router, selection-only bias, top-k, renormalise (+1e-20), * routed_scaling_factor
    (before the latent norm), latent down-projection, experts in the latent, RMSNorm(latent), up-projection,
    plus unweighted shared experts on the full hidden.
  * 2.5 SiTU-GLU: [b tanh(g/b) sigmoid(g)] * [bl tanh(u/bl)].
  * 3.3 MXFP4: low nibble first, E2M1 LUT, E8M0 scale 2^(s-127) per 32 input elements.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)

MLA_LORA_NORM_EPS = 1e-6  # K3.md 0.2: KimiRMSNorm default, not rms_norm_eps
L2NORM_EPS = 1e-6         # K3.md 2.2: fla l2norm, eps inside the sqrt of the sum of squares


# ----------------------------------------------------------------------------------------------------------
# safetensors reading (own parser: 8-byte LE header length, JSON header, raw little-endian data)

def read_safetensors(path):
    """Returns {name: (dtype_str, shape, raw_bytes)} for every tensor in one safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[base + b: base + e])
    return out


def to_array(dtype, shape, raw):
    """Decodes raw bytes; floating types come back as float64, U8/I32 unchanged."""
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).reshape(shape)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float64).reshape(shape)
    if dtype == "U8":
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    if dtype == "I32":
        return np.frombuffer(raw, dtype="<i4").reshape(shape)
    raise ValueError(f"unsupported dtype {dtype}")


def mxfp4_decode(packed, scale):
    """K3.md 3.3: W[r,c] = E2M1[nibble(r,c)] * 2^(scale[r, c//32] - 127); element 2j = low nibble of byte j."""
    rows, half = packed.shape
    cols = half * 2
    assert scale.shape == (rows, cols // 32), (packed.shape, scale.shape)
    codes = np.empty((rows, cols), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    sc = np.ldexp(1.0, scale.astype(np.int64) - 127)
    return E2M1[codes] * np.repeat(sc, 32, axis=1)


# ----------------------------------------------------------------------------------------------------------
# math helpers

def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def situ(gate, up, beta, linear_beta):
    a = beta * np.tanh(gate / beta) * sigmoid(gate)   # sigmoid of the UNCLIPPED gate
    u = up if linear_beta is None else linear_beta * np.tanh(up / linear_beta)
    return a * u


def attn_res(prefix, anchors, norm_w, proj_w, eps):
    """K3.md 2.1: depth softmax over [anchors..., prefix]; keys normalised, values raw. Shapes [T, d]."""
    values = list(anchors) + [prefix]
    sw = norm_w * proj_w.reshape(-1)
    logits = np.stack([(v @ sw) / np.sqrt(np.mean(v * v, axis=-1) + eps) for v in values])  # [N, T]
    logits = logits - logits.max(axis=0, keepdims=True)
    p = np.exp(logits)
    p = p / p.sum(axis=0, keepdims=True)
    return sum(p[j][:, None] * values[j] for j in range(len(values)))


# ----------------------------------------------------------------------------------------------------------

class K3Ref:
    """Float64 Kimi K3 text model over a published-layout checkpoint directory."""

    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            top = json.load(f)
        self.cfg = top["text_config"]
        with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        raw = {}
        for shard in sorted(set(index["weight_map"].values())):
            raw.update(read_safetensors(os.path.join(ckpt_dir, shard)))
        prefix = "language_model."
        self.w = {}
        for name, (dt, shape, b) in raw.items():
            assert name.startswith(prefix), name
            self.w[name[len(prefix):]] = to_array(dt, shape, b)
        self._dequant_experts()

    def _dequant_experts(self):
        c = self.cfg
        self.experts = {}
        for i in range(c["num_hidden_layers"]):
            if not self.is_moe(i):
                continue
            p = f"model.layers.{i}.block_sparse_moe.experts"
            ex = []
            for e in range(c["num_experts"]):
                mats = {}
                for wn in ("w1", "w2", "w3"):
                    mats[wn] = mxfp4_decode(self.w.pop(f"{p}.{e}.{wn}.weight_packed"),
                                            self.w.pop(f"{p}.{e}.{wn}.weight_scale"))
                ex.append(mats)
            self.experts[i] = ex

    # -- structure ---------------------------------------------------------------------------------------
    def is_kda(self, i):
        return (i + 1) in self.cfg["linear_attn_config"]["kda_layers"]  # 1-based list

    def is_moe(self, i):
        c = self.cfg
        return c["num_experts"] > 0 and i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0

    # -- sublayers ---------------------------------------------------------------------------------------
    def kda(self, i, x):
        c = self.cfg
        lac = c["linear_attn_config"]
        H, D = lac["num_heads"], lac["head_dim"]
        T = x.shape[0]
        p = f"model.layers.{i}.self_attn"
        W = self.w
        outs = []
        for name in ("q", "k", "v"):
            y = x @ W[f"{p}.{name}_proj.weight"].T                      # [T, P]
            cw = W[f"{p}.{name}_conv1d.weight"][:, 0, :]                 # [P, K]
            K = cw.shape[1]
            hist = np.concatenate([np.zeros((K - 1, y.shape[1])), y])    # zero conv state at sequence start
            u = np.zeros_like(y)
            for j in range(K):                                           # tap K-1 = current token
                u += cw[:, j] * hist[j:j + T]
            outs.append(silu(u).reshape(T, H, D))
        q, k, v = outs
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + L2NORM_EPS) * D ** -0.5
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + L2NORM_EPS)
        z = (x @ W[f"{p}.f_a_proj.weight"].T) @ W[f"{p}.f_b_proj.weight"].T
        z = (z + W[f"{p}.dt_bias"]).reshape(T, H, D)
        a = np.exp(W[f"{p}.A_log"][:H])                                  # PER HEAD (K3.md 0.1)
        g = lac["gate_lower_bound"] * sigmoid(a[None, :, None] * z)     # log decay [T, H, D]
        beta = sigmoid(x @ W[f"{p}.b_proj.weight"].T)                    # [T, H]
        S = np.zeros((H, D, D))                                          # [H, K, V]
        o = np.zeros((T, H, D))
        for t in range(T):
            S = S * np.exp(g[t])[:, :, None]
            err = v[t] - np.einsum("hk,hkv->hv", k[t], S)
            S = S + np.einsum("hk,hv->hkv", beta[t][:, None] * k[t], err)
            o[t] = np.einsum("hk,hkv->hv", q[t], S)
        o = rmsnorm(o, W[f"{p}.o_norm.weight"], c["rms_norm_eps"])
        o = o * sigmoid((x @ W[f"{p}.g_proj.weight"].T).reshape(T, H, D))
        return o.reshape(T, H * D) @ W[f"{p}.o_proj.weight"].T

    def mla(self, i, x):
        c = self.cfg
        H = c["num_attention_heads"]
        dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        kvr = c["kv_lora_rank"]
        T = x.shape[0]
        p = f"model.layers.{i}.self_attn"
        W = self.w
        cq = rmsnorm(x @ W[f"{p}.q_a_proj.weight"].T, W[f"{p}.q_a_layernorm.weight"], MLA_LORA_NORM_EPS)
        q = (cq @ W[f"{p}.q_b_proj.weight"].T).reshape(T, H, dn + dr)
        ckv = x @ W[f"{p}.kv_a_proj_with_mqa.weight"].T
        lat = rmsnorm(ckv[:, :kvr], W[f"{p}.kv_a_layernorm.weight"], MLA_LORA_NORM_EPS)
        k_pe = ckv[:, kvr:]                                              # shared by all heads, not rotated
        kv = (lat @ W[f"{p}.kv_b_proj.weight"].T).reshape(T, H, dn + dv)
        k = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe[:, None, :], (T, H, dr))], axis=-1)
        vv = kv[..., dn:]
        scores = np.einsum("thd,shd->hts", q, k) * (dn + dr) ** -0.5
        scores = scores + np.triu(np.full((T, T), -np.inf), 1)[None]
        scores = scores - scores.max(axis=-1, keepdims=True)
        pr = np.exp(scores)
        pr = pr / pr.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", pr, vv).reshape(T, H * dv)
        if c.get("mla_use_output_gate", False):
            attn = attn * sigmoid(x @ W[f"{p}.g_proj.weight"].T)
        return attn @ W[f"{p}.o_proj.weight"].T

    def glu(self, x, gate_w, up_w, down_w):
        c = self.cfg
        h = situ(x @ gate_w.T, x @ up_w.T, c["activation_situ_beta"], c["activation_situ_linear_beta"])
        return h @ down_w.T

    def moe(self, i, x):
        """Returns (output, sorted idx [T,k], weights aligned with sorted idx [T,k], choice scores [T,E])."""
        c = self.cfg
        p = f"model.layers.{i}.block_sparse_moe"
        W = self.w
        k = c["num_experts_per_token"]
        s = sigmoid(x @ W[f"{p}.gate.weight"].T)                         # [T, E]
        choice = s + W[f"{p}.gate.e_score_correction_bias"]              # selection only
        T = x.shape[0]
        idx = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
        wts = np.take_along_axis(s, idx, axis=-1)
        if k > 1 and c["moe_renormalize"]:
            wts = wts / (wts.sum(axis=-1, keepdims=True) + 1e-20)
        wts = wts * c["routed_scaling_factor"]                           # before the latent norm
        z = x @ W[f"{p}.routed_expert_down_proj.weight"].T               # [T, latent]
        y = np.zeros_like(z)
        for t in range(T):
            for j in range(k):
                e = self.experts[i][idx[t, j]]
                y[t] += wts[t, j] * self.glu(z[t:t + 1], e["w1"], e["w3"], e["w2"])[0]
        if c.get("latent_moe_use_norm", False):
            y = rmsnorm(y, W[f"{p}.routed_expert_norm.weight"], c["rms_norm_eps"])
        y = y @ W[f"{p}.routed_expert_up_proj.weight"].T
        if c.get("num_shared_experts", 0):
            y = y + self.glu(x, W[f"{p}.shared_experts.gate_proj.weight"],
                             W[f"{p}.shared_experts.up_proj.weight"], W[f"{p}.shared_experts.down_proj.weight"])
        order = np.argsort(idx, axis=-1)
        return y, np.take_along_axis(idx, order, -1), np.take_along_axis(wts, order, -1), choice

    # -- whole model -------------------------------------------------------------------------------------
    def forward(self, ids):
        """Returns (logits [T, V], stages dict with the golden stage names without the `p{j}.` prefix)."""
        c = self.cfg
        W = self.w
        eps = c["rms_norm_eps"]
        B = c["attn_res_block_size"]
        st = {}
        h = W["model.embed_tokens.weight"][np.asarray(ids)]
        st["embed"] = h
        prefix, anchors = h, []
        for i in range(c["num_hidden_layers"]):
            lp = f"model.layers.{i}"
            x = attn_res(prefix, anchors, W[f"{lp}.self_attention_res_norm.weight"],
                         W[f"{lp}.self_attention_res_proj.weight"], eps) if anchors else prefix
            if i % B == 0:
                anchors.append(prefix)
                prefix = None
            xin = rmsnorm(x, W[f"{lp}.input_layernorm.weight"], eps)
            a = self.kda(i, xin) if self.is_kda(i) else self.mla(i, xin)
            st[f"layer{i}.attn_in"], st[f"layer{i}.attn_out"] = xin, a
            prefix = a if prefix is None else prefix + a
            x = attn_res(prefix, anchors, W[f"{lp}.mlp_res_norm.weight"], W[f"{lp}.mlp_res_proj.weight"], eps)
            min_ = rmsnorm(x, W[f"{lp}.post_attention_layernorm.weight"], eps)
            if self.is_moe(i):
                m, idx, wts, choice = self.moe(i, min_)
                st[f"layer{i}.router_idx"], st[f"layer{i}.router_w"] = idx, wts
                st[f"layer{i}.router_choice"] = choice
            else:
                m = self.glu(min_, W[f"{lp}.mlp.gate_proj.weight"], W[f"{lp}.mlp.up_proj.weight"],
                             W[f"{lp}.mlp.down_proj.weight"])
            st[f"layer{i}.mlp_in"], st[f"layer{i}.mlp_out"] = min_, m
            prefix = prefix + m
        h = attn_res(prefix, anchors, W["model.output_attn_res_norm.weight"],
                     W["model.output_attn_res_proj.weight"], eps)
        st["final_hidden"] = h
        logits = rmsnorm(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T
        st["logits"] = logits
        return logits, st


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def compare_with_goldens(ckpt_dir, verbose=True):
    """Compares this reference with golden.safetensors/golden.json in `ckpt_dir`.

    Returns a dict with per-prompt logits relL2, per-stage worst relL2, routing agreement, and the decode
    scenario's max abs diff (mlx cached decode vs this full-sequence recompute)."""
    with open(os.path.join(ckpt_dir, "golden.json")) as f:
        gj = json.load(f)
    gold = {n: to_array(*v) for n, v in read_safetensors(os.path.join(ckpt_dir, "golden.safetensors")).items()}
    ref = K3Ref(ckpt_dir)
    result = {"prompts": [], "worst_stage": None, "routing_equal": True}
    worst = (0.0, None)
    for j in range(len(gj["prompts"])):
        ids = gold[f"p{j}.ids"].astype(np.int64)
        logits, st = ref.forward(ids)
        r = rel_l2(gold[f"p{j}.logits"], logits)
        argmax_eq = bool(np.array_equal(gold[f"p{j}.logits"].argmax(-1), logits.argmax(-1)))
        stage_rel = {}
        for name, val in st.items():
            key = f"p{j}.{name}"
            if key not in gold or name.endswith("router_choice"):
                continue
            if name.endswith("router_idx"):
                eq = bool(np.array_equal(gold[key], val))
                result["routing_equal"] &= eq
                stage_rel[name] = 0.0 if eq else float("inf")
                continue
            stage_rel[name] = rel_l2(gold[key], val)
            if stage_rel[name] > worst[0]:
                worst = (stage_rel[name], key)
        result["prompts"].append({"len": int(len(ids)), "logits_rel_l2": r,
                                  "logits_max_abs": float(np.abs(gold[f"p{j}.logits"] - logits).max()),
                                  "argmax_equal": argmax_eq, "stage_rel_l2": stage_rel})
        if verbose:
            print(f"  numpy-f64 vs mlx-f32  prompt {j} (T={len(ids)}): logits relL2 {r:.3e}  "
                  f"argmax equal {argmax_eq}  routing equal {result['routing_equal']}")
    result["worst_stage"] = {"name": worst[1], "rel_l2": worst[0]}
    dec = gj["decode"]
    full = list(dec["prompt"]) + list(dec["tokens"][:-1])
    logits, _ = ref.forward(np.array(full))
    T0 = len(dec["prompt"])
    d = float(np.abs(gold["decode.logits"] - logits[T0 - 1:]).max())
    result["decode_vs_numpy_full_max_abs"] = d
    result["decode_vs_numpy_full_rel_l2"] = rel_l2(gold["decode.logits"], logits[T0 - 1:])
    if verbose:
        print(f"  numpy-f64 full recompute vs mlx cached decode: max abs {d:.3e}")
        print(f"  worst stage relL2 {worst[0]:.3e} at {worst[1]}")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", help="checkpoint directories (with golden.json/golden.safetensors)")
    args = ap.parse_args()
    bad = False
    for d in args.dirs:
        print(d)
        r = compare_with_goldens(d)
        worst = max(p["logits_rel_l2"] for p in r["prompts"])
        if worst > 1e-4 or not r["routing_equal"]:
            bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
