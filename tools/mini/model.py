#!/usr/bin/env python3
"""mini-K3: Kimi K3's text model in PyTorch (issue 17, item 3), parameter names as published.

Every mechanism of K3.md section 2, written from that spec and checked against the tiny fixtures' mlx-lm goldens
(`python3 tools/mini/model.py --check tests/fixtures/kimi_k3/tiny-a`):
  * 2.1 Attention Residuals: depth softmax over block anchors and the running partial sum, keys RMS-normalised
    without weight, raw values mixed; block boundaries bank the raw layer input.
  * 2.2 KDA (`KDA`): causal depthwise conv(4)+SiLU on q,k,v, l2-normalised q (times D^-0.5) and k, the safe gate
    -5*sigmoid(exp(A_log[h]) * (f_b(f_a(x)) + dt_bias)) with A_log per head, beta = sigmoid(b_proj x), the gated
    delta rule (decay, predict, write, read), per-head RMSNorm times sigmoid(g_proj x), o_proj. On CUDA it calls
    `fla.ops.kda.chunk_kda` with the release's flags; elsewhere a float64-safe recurrence in plain torch.
  * 2.3 gated NoPE MLA (`MLA`): q/kv low-rank with eps-1e-6 norms, k_pe shared by all heads and never rotated,
    scale (nope+rope)^-0.5, sigmoid output gate.
  * 2.4 latent MoE (`LatentMoE`): sigmoid router, selection-only `e_score_correction_bias`, top-k, renormalised,
    times routed_scaling_factor, latent down-projection, SiTU-GLU experts in the latent, RMSNorm of the sum,
    up-projection, unweighted shared experts. Dense layer 0 (`DenseMLP`).
  * 2.5 SiTU-GLU.
  * MXFP4 (K3.md 3.3): `mxfp4_quantize` / `mxfp4_dequantize` (OCP MX: E2M1 codes, E8M0 scale per 32 inputs,
    low nibble first), and fake quantisation with a straight-through gradient for MXFP4-aware training.

Routed experts are held stacked (`w1 [E, inter, latent]`, `w2 [E, latent, inter]`, `w3 [E, inter, latent]`);
`state_dict_published` / `load_published` convert to and from the per-expert names of the release.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
MLA_LORA_NORM_EPS = 1e-6
L2NORM_EPS = 1e-6


# ----------------------------------------------------------------------------------------------------------
# MXFP4

def mxfp4_quantize(w):
    """OCP MX FP4 of a [..., rows, cols] float tensor, groups of 32 along cols. Returns (codes uint8 [..., rows,
    cols] in 0..15, scale exponents uint8 [..., rows, cols/32] biased by 127). Scale = 2^(floor(log2(amax)) - 2)
    (E2M1's largest exponent is 2), elements rounded to the nearest E2M1 value (ties to the even code), clamped to 6."""
    shp = w.shape
    g = w.float().reshape(*shp[:-1], shp[-1] // 32, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2
    e = e.clamp(-127, 127)
    x = g / torch.exp2(e)
    a = x.abs().clamp(max=6.0)
    grid = torch.tensor(E2M1_GRID, device=w.device)
    mids = (grid[1:] + grid[:-1]) / 2
    idx = torch.bucketize(a, mids, right=False)          # a == mid goes to the lower code ...
    tie = (idx < 7) & (a == mids[idx.clamp(max=6)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)  # ... unless that code is odd: ties to even
    code = idx + 8 * ((x < 0) & (idx > 0)).long()
    return code.reshape(shp).to(torch.uint8), (e.squeeze(-1) + 127).to(torch.uint8)


def mxfp4_dequantize(code, scale):
    grid = torch.tensor(E2M1_GRID + [-v for v in E2M1_GRID], dtype=torch.float64, device=code.device)
    v = grid[code.long()]
    s = torch.exp2(scale.double() - 127)
    shp = v.shape
    return (v.reshape(*shp[:-1], shp[-1] // 32, 32) * s.unsqueeze(-1)).reshape(shp)


def mxfp4_pack(code):
    """[..., cols] codes -> [..., cols/2] bytes, element 2j in the low nibble of byte j (compressed-tensors)."""
    return (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)


def mxfp4_unpack(packed):
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.uint8, device=packed.device)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        c, s = mxfp4_quantize(w)
        return mxfp4_dequantize(c, s).to(w.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


def fake_mxfp4(w):
    return _FakeQuant.apply(w)


# ----------------------------------------------------------------------------------------------------------
# building blocks

def rms_norm(x, w, eps):
    """K3's RMSNorm: normalise in fp32, cast back to the activation dtype, times the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) if x.dtype != torch.float64 else \
        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w.to(x.dtype) * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def situ(gate, up, beta, lin_beta):
    dt = gate.dtype
    g, u = (gate.float(), up.float()) if dt != torch.float64 else (gate, up)
    return (beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lin_beta * torch.tanh(u / lin_beta))).to(dt)


def attn_res(prefix, anchors, norm_w, proj_w, eps):
    """K3.md 2.1 over [B, T, d] tensors: softmax over depth of dot(rms(v), norm_w*proj_w), mix raw values."""
    vals = list(anchors) + [prefix]
    dt = prefix.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    sw = (norm_w.to(cdt) * proj_w.to(cdt).reshape(-1))
    V = torch.stack([v.to(cdt) for v in vals])                      # [N, B, T, d]
    keys = V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + eps)
    p = torch.softmax(keys @ sw, dim=0)                             # [N, B, T]
    return (p.unsqueeze(-1) * V).sum(0).to(dt)


class Linear(nn.Linear):
    def __init__(self, i, o):
        super().__init__(i, o, bias=False)


class ResPair(nn.Module):
    """`*_res_norm.weight` + `*_res_proj.weight` of one AttnRes site."""

    def __init__(self, d):
        super().__init__()
        self.norm = RMSNorm(d, 1e-5)
        self.proj = Linear(d, 1)


# ----------------------------------------------------------------------------------------------------------

class KDA(nn.Module):
    def __init__(self, c):
        super().__init__()
        lac = c["linear_attn_config"]
        d = c["hidden_size"]
        self.H, self.D = lac["num_heads"], lac["head_dim"]
        assert self.H <= self.D, "A_log is stored padded to head_dim"
        P = self.H * self.D
        self.lb = lac["gate_lower_bound"]
        self.eps = c["rms_norm_eps"]
        for n in ("q", "k", "v"):
            setattr(self, f"{n}_proj", Linear(d, P))
            conv = nn.Module()
            conv.weight = nn.Parameter(torch.zeros(P, 1, lac["short_conv_kernel_size"]))
            setattr(self, f"{n}_conv1d", conv)
        self.f_a_proj = Linear(d, self.D)
        self.f_b_proj = Linear(self.D, P)
        self.b_proj = Linear(d, self.H)
        self.A_log = nn.Parameter(torch.zeros(self.D))
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.o_norm = RMSNorm(self.D, self.eps)
        self.g_proj = Linear(d, P)
        self.o_proj = Linear(P, d)
        self.use_fla = False

    def conv(self, y, w):
        K = w.shape[-1]
        out = F.conv1d(F.pad(y.transpose(1, 2), (K - 1, 0)), w.to(y.dtype), groups=y.shape[-1])
        return F.silu(out.transpose(1, 2))

    def forward(self, x):
        B, T, _ = x.shape
        H, D = self.H, self.D
        q = self.conv(self.q_proj(x), self.q_conv1d.weight).reshape(B, T, H, D)
        k = self.conv(self.k_proj(x), self.k_conv1d.weight).reshape(B, T, H, D)
        v = self.conv(self.v_proj(x), self.v_conv1d.weight).reshape(B, T, H, D)
        z = self.f_b_proj(self.f_a_proj(x)).reshape(B, T, H, D)
        braw = self.b_proj(x)
        if self.use_fla:
            from fla.ops.kda import chunk_kda
            o, _ = chunk_kda(q, k, v, z, braw, scale=D ** -0.5, A_log=self.A_log[:H].float(),
                             dt_bias=self.dt_bias.float(), use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=self.lb)
        else:
            o = self.recurrent(q, k, v, z, braw)
        o = rms_norm(o, self.o_norm.weight, self.eps)
        o = o * torch.sigmoid(self.g_proj(x).reshape(B, T, H, D))
        return self.o_proj(o.reshape(B, T, H * D))

    def recurrent(self, q, k, v, z, braw):
        """The plain recurrence of K3.md 2.2 (float32 or float64; for checks and CPU)."""
        B, T, H, D = q.shape
        cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k, v, z, braw = (t.to(cdt) for t in (q, k, v, z, braw))
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS) * D ** -0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
        a = torch.exp(self.A_log[:H].to(cdt))
        g = self.lb * torch.sigmoid(a[:, None] * (z + self.dt_bias.to(cdt).reshape(H, D)))
        beta = torch.sigmoid(braw)
        S = torch.zeros(B, H, D, D, dtype=cdt, device=q.device)
        outs = []
        for t in range(T):
            S = S * torch.exp(g[:, t]).unsqueeze(-1)
            err = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
            S = S + torch.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k[:, t], err)
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        return torch.stack(outs, 1).to(v.dtype if v.dtype == torch.float64 else q.dtype)


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.H = c["num_attention_heads"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvr = c["kv_lora_rank"]
        self.q_a_proj = Linear(d, c["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], MLA_LORA_NORM_EPS)
        self.q_b_proj = Linear(c["q_lora_rank"], self.H * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = Linear(d, self.kvr + self.dr)
        self.kv_a_layernorm = RMSNorm(self.kvr, MLA_LORA_NORM_EPS)
        self.kv_b_proj = Linear(self.kvr, self.H * (self.dn + self.dv))
        self.g_proj = Linear(d, self.H * self.dv)
        self.o_proj = Linear(self.H * self.dv, d)

    def forward(self, x):
        B, T, _ = x.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).reshape(B, T, H, dn + dr)
        ckv = self.kv_a_proj_with_mqa(x)
        lat = self.kv_a_layernorm(ckv[..., :self.kvr])
        k_pe = ckv[..., self.kvr:]
        kv = self.kv_b_proj(lat).reshape(B, T, H, dn + dv)
        k = torch.cat([kv[..., :dn], k_pe[:, :, None, :].expand(B, T, H, dr)], -1)
        vv = kv[..., dn:]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), vv.transpose(1, 2),
                                           is_causal=True, scale=(dn + dr) ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, H * dv)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))


class DenseMLP(nn.Module):
    def __init__(self, d, inter, c):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = Linear(d, inter), Linear(d, inter), Linear(inter, d)
        self.b, self.bl = c["activation_situ_beta"], c["activation_situ_linear_beta"]

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.b, self.bl))


class Router(nn.Module):
    def __init__(self, d, E):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, d))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class LatentMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, E, lat, mi = c["hidden_size"], c["num_experts"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
        self.E, self.k, self.lat, self.mi = E, c["num_experts_per_token"], lat, mi
        self.rsf, self.renorm = c["routed_scaling_factor"], c["moe_renormalize"]
        self.b, self.bl = c["activation_situ_beta"], c["activation_situ_linear_beta"]
        self.gate = Router(d, E)
        self.routed_expert_down_proj = Linear(d, lat)
        self.routed_expert_norm = RMSNorm(lat, c["rms_norm_eps"])
        self.routed_expert_up_proj = Linear(lat, d)
        self.shared_experts = DenseMLP(d, c["num_shared_experts"] * mi, c)
        self.w1 = nn.Parameter(torch.zeros(E, mi, lat))
        self.w2 = nn.Parameter(torch.zeros(E, lat, mi))
        self.w3 = nn.Parameter(torch.zeros(E, mi, lat))
        self.fake_quant = False
        self.grouped = True       # torch._grouped_mm when available; the per-expert loop otherwise
        self.last_counts = None

    def route(self, x):
        logits = x.float() @ self.gate.weight.float().T if x.dtype != torch.float64 else x @ self.gate.weight.T
        s = torch.sigmoid(logits)
        choice = s + self.gate.e_score_correction_bias.to(s.dtype)
        idx = torch.topk(choice, self.k, dim=-1, sorted=False).indices
        w = torch.gather(s, -1, idx)
        if self.k > 1 and self.renorm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.rsf, s

    def forward(self, x):
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        idx, w, _ = self.route(xf)
        z = self.routed_expert_down_proj(xf)                               # [N, lat]
        w1, w2, w3 = (self.w1, self.w2, self.w3)
        if self.fake_quant:
            w1, w2, w3 = fake_mxfp4(w1), fake_mxfp4(w2), fake_mxfp4(w3)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        self.last_counts = counts.detach()
        tok = order // self.k
        zs = z[tok]
        ws = w.reshape(-1)[order].to(z.dtype)
        if self.grouped and zs.dtype in (torch.float32, torch.bfloat16) and hasattr(torch, "_grouped_mm"):
            # One grouped GEMM per projection over the expert-sorted rows (same math as the loop below).
            offs = torch.cumsum(counts, 0).to(torch.int32)
            w1t, w2t, w3t = (t.to(zs.dtype).transpose(1, 2) for t in (w1, w2, w3))
            h = situ(torch._grouped_mm(zs, w1t, offs=offs), torch._grouped_mm(zs, w3t, offs=offs), self.b, self.bl)
            ys = torch._grouped_mm(h, w2t, offs=offs)
            y = torch.zeros_like(z).index_add_(0, tok, ys * ws[:, None])
            y = self.routed_expert_up_proj(self.routed_expert_norm(y))
            return (y + self.shared_experts(xf)).reshape(shp)
        ys = torch.empty_like(zs)
        bounds = [0] + torch.cumsum(counts, 0).tolist()
        for e in range(self.E):
            a, b = bounds[e], bounds[e + 1]
            if a == b:
                continue
            ze = zs[a:b]
            h = situ(ze @ w1[e].to(ze.dtype).T, ze @ w3[e].to(ze.dtype).T, self.b, self.bl)
            ys[a:b] = h @ w2[e].to(ze.dtype).T
        y = torch.zeros_like(z).index_add_(0, tok, ys * ws[:, None])
        y = self.routed_expert_up_proj(self.routed_expert_norm(y))
        return (y + self.shared_experts(xf)).reshape(shp)


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        d = c["hidden_size"]
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.self_attention_res = ResPair(d)
        self.mlp_res = ResPair(d)
        self.is_kda = (i + 1) in c["linear_attn_config"]["kda_layers"]
        self.self_attn = KDA(c) if self.is_kda else MLA(c)
        self.is_moe = i >= c["first_k_dense_replace"]
        if self.is_moe:
            self.block_sparse_moe = LatentMoE(c)
        else:
            self.mlp = DenseMLP(d, c["intermediate_size"], c)


class MiniK3(nn.Module):
    def __init__(self, text_config):
        super().__init__()
        c = self.c = text_config
        d, V = c["hidden_size"], c["vocab_size"]
        self.embed_tokens = nn.Embedding(V, d)
        self.layers = nn.ModuleList([Layer(c, i) for i in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(d, c["rms_norm_eps"])
        self.output_attn_res = ResPair(d)
        self.lm_head = Linear(d, V)
        self.eps = c["rms_norm_eps"]
        self.block = c["attn_res_block_size"]

    def set_fla(self, on):
        for L in self.layers:
            if L.is_kda:
                L.self_attn.use_fla = on

    def set_fake_quant(self, on):
        for L in self.layers:
            if L.is_moe:
                L.block_sparse_moe.fake_quant = on

    def forward(self, ids, stages=None):
        """ids [B, T] -> logits [B, T, V]; `stages` (a dict) collects the golden stage tensors when given."""
        h = self.embed_tokens(ids)
        if stages is not None:
            stages["embed"] = h
        prefix, anchors = h, []
        for i, L in enumerate(self.layers):
            x = attn_res(prefix, anchors, L.self_attention_res.norm.weight, L.self_attention_res.proj.weight,
                         self.eps) if anchors else prefix
            if i % self.block == 0:
                anchors.append(prefix)
                prefix = None
            a_in = L.input_layernorm(x)
            a = L.self_attn(a_in)
            prefix = a if prefix is None else prefix + a
            x = attn_res(prefix, anchors, L.mlp_res.norm.weight, L.mlp_res.proj.weight, self.eps)
            m_in = L.post_attention_layernorm(x)
            m = L.block_sparse_moe(m_in) if L.is_moe else L.mlp(m_in)
            if stages is not None:
                stages[f"layer{i}.attn_in"], stages[f"layer{i}.attn_out"] = a_in, a
                stages[f"layer{i}.mlp_in"], stages[f"layer{i}.mlp_out"] = m_in, m
                if L.is_moe:
                    idx, w, _ = L.block_sparse_moe.route(m_in.reshape(-1, m_in.shape[-1]))
                    o = torch.argsort(idx, -1)
                    stages[f"layer{i}.router_idx"] = torch.gather(idx, -1, o)
                    stages[f"layer{i}.router_w"] = torch.gather(w, -1, o)
            prefix = prefix + m
        h = attn_res(prefix, anchors, self.output_attn_res.norm.weight, self.output_attn_res.proj.weight, self.eps)
        if stages is not None:
            stages["final_hidden"] = h
        return self.lm_head(self.norm(h))

    # -- published names ---------------------------------------------------------------------------------
    @staticmethod
    def published_name(n):
        """Internal parameter name -> the release's name (without `language_model.`), or None for stacked experts."""
        n = n.replace("self_attention_res.norm.", "self_attention_res_norm.")
        n = n.replace("self_attention_res.proj.", "self_attention_res_proj.")
        n = n.replace("mlp_res.norm.", "mlp_res_norm.").replace("mlp_res.proj.", "mlp_res_proj.")
        n = n.replace("output_attn_res.norm.", "output_attn_res_norm.")
        n = n.replace("output_attn_res.proj.", "output_attn_res_proj.")
        if n.startswith("lm_head."):
            return n
        return "model." + n

    def load_published(self, tensors):
        """tensors: {published name (no prefix): float tensor}, experts as `...experts.{e}.w{1,2,3}.weight`."""
        own = dict(self.named_parameters())
        own.update(dict(self.named_buffers()))
        used = set()
        with torch.no_grad():
            for n, p in own.items():
                if n.endswith((".w1", ".w2", ".w3")):
                    base = self.published_name(n[:-3]) + ".experts"
                    which = n[-2:]
                    for e in range(p.shape[0]):
                        key = f"{base}.{e}.{which}.weight"
                        p[e].copy_(tensors[key])
                        used.add(key)
                    continue
                key = self.published_name(n)
                t = tensors[key]
                p.copy_(t.reshape(p.shape))
                used.add(key)
        extra = set(tensors) - used
        if extra:
            raise KeyError(f"unused checkpoint tensors: {sorted(extra)[:5]} ...")


# ----------------------------------------------------------------------------------------------------------
# checks against the tiny fixtures

def load_checkpoint_dir(d, dtype=torch.float64):
    """A published-layout directory -> (MiniK3 in `dtype`, text_config). MXFP4 experts are dequantised."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import k3_numpy_ref as R
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)["text_config"]
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for s in shards:
        raw.update(R.read_safetensors(os.path.join(d, s)))
    t = {}
    for name, (dt, shape, b) in raw.items():
        n = name[len("language_model."):]
        if n.endswith(".weight_scale"):
            continue
        if n.endswith(".weight_packed"):
            base = n[:-len(".weight_packed")]
            pk = torch.from_numpy(R.to_array(dt, shape, b).copy())
            sc = torch.from_numpy(R.to_array(*raw[name[:-len("weight_packed")] + "weight_scale"]).copy())
            t[base + ".weight"] = mxfp4_dequantize(mxfp4_unpack(pk), sc)
        else:
            t[n] = torch.from_numpy(R.to_array(dt, shape, b).copy())
    m = MiniK3(c)
    m.load_published(t)
    return m.to(dtype), c


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check_fixture(d, dtype=torch.float64):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import k3_numpy_ref as R
    m, c = load_checkpoint_dir(d, dtype)
    gold = {n: torch.from_numpy(R.to_array(*v).copy()) for n, v in
            R.read_safetensors(os.path.join(d, "golden.safetensors")).items()}
    gj = json.load(open(os.path.join(d, "golden.json")))
    worst, route_ok, greedy_ok = 0.0, True, True
    with torch.no_grad():
        for j in range(len(gj["prompts"])):
            ids = gold[f"p{j}.ids"].long()[None]
            st = {}
            logits = m(ids, st)[0]
            r = rel_l2(logits, gold[f"p{j}.logits"])
            for name, v in st.items():
                key = f"p{j}.{name}"
                if key not in gold:
                    continue
                if name.endswith("router_idx"):
                    route_ok &= bool(torch.equal(v.reshape(gold[key].shape).long(), gold[key].long()))
                    continue
                worst = max(worst, rel_l2(v.reshape(gold[key].shape), gold[key]))
            print(f"  {os.path.basename(d)} prompt {j} (T={ids.shape[1]}): logits relL2 {r:.3e}")
            worst = max(worst, r)
        for g in gj["greedy"]:
            toks = list(g["prompt"])
            for _ in range(len(g["tokens"])):
                toks.append(int(m(torch.tensor([toks]))[0, -1].argmax()))
            greedy_ok &= toks[len(g["prompt"]):] == g["tokens"]
        dec = gj["decode"]
        full = list(dec["prompt"]) + list(dec["tokens"][:-1])
        lg = m(torch.tensor([full]))[0, len(dec["prompt"]) - 1:]
        rd = rel_l2(lg, gold["decode.logits"])
    print(f"  {os.path.basename(d)}: worst stage relL2 {worst:.3e}, routing equal {route_ok}, greedy equal "
          f"{greedy_ok}, decode logits relL2 {rd:.3e}")
    return worst, route_ok, greedy_ok, rd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", nargs="+", help="fixture dirs with golden.safetensors")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    args = ap.parse_args()
    bad = False
    for d in args.check or []:
        w, r, g, rd = check_fixture(d, getattr(torch, args.dtype))
        bad |= not (w < 1e-4 and r and g and rd < 1e-4)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
