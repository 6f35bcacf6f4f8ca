#!/usr/bin/env python3
"""Golden-vector generator for sluice's Qwen3-MoE implementation (`Qwen3MoeForCausalLM`).

For each tiny configuration (see CONFIGS) this script

1. trains the small Qwen3-shaped byte-level BPE tokenizer of tools/gen_qwen3_goldens.py and saves
   `tokenizer.json` + `tokenizer_config.json`;
2. draws seeded random bf16 weights and writes them itself in the PUBLISHED layout of Qwen3-30B-A3B /
   235B-A22B: one bf16 tensor per expert and projection (`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`),
   the router `model.layers.L.mlp.gate.weight`, dense layers (`mlp_only_layers`, `decoder_sparse_step`) with
   `mlp.{gate,up,down}_proj.weight`, split over two safetensors shards with a `model.safetensors.index.json`, and a
   `config.json` with the keys of the published files (`num_experts`, `num_experts_per_tok`, `norm_topk_prob`,
   `decoder_sparse_step`, `mlp_only_layers`, `moe_intermediate_size`, `rope_theta`, ...). transformers does not write
   this file set: 5.x merges experts into `gate_up_proj` tensors when it loads, which is why the files come from here;
3. loads that directory with `Qwen3MoeForCausalLM.from_pretrained(dir, dtype=float32, attn_implementation="eager")`
   on CPU, checks that every merged parameter equals the stored bf16 tensors, and records per-stage f32 tensors
   through forward hooks on HF's own modules (embedding, each layer's input_layernorm / self_attn /
   post_attention_layernorm / mlp / layer output, the final norm, logits), and for each MoE layer the router's
   logits, top-k expert ids and weights; a prefill-then-decode run through a `DynamicCache`; greedy generations;
4. cross-checks the logits against an independent float64 numpy forward over the stored tensors (published names)
   and against HF's `sdpa` attention.

A draw is rejected (next seed) when a greedy or decode step has a top-1/top-2 logit margin below MIN_MARGIN, when any
router call (every prompt, decode and greedy step) has a gap below MIN_ROUTER_GAP between the router logits of its
k-th and (k+1)-th expert (f32 noise could then change the routing), or when a greedy run has fewer than MIN_DISTINCT
distinct tokens.

Usage (needs torch; see tools/requirements-qwen3-moe.txt):
    python3 tools/gen_qwen3_moe_goldens.py --out tests/fixtures/qwen3_moe
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_qwen3_goldens as q3  # noqa: E402  (the Qwen3-shaped tokenizer)
import golden_common as gc  # noqa: E402  (prompts, shards, stage capture, greedy loops, golden files)

CONFIGS = {
    # Untied lm_head; layer 0 dense through mlp_only_layers, layers 1-2 MoE (8 experts, top-2, renormalised);
    # GQA 4 heads over 2 KV heads; Qwen3's rope_theta 1e6.
    "tiny-a": dict(seed=5001, bpe_vocab=480, vocab=512, hidden=64, inter=128, moe_inter=32, layers=3, heads=4,
                   kv_heads=2, head_dim=16, experts=8, top_k=2, norm_topk=True, sparse_step=1, mlp_only=[0],
                   tie=False, theta=1_000_000.0, eps=1e-6, max_pos=512, embed_std=0.5, gain=1.5, router_gain=3.0),
    # Tied embeddings; decoder_sparse_step 2 makes layers 1 and 3 MoE and 0, 2 dense; 6 experts, top-3 without
    # renormalisation; head_dim 32 != 48 / 6, groups of 3; rope_theta 1e4, eps 1e-5; a padded vocabulary.
    "tiny-b": dict(seed=6002, bpe_vocab=700, vocab=768, hidden=48, inter=96, moe_inter=24, layers=4, heads=6,
                   kv_heads=2, head_dim=32, experts=6, top_k=3, norm_topk=False, sparse_step=2, mlp_only=[],
                   tie=True, theta=10_000.0, eps=1e-5, max_pos=256, embed_std=0.1, gain=2.0, router_gain=3.0),
}

MIN_ROUTER_GAP = 1e-3
MAX_ATTEMPTS = 30


def is_moe(c, i):
    """Qwen3MoeDecoderLayer.__init__: MoE unless listed in mlp_only_layers or skipped by decoder_sparse_step."""
    return i not in c["mlp_only"] and c["experts"] > 0 and (i + 1) % c["sparse_step"] == 0


def published_config(c, tok):
    """config.json with the keys of the published Qwen3-MoE checkpoints (transformers 4.51 form)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": tok.token_to_id("<|endoftext|>"), "decoder_sparse_step": c["sparse_step"],
        "eos_token_id": tok.token_to_id("<|im_end|>"), "head_dim": c["head_dim"], "hidden_act": "silu",
        "hidden_size": c["hidden"], "initializer_range": 0.02, "intermediate_size": c["inter"],
        "max_position_embeddings": c["max_pos"], "max_window_layers": c["layers"], "mlp_only_layers": c["mlp_only"],
        "model_type": "qwen3_moe", "moe_intermediate_size": c["moe_inter"], "norm_topk_prob": c["norm_topk"],
        "num_attention_heads": c["heads"], "num_experts": c["experts"], "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": c["layers"], "num_key_value_heads": c["kv_heads"], "output_router_logits": False,
        "rms_norm_eps": c["eps"], "rope_scaling": None, "rope_theta": c["theta"], "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": c["tie"], "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": c["vocab"],
    }


