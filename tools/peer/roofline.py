#!/usr/bin/env python3
"""The prefill roofline of sluice and llama.cpp on one K3 slice (tools/peer/peer_bench.sh, step 6).

    roofline.py --model DIR --bench peer-bench.json --probe probe.json --dot dot-peak.json

Prefill is compute-bound, so each engine's floor is the arithmetic of a PP-token pass divided by
the peak of the instructions its matrix products are built from, on the same core:

- sluice keeps activations in f32 (the exactness contract: a row's result is the f32 reference's,
  bit for bit), widening bf16 and MXFP4 weights to f32: every multiply-add is an f32 FMA, so its
  ceiling is the FMA peak (`sluice probe --kernels` measures it, and its kernels' T=256 rates).
- llama.cpp rounds activations to bf16 for bf16 weights (vdpbf16ps: 2 multiply-adds per f32 lane)
  and quantizes them to 8 bits (Q8_0) for MXFP4 weights (its repacked MXFP4 8x8 GEMM uses int8
  dot products: vpdpbusd on AVX-512 VNNI, 4 per f32 lane). That is what makes its greedy ids
  differ from the exact ones, and what raises its ceiling.

The FLOPs are the matrix products' (2 per weight per token, from the checkpoint's tensor shapes):
every 2-D non-expert weight for all PP rows, the routed experts for the top-k rows each, lm_head
for the last row only (both engines return one logits row), the embedding none. Attention's
score/value products and KDA's state updates are left out (under 1% at 256 tokens: stated with
the figure). Peaks come from tools/peer/dot_peak.c per on-CPU second (a core's rate, which a
shared machine does not depress) times the threads, so the bounds are an idle machine's; the
measured times come from a loaded one, so their share of a bound is a lower limit on how close
each engine runs to it, and the ratio of the two shares is the comparison that load cancels.
"""
import argparse
import json
import os
import statistics
import sys


