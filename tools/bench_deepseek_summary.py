#!/usr/bin/env python3
"""Summarise tools/bench_deepseek.sh output as markdown: per slice, the tables of
tools/bench_stream_summary.py (decode s/pass, ratio to the storage bound, prefill bytes read /
distinct routed bytes, ...), then the full-model equivalent: decode s/pass per MoE layer of the
cold default runs times the full model's MoE layers, next to the full model's storage bound
(8 routed experts per MoE layer read with nothing cached, at the bandwidth probed in the same
run)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_stream_summary  # noqa: E402

# (name, MoE layers, routed experts per token, bytes of one routed expert as published)
FULL = {
    # DeepSeek V3/R1 671B: 61 layers, 3 dense + 58 MoE; FP8 experts 3 x 2048 x 7168 codes plus
    # 3 x 16 x 56 f32 block scales.
    "deepseek-v3-slice": ("DeepSeek V3 671B (FP8)", 58, 8, 3 * 2048 * 7168 + 3 * 16 * 56 * 4),
    # Kimi K2 Thinking 1T: 61 layers, 1 dense + 60 MoE; INT4 experts 3 x 2048 x 7168 nibbles
    # plus 3 x 2048 x 7168 / 32 bf16 scales.
    "kimi-k2-slice": ("Kimi K2 Thinking (INT4)", 60, 8, 3 * 2048 * 7168 // 2 + 3 * 2048 * 224 * 2),
}


def median(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main(out):
    for preset in sorted(os.listdir(out)):
        res = os.path.join(out, preset)
        if preset not in FULL or not os.path.isdir(res):
            continue
        setup = open(os.path.join(res, "setup.txt")).read().strip()
        print(f"## {preset}\n\n{setup}\n")
        bench_stream_summary.main(res)
        name, layers, k, expert = FULL[preset]
        for part in ("decode-cold", "decode-warm"):
            p = os.path.join(res, part + ".json")
            if not os.path.exists(p):
                continue
            v = json.load(open(p))
            gbps = v["storage_gbps"]
            runs = [r for r in v["runs"] if r["config"] == "default"]
            per_layer = median([r.get("s_per_pass_per_moe_layer") for r in runs])
            compute = median([r.get("decode_compute_s_per_pass") for r in runs])
            moe = runs[0]["moe_layers"] if runs else 0
            bound = layers * k * expert / (gbps * 1e9)
            if per_layer is None:
                continue
            full = per_layer * layers
            comp = f"; compute {compute / moe * layers:.2f} s of it" if compute and moe else ""
            print(f"{part}: full-model equivalent for {name}: {full:.2f} s/token "
                  f"({per_layer:.3f} s per MoE layer x {layers}{comp}); storage bound "
                  f"{bound:.2f} s/token ({layers} x {k} x {expert / 1e6:.1f} MB at "
                  f"{gbps:.2f} GB/s); ratio {full / bound:.2f}\n")


if __name__ == "__main__":
    main(sys.argv[1])