def draw_weights(c, seed):
    """Seeded bf16 tensors under their published names, in state-dict order (torch bf16 tensors).

    Norm weights 1 + N(0, 0.25^2); embedding rows N(0, embed_std^2); projections and experts N(0, gain^2 / fan_in);
    routers N(0, router_gain^2 / d) so that routing is decisive (a near-uniform router would put ties everywhere).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    d, hd, q, kv = c["hidden"], c["head_dim"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    w = {}

    def norm(name, n):
        w[name] = (1.0 + 0.25 * torch.randn(n, generator=g)).to(torch.bfloat16)

    def mat(name, rows, cols, gain):
        w[name] = (torch.randn(rows, cols, generator=g) * (gain / math.sqrt(cols))).to(torch.bfloat16)

    w["model.embed_tokens.weight"] = (torch.randn(c["vocab"], d, generator=g) * c["embed_std"]).to(torch.bfloat16)
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", d)
        mat(p + "self_attn.q_proj.weight", q, d, c["gain"])
        mat(p + "self_attn.k_proj.weight", kv, d, c["gain"])
        mat(p + "self_attn.v_proj.weight", kv, d, c["gain"])
        mat(p + "self_attn.o_proj.weight", d, q, c["gain"])
        norm(p + "self_attn.q_norm.weight", hd)
        norm(p + "self_attn.k_norm.weight", hd)
        norm(p + "post_attention_layernorm.weight", d)
        if is_moe(c, i):
            mat(p + "mlp.gate.weight", c["experts"], d, c["router_gain"])
            for e in range(c["experts"]):
                mat(p + f"mlp.experts.{e}.gate_proj.weight", c["moe_inter"], d, c["gain"])
                mat(p + f"mlp.experts.{e}.up_proj.weight", c["moe_inter"], d, c["gain"])
                mat(p + f"mlp.experts.{e}.down_proj.weight", d, c["moe_inter"], c["gain"])
        else:
            mat(p + "mlp.gate_proj.weight", c["inter"], d, c["gain"])
            mat(p + "mlp.up_proj.weight", c["inter"], d, c["gain"])
            mat(p + "mlp.down_proj.weight", d, c["inter"], c["gain"])
    norm("model.norm.weight", d)
    if not c["tie"]:
        mat("lm_head.weight", c["vocab"], d, 1.0)
    return w


def check_loaded_equals_stored(ref, w, c):
    """Every HF parameter equals the stored bf16 tensors (experts merged as transformers merges them)."""
    import torch

    sd = ref.state_dict()
    f = {k: v.to(torch.float32) for k, v in w.items()}
    seen = set()
    for i in range(c["layers"]):
        p = f"model.layers.{i}.mlp."
        if not is_moe(c, i):
            continue
        gu = torch.stack([torch.cat([f[p + f"experts.{e}.gate_proj.weight"], f[p + f"experts.{e}.up_proj.weight"]])
                          for e in range(c["experts"])])
        dn = torch.stack([f[p + f"experts.{e}.down_proj.weight"] for e in range(c["experts"])])
        assert torch.equal(sd[p + "experts.gate_up_proj"], gu), f"layer {i}: merged gate_up_proj differs"
        assert torch.equal(sd[p + "experts.down_proj"], dn), f"layer {i}: merged down_proj differs"
        seen |= {p + "experts.gate_up_proj", p + "experts.down_proj"}
    for k, v in f.items():
        if ".experts." in k:
            continue
        assert torch.equal(sd[k], v), f"{k}: loaded f32 differs from the stored bf16"
        seen.add(k)
    if c["tie"]:
        assert torch.equal(sd["lm_head.weight"], f["model.embed_tokens.weight"]), "tied lm_head differs"
        seen.add("lm_head.weight")
    missing = set(sd) - seen
    assert not missing, f"parameters not checked: {sorted(missing)}"


class RouterWatch:
    """Forward hooks on every Qwen3MoeTopKRouter: the smallest k-th vs (k+1)-th router-logit gap of any call, and
    (while `record` is set) each call's logits, top-k ids and weights per layer."""

    def __init__(self, ref, c):
        self.c, self.min_gap, self.record, self.calls, self.hooks = c, math.inf, False, {}, []
        for i, layer in enumerate(ref.model.layers):
            if is_moe(c, i):
                self.hooks.append(layer.mlp.gate.register_forward_hook(self.hook(i)))

    def hook(self, i):
        def f(_mod, _args, out):
            logits, weights, ids = (o.detach().to("cpu") for o in out)
            s = np.sort(logits.double().numpy(), axis=-1)[:, ::-1]
            k = self.c["top_k"]
            self.min_gap = min(self.min_gap, float((s[:, k - 1] - s[:, k]).min()))
            if self.record:
                self.calls[i] = (logits.float().numpy().copy(), ids.numpy().astype(np.int32),
                                 weights.float().numpy().copy())
        return f

    def remove(self):
        for h in self.hooks:
            h.remove()


