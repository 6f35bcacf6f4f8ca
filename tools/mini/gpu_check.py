#!/usr/bin/env python3
"""Checks on the GPU machine before training (issue 17): fla's chunk_kda, called with the release's flags,
computes the same KDA as the plain recurrence of K3.md 2.2 (up to TF32 rounding: fla's triton kernels use TF32
dots for fp32, measured relL2 1.5e-3 on one layer and 1.4e-3..4.2e-3 on the fixtures' logits), and the whole PyTorch mini-K3 with fla and grouped
expert GEMMs reproduces the tiny fixtures' mlx goldens. Exits non-zero when either disagrees."""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bad = False
    # 1. one KDA layer: fla vs recurrence, float32, T not a multiple of the chunk size.
    c = {"hidden_size": 128, "rms_norm_eps": 1e-5,
         "linear_attn_config": {"num_heads": 4, "head_dim": 64, "gate_lower_bound": -5.0, "short_conv_kernel_size": 4}}
    k = M.KDA(c).to(dev)
    with torch.no_grad():
        for n, p in k.named_parameters():
            p.normal_(0, 0.1)
        k.A_log[4:] = 0
        k.dt_bias.uniform_(-4, 1)
    x = torch.randn(2, 200, 128, device=dev)
    with torch.no_grad():
        k.use_fla = False
        a = k(x)
        k.use_fla = True
        b = k(x)
    r = M.rel_l2(b, a)
    print(f"KDA fla chunk_kda vs recurrence (fp32, T=200): relL2 {r:.3e}")
    bad |= r > 1e-2
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        b16 = k(x)
    r = M.rel_l2(b16.float(), a)
    print(f"KDA fla under bf16 autocast vs fp32 recurrence: relL2 {r:.3e}")
    bad |= r > 3e-2
    # 2. whole model on the fixtures, fla + grouped GEMMs, float32.
    for fx in ("tiny-a", "tiny-b"):
        d = os.path.join(HERE, "..", "..", "tests", "fixtures", "kimi_k3", fx)
        m, _ = M.load_checkpoint_dir(d, torch.float32)
        m.to(dev)
        m.set_fla(True)
        import k3_numpy_ref as R
        gold = {n: torch.from_numpy(R.to_array(*v).copy()) for n, v in
                R.read_safetensors(os.path.join(d, "golden.safetensors")).items()}
        with torch.no_grad():
            for j in range(3):
                ids = gold[f"p{j}.ids"].long()[None].to(dev)
                r = M.rel_l2(m(ids)[0].cpu(), gold[f"p{j}.logits"])
                print(f"{fx} prompt {j} on CUDA with fla: logits relL2 {r:.3e}")
                bad |= r > 1e-2
    print("GPU CHECK", "FAILED" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