def tensor_shapes(model):
    """{name: (dtype, shape)} over every safetensors shard of the checkpoint."""
    out = {}
    for name in sorted(os.listdir(model)):
        if name.endswith(".safetensors"):
            with open(os.path.join(model, name), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            for key, t in header.items():
                if key != "__metadata__":
                    out[key] = (t["dtype"], t["shape"])
    return out


def prefill_flops(model, pp):
    """(dense FLOPs, expert FLOPs, lm_head FLOPs) of a pp-token prefill that returns one row."""
    cfg = json.load(open(os.path.join(model, "config.json")))
    text = cfg.get("text_config", cfg)
    top_k = text.get("num_experts_per_token") or text["num_experts_per_tok"]
    dense = expert = head = 0
    per_layer_expert = {}  # layer prefix -> weights of one routed expert
    for name, (dtype, shape) in tensor_shapes(model).items():
        if len(shape) != 2 or "embed_tokens" in name:
            continue
        if ".experts." in name:
            if name.endswith(".weight_packed"):  # MXFP4: two weights per byte
                layer, rest = name.split(".experts.", 1)
                if rest.startswith("0."):
                    per_layer_expert[layer] = per_layer_expert.get(layer, 0) + shape[0] * shape[1] * 2
            elif name.endswith(".weight") and ".experts.0." in name:  # unquantized experts
                layer = name.split(".experts.", 1)[0]
                per_layer_expert[layer] = per_layer_expert.get(layer, 0) + shape[0] * shape[1]
            continue
        if "lm_head" in name:
            head += 2 * shape[0] * shape[1]
        else:
            dense += 2 * shape[0] * shape[1] * pp
    expert = sum(2 * w * top_k * pp for w in per_layer_expert.values())
    return dense, expert, head, top_k, len(per_layer_expert)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bench", required=True, help="peer_bench.py's JSON (prefill runs)")
    ap.add_argument("--probe", required=True, help="`sluice probe --kernels --json` output")
    ap.add_argument("--dot", required=True, help="tools/peer/dot_peak.c's JSON line")
    ap.add_argument("--out", help="JSON written")
    a = ap.parse_args()
    bench = json.load(open(a.bench))
    probe = json.load(open(a.probe))
    dot = json.load(open(a.dot))["kernels"]
    pp, threads = bench["pp"], bench["threads"]
    dense, expert, head, top_k, moe_layers = prefill_flops(a.model, pp)
    total = dense + expert + head

    def peak(*names):
        for n in names:
            if n in dot:  # FLOP/s: on-CPU GOP/s of one thread times the threads
                return dot[n]["oncpu_gops"] * threads * 1e9, n
        sys.exit(f"roofline: dot_peak measured none of {names}")

    fma, fma_k = peak("f32_fma_zmm", "f32_fma_ymm")
    bf16, bf16_k = peak("bf16_dot_zmm", "f32_fma_zmm", "f32_fma_ymm")  # no BF16: ggml widens
    int8, int8_k = peak("int8_vnni_zmm", "int8_vnni_ymm", "int8_maddubs_ymm")
    # sluice's kernels at T=256 (the prefill chunk), as a share of the FMA peak of the same run
    share = {}
    for k in probe.get("kernels", []):
        if k.get("rows") == 256 and k.get("ratio_to_fma_peak"):
            key = "mxfp4" if k["format"] == "mxfp4" and k.get("layout") in ("k3", "") else k["format"]
            share.setdefault(key, k["ratio_to_fma_peak"])
    if "bf16" not in share or "mxfp4" not in share:
        sys.exit(f"roofline: the probe has no T=256 bf16 and K3 MXFP4 rates ({sorted(share)})")
    s_roof = total / fma
    s_kernels = (dense + head) / (fma * share["bf16"]) + expert / (fma * share["mxfp4"])
    l_roof = (dense + head) / bf16 + expert / int8
    measured = {}
    for e in ("sluice", "llama.cpp"):
        t = [r["prefill_s"] for r in bench["runs_raw"] if r["part"] == "prefill" and r["engine"] == e]
        if not t:
            sys.exit(f"roofline: no prefill run of {e} in {a.bench}")
        measured[e] = statistics.median(t)
    res = {
        "pp": pp, "threads": threads, "top_k": top_k, "moe_layers": moe_layers,
        "gflop": {"dense_bf16": dense / 1e9, "experts_mxfp4": expert / 1e9, "lm_head": head / 1e9,
                  "total": total / 1e9},
        "peak_gops": {"f32_fma": fma / 1e9, "bf16_dot": bf16 / 1e9, "int8_dot": int8 / 1e9,
                      "kernels": [fma_k, bf16_k, int8_k], "per": f"{threads} cores, on-CPU"},
        "sluice_t256_share_of_fma": share,
        "bound_s": {"sluice_fma": s_roof, "sluice_kernels_t256": s_kernels, "llama_cpp": l_roof},
        "measured_s": measured,
    }
    ratio_roof = l_roof / s_roof
    ratio_meas = measured["llama.cpp"] / measured["sluice"]
    res["ratio"] = {"roofline": ratio_roof, "kernels_t256": l_roof / s_kernels,
                    "measured": ratio_meas}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    g = res["gflop"]
    print(f"\nPrefill pp{pp}: {g['total']:.1f} GFLOP of matrix products = {g['dense_bf16']:.1f} "
          f"bf16 (non-expert, {pp} rows) + {g['experts_mxfp4']:.1f} MXFP4 (top-{top_k} of the "
          f"routed experts, {moe_layers} MoE layers) + {g['lm_head']:.2f} lm_head (one row).\n")
    print(f"| engine | multiply-add it runs on ({threads} cores' peak, GFLOP/s) | bound, s | "
          "measured, s (median) | measured GFLOP/s | measured ÷ bound |")
    print("|---|---|---|---|---|---|")
    rate = {e: total / t / 1e9 for e, t in measured.items()}
    print(f"| sluice | f32 FMA for all ({fma_k}, {fma / 1e9:.0f}) | {s_roof:.2f} | "
          f"{measured['sluice']:.2f} | {rate['sluice']:.1f} | {measured['sluice'] / s_roof:.1f}× |")
    print(f"| sluice, its T=256 kernels | bf16 at {100 * share['bf16']:.0f}%, MXFP4 at "
          f"{100 * share['mxfp4']:.0f}% of the FMA peak (probe, same run) | {s_kernels:.2f} | "
          f"{measured['sluice']:.2f} | {rate['sluice']:.1f} | {measured['sluice'] / s_kernels:.1f}× |")
    print(f"| llama.cpp | bf16 dot for bf16 weights ({bf16_k}, {bf16 / 1e9:.0f}), int8 dot for "
          f"MXFP4 ({int8_k}, {int8 / 1e9:.0f}) | {l_roof:.2f} | {measured['llama.cpp']:.2f} | "
          f"{rate['llama.cpp']:.1f} | {measured['llama.cpp'] / l_roof:.1f}× |")
    print(f"\nsluice / llama.cpp prefill rate: at the two rooflines {ratio_roof:.2f}×; sluice at "
          f"its T=256 kernel rates against llama.cpp at its roofline {l_roof / s_kernels:.2f}×; "
          f"measured (medians) {ratio_meas:.2f}×.")


if __name__ == "__main__":
    main()