def numpy_f64_logits(w, c, ids):
    """Independent float64 Qwen3-MoE forward over the stored tensors (published names), no HF code: the Qwen3 decoder
    of tools/gen_qwen3_goldens.py with the sparse block on MoE layers."""
    p = {k: v.float().numpy().astype(np.float64) for k, v in w.items()}
    dims = dict(head_dim=c["head_dim"], heads=c["heads"], kv_heads=c["kv_heads"], eps=c["eps"], theta=c["theta"],
                layers=c["layers"], tie=c["tie"])

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def mlp(i, x):
        L = f"model.layers.{i}."
        if not is_moe(c, i):
            a = silu(x @ p[L + "mlp.gate_proj.weight"].T) * (x @ p[L + "mlp.up_proj.weight"].T)
            return a @ p[L + "mlp.down_proj.weight"].T
        logits = x @ p[L + "mlp.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for r in range(len(ids)):
            top = np.argsort(-probs[r], kind="stable")[:c["top_k"]]
            wts = probs[r, top] / (probs[r, top].sum() if c["norm_topk"] else 1.0)
            for e, wt in zip(top, wts):
                E = L + f"mlp.experts.{e}."
                a = silu(x[r] @ p[E + "gate_proj.weight"].T) * (x[r] @ p[E + "up_proj.weight"].T)
                out[r] += wt * (a @ p[E + "down_proj.weight"].T)
        return out

    return q3.qwen_f64_logits(p, dims, ids, mlp)


def attempt(c, seed, tok, out_dir):
    """Writes the checkpoint for `seed`, runs the reference; returns (ok, reasons, results)."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    w = draw_weights(c, seed)
    gc.clear_model_files(out_dir)
    gc.write_sharded(w, out_dir)
    gc.write_config(out_dir, published_config(c, tok))

    ref = Qwen3MoeForCausalLM.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32).eval()
    check_loaded_equals_stored(ref, w, c)
    watch = RouterWatch(ref, c)
    try:
        prompts = gc.prompts_of(lambda s: tok.encode(s).ids)
        stages = [gc.capture_stages(ref, p, watch) for p in prompts]
        gc.check_hooks_kept_logits(ref, prompts, stages)
        decode = gc.decode_run(ref, tok.encode(gc.DECODE_TEXT).ids[:gc.DECODE_PROMPT_LEN])
        greedy = gc.greedy_runs(ref, prompts)
        router_gap = watch.min_gap
    finally:
        watch.remove()

    sdpa = Qwen3MoeForCausalLM.from_pretrained(out_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
    sdpa_diff = gc.sdpa_diffs(sdpa, prompts, stages)
    f64 = [gc.rel_l2(st["logits"], numpy_f64_logits(w, c, p)) for p, st in zip(prompts, stages)]
    reasons = gc.draw_reasons(decode, greedy, router_gap=router_gap, min_router_gap=MIN_ROUTER_GAP)
    res = {"seed": seed, "rope": gc.rope_tables(ref), "prompts": prompts, "stages": stages, "decode": decode,
           "greedy": greedy, "sdpa_max_abs_diff": sdpa_diff, "numpy_f64_logits_rel_l2": f64,
           "router_min_gap": router_gap, "vocab_tok": tok.get_vocab_size(with_added_tokens=True)}
    return not reasons, reasons, res


def versions():
    return gc.versions("tools/requirements-qwen3-moe.txt pins these")


def generate(name, c, root):
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    tok = q3.build_tokenizer(c["bpe_vocab"])
    q3.write_tokenizer(tok, out_dir)
    import gen_family_chat_goldens  # the published chat template, where Qwen3 MoE checkpoints keep it

    gen_family_chat_goldens.install_chat_template(out_dir, "qwen3_moe")
    gc.set_threads()
    r = gc.search(name, c["seed"], MAX_ATTEMPTS, lambda seed: attempt(c, seed, tok, out_dir))

    moe_layers = [i for i in range(c["layers"]) if is_moe(c, i)]
    per_prompt, routing = gc.stage_lists(c["layers"], moe_layers)
    gc.save_goldens(out_dir, gc.golden_tensors(r["prompts"], r["stages"], r["decode"], r["rope"],
                                               per_prompt + routing))
    d = r["decode"]
    gj = {
        "config_name": name,
        "seed": r["seed"],
        "generator": "tools/gen_qwen3_moe_goldens.py",
        "reference": "transformers Qwen3MoeForCausalLM on CPU, loaded with from_pretrained(dtype=float32, "
                     "attn_implementation='eager') from the bf16 checkpoint: an f32 computation of bf16 weights",
        "versions": versions(),
        "config": gc.read_config(out_dir),
        "moe_layers": moe_layers,
        "tokenizer_vocab_size": r["vocab_tok"],
        "prompts": r["prompts"],
        "prompt_texts": gc.PROMPT_TEXTS,
        "stage_template": gc.stage_template(per_prompt + routing),
        "stage_notes": {
            "mlp_out": "mlp output [T,d] (the sparse MoE block on MoE layers, Qwen3MoeMLP on dense ones)",
            "router_logits": "Qwen3MoeTopKRouter logits [T,E] (MoE layers only)",
            "topk_ids": "router top-k expert ids [T,k], I32, in torch.topk order (probability descending)",
            "topk_weights": "router top-k weights [T,k], renormalised when norm_topk_prob",
        },
        "decode": gc.decode_json(d),
        "greedy": r["greedy"],
        "checks": {"sdpa_vs_eager_logits_max_abs": r["sdpa_max_abs_diff"],
                   "numpy_f64_vs_hf_logits_rel_l2": r["numpy_f64_logits_rel_l2"],
                   "router_min_topk_gap": r["router_min_gap"]},
    }
    gc.write_json(os.path.join(out_dir, "golden.json"), gj)
    print(f"[{name}] seed {r['seed']}; decode vs full recompute max abs {d['full_recompute_max_abs_diff']:.3e}; "
          f"sdpa vs eager {max(r['sdpa_max_abs_diff']):.3e}; numpy f64 logits relL2 "
          f"{max(r['numpy_f64_logits_rel_l2']):.3e}; router gap {r['router_min_gap']:.3e}; min margin "
          f"{gc.min_margin_of(r):.3e}")
    gc.check_f64(name, r["numpy_f64_logits_rel_l2"])


def main():
    args, names = gc.cli("Generate tiny Qwen3-MoE checkpoints and HF transformers goldens.",
                         "tests/fixtures/qwen3_moe", CONFIGS, versions())
    for name in names:
        generate(name, CONFIGS[name], args.out)

if __name__ == "__main__":
    main()
