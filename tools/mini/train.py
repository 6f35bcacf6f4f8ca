#!/usr/bin/env python3
"""Trains mini-K3 on the tokenized corpus (issue 17, item 4), seeded, then evaluates and exports it.

    python3 tools/mini/train.py --data DIR --out DIR [--steps N | --minutes M] [--seed 17]

DIR holds train.u16 / heldout.u16 (tools/mini/tokenizer.py) and optionally tiktoken.model +
tokenizer_config.json (copied into the export). On CUDA the KDA layers use `fla.ops.kda.chunk_kda` (with the
release's flags) and the whole step runs under bf16 autocast with fp32 master weights; on CPU the plain
recurrence runs (for tiny smoke tests only).

Training: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 10%,
gradient clipping 1.0, random windows of --seq tokens drawn by a seeded generator. Routers balance loads the
way K3's `noaux_tc` routers are trained: no auxiliary loss; after every step each layer's
`e_score_correction_bias` moves by `--bias-rate` toward under-used experts (the sign of mean load minus load).
The last `--qat-frac` of the steps fake-quantises the routed experts to MXFP4 with a straight-through gradient,
so the exported MXFP4 checkpoint is the model that was trained.

Evaluation: held-out perplexity over non-overlapping --seq windows (bf16 autocast), for the bf16-expert model
and for the MXFP4 checkpoint as exported (loaded back from the written files). Results go to
OUT/metrics.json; the checkpoint to OUT/ckpt (tools/mini/export.py).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export as X  # noqa: E402
import model as M  # noqa: E402


def init_weights(m, seed):
    g = torch.Generator().manual_seed(seed)
    c = m.c
    L = c["num_hidden_layers"]
    out_std = 0.02 / math.sqrt(2 * L)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("layernorm.weight", "norm.weight")) and p.dim() == 1:
                p.fill_(1.0)
            elif n.endswith("res.proj.weight"):
                p.zero_()                                 # AttnRes pseudo-queries start at uniform depth mixing
            elif n.endswith("_conv1d.weight"):
                p.uniform_(-0.5, 0.5, generator=g)
            elif n.endswith("A_log"):
                H = m.layers[0].self_attn.H if m.layers[0].is_kda else c["linear_attn_config"]["num_heads"]
                p.zero_()
                p[:H] = torch.log(torch.empty(H).uniform_(1.0, 4.0, generator=g))  # per head; padding stays 0
            elif n.endswith("dt_bias"):
                p.uniform_(-6.0, -1.0, generator=g)       # slow decays at the start: -5*sigmoid(a*(z+dt))
            elif n.endswith(("o_proj.weight", "down_proj.weight", "up_proj.weight")) and "experts" not in n \
                    and "routed_expert_up" not in n and "mlp.up" not in n:
                p.normal_(0, out_std, generator=g)
            elif n.endswith(".w2") or n.endswith("routed_expert_up_proj.weight"):
                p.normal_(0, out_std, generator=g)
            else:
                p.normal_(0, 0.02, generator=g)
        for n, b in m.named_buffers():
            b.zero_()


def batches(data, seq, bsz, seed):
    rng = np.random.default_rng(seed)
    n = len(data) - seq - 1
    while True:
        starts = rng.integers(0, n, size=bsz)
        x = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(x)


@torch.no_grad()
def evaluate(m, data, seq, bsz, dev, max_tokens=None):
    """Mean next-token NLL over non-overlapping windows, whole batches of `bsz` only (the training shape, so
    the GPU kernels tuned for training are reused)."""
    m.eval()
    nwin = (len(data) - 1) // seq
    nwin = max(bsz, nwin // bsz * bsz) if nwin >= bsz else nwin
    if max_tokens:
        nwin = min(nwin, max_tokens // seq)
    tot, cnt = 0.0, 0
    for b in range(0, nwin, bsz):
        w = range(b, min(nwin, b + bsz))
        x = torch.from_numpy(np.stack([data[i * seq:i * seq + seq + 1] for i in w]).astype(np.int64)).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = m(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(loss)
        cnt += x[:, 1:].numel()
    m.train()
    return tot / cnt, cnt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--train-s", type=float, default=0, help="choose the total steps at step 45 so that training "
                    "takes about this many seconds (printed, so a re-run can use --steps)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--bsz", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--qat-from", type=int, default=-1, help="first MXFP4-aware step (overrides --qat-frac; a run "
                    "whose deadline guard moved it is re-run exactly with the step it printed)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--eval-tokens", type=int, default=0, help="cap on held-out tokens evaluated (0: all)")
    ap.add_argument("--config", help="JSON overriding export.MINI (smoke tests)")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--bench", type=int, default=0, help="time this many steps after 5 warm-up steps, print tok/s, exit")
    ap.add_argument("--deadline-s", type=float, default=0, help="stop training early past this many seconds "
                    "(a guard for a time-limited machine; the run is then no longer reproducible from --steps)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = np.fromfile(os.path.join(args.data, "train.u16"), dtype="<u2")
    held = np.fromfile(os.path.join(args.data, "heldout.u16"), dtype="<u2")
    n_ranks = int(json.load(open(os.path.join(args.data, "tok_manifest.json")))["ranks"]) \
        if os.path.exists(os.path.join(args.data, "tok_manifest.json")) else int(train.max()) - 255 + 0
    cfg = dict(X.MINI, **(json.loads(args.config) if args.config else {}))
    _, tc = X.mini_config(n_ranks, cfg)
    tc = {k: v for k, v in tc.items() if k != "quantization_config"}
    m = M.MiniK3(tc)
    init_weights(m, args.seed)
    m.to(dev)
    m.set_fla(dev.type == "cuda")
    nparams = sum(p.numel() for p in m.parameters())
    print(f"params {nparams / 1e6:.2f} M, train tokens {len(train)}, heldout {len(held)}", flush=True)

    decay = [p for n, p in m.named_parameters() if p.dim() >= 2 and "res.proj" not in n and "conv1d" not in n]
    nodecay = [p for n, p in m.named_parameters() if not (p.dim() >= 2 and "res.proj" not in n
                                                          and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    steps = args.steps if not args.bench else args.bench + 5
    qat_from = int(steps * (1 - args.qat_frac)) if args.qat_frac > 0 else steps + 1
    # Warm-up, then cosine from the end of the warm-up: the first --warmup steps do not depend on the total, so a
    # run whose total was chosen by --train-s is re-run exactly with --steps set to the total it printed.
    def sched(s):
        if s < args.warmup:
            return (s + 1) / args.warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - args.warmup) / max(1, steps - args.warmup))))
    if args.qat_from >= 0:
        qat_from = args.qat_from
    moes = [L.block_sparse_moe for L in m.layers if L.is_moe]
    it = batches(train, args.seq, args.bsz, args.seed)
    log = []
    t0 = time.time()
    if args.train_s:
        steps = 10 ** 9                       # fixed at step 45 from the measured rate
        qat_from = steps + 1 if args.qat_from < 0 else args.qat_from
    step = 0
    while step < steps:
        if args.train_s and step == 25:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            t25 = time.time()
        if args.train_s and step == 45:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            per = (time.time() - t25) / 20
            steps = max(args.warmup + 10, int(45 + (args.train_s - (time.time() - t0)) / per) // 10 * 10)
            if args.qat_from < 0:
                qat_from = int(steps * (1 - args.qat_frac)) if args.qat_frac > 0 else steps + 1
            print(f"TOTAL STEPS {steps} ({per * 1e3:.1f} ms/step; re-run with --steps {steps})", flush=True)
        if args.bench and step == 5:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            tb = time.time()
        if args.deadline_s and args.qat_from < 0 and step < qat_from and time.time() - t0 > args.deadline_s * (1 - args.qat_frac):
            qat_from = step
            print(f"deadline: QAT from step {step}", flush=True)
        if args.deadline_s and time.time() - t0 > args.deadline_s:
            print(f"deadline: stopped after {step} of {steps} steps", flush=True)
            steps = step
            break
        if step == qat_from:
            m.set_fake_quant(True)
            print(f"step {step}: MXFP4 fake quantisation of the routed experts on", flush=True)
        for gp in opt.param_groups:
            gp["lr"] = args.lr * sched(step)
        x = next(it).to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = m(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        with torch.no_grad():                 # noaux_tc load balancing of the selection-only bias
            for moe in moes:
                cnt = moe.last_counts.float()
                moe.gate.e_score_correction_bias += args.bias_rate * torch.sign(cnt.mean() - cnt)
        if step % args.log_every == 0 or step == steps - 1:
            lv = float(loss.detach())
            imb = max(float(moe.last_counts.max()) / float(moe.last_counts.float().mean()) for moe in moes)
            el = time.time() - t0
            log.append({"step": step, "loss": lv, "grad_norm": float(gn), "max_load_over_mean": imb, "s": el})
            print(f"step {step} loss {lv:.4f} gn {float(gn):.2f} maxload/mean {imb:.2f} "
                  f"{(step + 1) * args.bsz * args.seq / max(el, 1e-9) / 1e3:.0f} ktok/s {el:.0f}s", flush=True)
        step += 1
    train_s = time.time() - t0
    if args.bench:
        torch.cuda.synchronize() if dev.type == "cuda" else None
        rate = args.bench * args.bsz * args.seq / (time.time() - tb)
        print(f"BENCH tok/s {rate:.0f} step_s {(time.time() - tb) / args.bench:.4f}", flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    res = {"seed": args.seed, "steps": steps, "seq": args.seq, "bsz": args.bsz, "tokens_seen": steps * args.bsz *
           args.seq, "train_seconds": train_s, "params": nparams, "config": cfg, "log": log}
    m.set_fake_quant(False)
    nll, n = evaluate(m, held, args.seq, args.bsz, dev, args.eval_tokens or None)
    res["heldout_bf16"] = {"nll": nll, "ppl": math.exp(nll), "tokens": n}
    print(f"held-out bf16 experts: nll {nll:.4f} ppl {math.exp(nll):.2f} over {n} tokens", flush=True)
    m.set_fake_quant(True)
    nll, n = evaluate(m, held, args.seq, args.bsz, dev, args.eval_tokens or None)
    res["heldout_fakequant"] = {"nll": nll, "ppl": math.exp(nll), "tokens": n}
    print(f"held-out fake-MXFP4 experts: nll {nll:.4f} ppl {math.exp(nll):.2f}", flush=True)
    m.set_fake_quant(False)
    if not args.no_export:
        ck = os.path.join(args.out, "ckpt")
        files = X.export(m.float().cpu(), args.data, ck, seed=args.seed)
        m2, _ = M.load_checkpoint_dir(ck, torch.float32)
        m2.to(dev)
        m2.set_fla(dev.type == "cuda")
        nll, n = evaluate(m2, held, args.seq, args.bsz, dev, args.eval_tokens or None)
        res["heldout_mxfp4_export"] = {"nll": nll, "ppl": math.exp(nll), "tokens": n}
        res["files"] = {os.path.basename(f): os.path.getsize(f) for f in files}
        print(f"held-out MXFP4 checkpoint as exported: nll {nll:.4f} ppl {math.exp(nll):.2f}; files {res['files']}",
              flush=True)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
