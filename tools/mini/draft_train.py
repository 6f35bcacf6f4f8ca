#!/usr/bin/env python3
"""Trains mini-draft, the built-in model's draft (issue 17, item 4), seeded, then evaluates and exports it.

    python3 tools/mini/draft_train.py --data DIR --out DIR [--steps N | --train-s S] [--seed 17]

mini-draft is a `Qwen3ForCausalLM` (transformers' own module, so the export is the published layout by
construction) trained on the corpus mini-K3 was trained on, tokenized with its own tokenizer
(tools/mini/draft_tokenizer.py: DIR holds train.u16 / heldout.u16 / tokenizer.json / tokenizer_config.json /
draft_manifest.json). It exists to draft for mini-K3 through the cross-tokenizer path, so it is sized to cost
much less per token than mini-K3 (about 10.8 M active parameters): `DRAFT` below, ~2.5 M parameters, 5 MB in
bf16.

Training: as tools/mini/train.py (AdamW betas 0.9/0.95, weight decay 0.1 on matrices, linear warm-up then cosine
to 10%, clipping 1.0, bf16 autocast over fp32 master weights on CUDA, random windows from a seeded generator).
With --train-s the total step count is fixed at step 45 from the measured rate and printed, so a re-run uses
--steps. Evaluation: held-out NLL over non-overlapping windows, per token and per byte (the token's UTF-8 bytes;
added tokens count 0 bytes), for the fp32 master weights and for the bf16 checkpoint as exported (loaded back,
evaluated in fp32). Results go to OUT/metrics.json, the checkpoint to OUT/ckpt.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# hidden 192, 4 layers, 3 query heads of 64 over one KV head, SwiGLU 576 wide, tied embeddings.
DRAFT = dict(hidden=192, layers=4, heads=3, kv_heads=1, head_dim=64, inter=576, theta=1_000_000.0, eps=1e-6,
             max_pos=4096, tie=True)
VOCAB_PAD = 64  # the model's vocabulary is the tokenizer's rounded up, as in the real Qwen3


def make_config(c, man):
    from transformers import Qwen3Config
    vocab = -(-man["vocab_with_added"] // VOCAB_PAD) * VOCAB_PAD
    eot = man["eot"]
    return Qwen3Config(vocab_size=vocab, hidden_size=c["hidden"], intermediate_size=c["inter"],
                       num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                       num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"], hidden_act="silu",
                       max_position_embeddings=c["max_pos"], rms_norm_eps=c["eps"], tie_word_embeddings=c["tie"],
                       attention_bias=False, use_sliding_window=False, bos_token_id=eot,
                       eos_token_id=eot + 2, pad_token_id=eot,
                       rope_parameters={"rope_type": "default", "rope_theta": c["theta"]})


def init_weights(m, seed, layers):
    g = torch.Generator().manual_seed(seed)
    out_std = 0.02 / math.sqrt(2 * layers)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.fill_(1.0)
            elif n.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * out_std)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def batches(data, seq, bsz, seed):
    rng = np.random.default_rng(seed)
    n = len(data) - seq - 1
    while True:
        starts = rng.integers(0, n, size=bsz)
        yield torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(m, data, tbytes, seq, bsz, dev, autocast, max_tokens=0):
    """(nll per token, nll per byte, tokens, bytes) over all whole non-overlapping windows of the split."""
    m.eval()
    nwin = (len(data) - 1) // seq
    if max_tokens:
        nwin = min(nwin, max(1, max_tokens // seq))
    tot, cnt, nb = 0.0, 0, 0
    for b in range(0, nwin, bsz):
        w = range(b, min(nwin, b + bsz))
        x = torch.from_numpy(np.stack([data[i * seq:i * seq + seq + 1] for i in w]).astype(np.int64)).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast and dev.type == "cuda"):
            logits = m(input_ids=x[:, :-1]).logits
        tot += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                     reduction="sum"))
        cnt += x[:, 1:].numel()
        nb += int(tbytes[x[:, 1:].cpu().numpy()].sum())
    m.train()
    return tot / cnt, tot / nb, cnt, nb


def token_bytes(tok_json, n):
    """UTF-8 bytes per id (byte-level pieces: one char per byte; added tokens and padding: 0)."""
    model = json.load(open(tok_json))["model"]["vocab"]
    out = np.zeros(n, dtype=np.int64)
    for piece, i in model.items():
        out[i] = len(piece)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--train-s", type=float, default=0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--bsz", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--config", help="JSON overriding DRAFT (smoke tests)")
    ap.add_argument("--eval-tokens", type=int, default=0, help="cap on held-out tokens evaluated (0: all)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--deadline-s", type=float, default=0, help="stop early past this many seconds (a guard for a "
                    "time-limited machine; the run is then no longer reproducible from --steps)")
    args = ap.parse_args()
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    man = json.load(open(os.path.join(args.data, "draft_manifest.json")))
    train = np.fromfile(os.path.join(args.data, "train.u16"), dtype="<u2")
    held = np.fromfile(os.path.join(args.data, "heldout.u16"), dtype="<u2")
    c = dict(DRAFT, **(json.loads(args.config) if args.config else {}))
    cfg = make_config(c, man)
    m = Qwen3ForCausalLM(cfg).to(torch.float32)
    init_weights(m, args.seed, c["layers"])
    m.to(dev).train()
    tbytes = token_bytes(os.path.join(args.data, "tokenizer.json"), cfg.vocab_size)
    nparams = sum(p.numel() for p in m.parameters())
    print(f"params {nparams / 1e6:.3f} M, vocab {cfg.vocab_size}, train tokens {len(train)}, heldout {len(held)}",
          flush=True)
    decay = [p for _, p in m.named_parameters() if p.dim() >= 2]
    nodecay = [p for _, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    steps = args.steps if not args.train_s else 10 ** 9

    def sched(s):
        if s < args.warmup:
            return (s + 1) / args.warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - args.warmup) / max(1, steps - args.warmup))))

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    it = batches(train, args.seq, args.bsz, args.seed)
    log, t0, step = [], time.time(), 0
    while step < steps:
        if args.train_s and step == 25:
            sync()
            t25 = time.time()
        if args.train_s and step == 45:
            sync()
            per = (time.time() - t25) / 20
            steps = max(args.warmup + 10, int(45 + (args.train_s - (time.time() - t0)) / per) // 10 * 10)
            print(f"TOTAL STEPS {steps} ({per * 1e3:.1f} ms/step; re-run with --steps {steps})", flush=True)
        if args.deadline_s and time.time() - t0 > args.deadline_s:
            print(f"deadline: stopped after {step} of {steps} steps", flush=True)
            steps = step
            break
        for gp in opt.param_groups:
            gp["lr"] = args.lr * sched(step)
        x = next(it).to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = m(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == steps - 1:
            lv, el = float(loss.detach()), time.time() - t0
            log.append({"step": step, "loss": lv, "grad_norm": float(gn), "s": el})
            print(f"step {step} loss {lv:.4f} gn {float(gn):.2f} "
                  f"{(step + 1) * args.bsz * args.seq / max(el, 1e-9) / 1e3:.0f} ktok/s {el:.0f}s", flush=True)
        step += 1
    train_s = time.time() - t0
    res = {"seed": args.seed, "steps": steps, "seq": args.seq, "bsz": args.bsz, "lr": args.lr,
           "warmup": args.warmup, "tokens_seen": steps * args.bsz * args.seq, "train_seconds": train_s,
           "params": nparams, "config": c, "log": log}
    nll, nllb, n, nb = evaluate(m, held, tbytes, args.seq, args.bsz, dev, autocast=True,
                               max_tokens=args.eval_tokens)
    res["heldout_master_bf16_autocast"] = {"nll": nll, "ppl": math.exp(nll), "nll_per_byte": nllb,
                                           "ppl_per_byte": math.exp(nllb), "tokens": n, "bytes": nb}
    print(f"held-out (fp32 master, bf16 autocast): nll {nll:.4f} ppl {math.exp(nll):.2f}, per byte "
          f"{nllb:.4f} ({math.exp(nllb):.4f}) over {n} tokens / {nb} bytes", flush=True)
    ck = os.path.join(args.out, "ckpt")
    os.makedirs(ck, exist_ok=True)
    m.to(torch.bfloat16).cpu().save_pretrained(ck, max_shard_size="16MB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.data, f), ck)
    m2 = Qwen3ForCausalLM.from_pretrained(ck, dtype=torch.float32).to(dev)
    nll, nllb, n, nb = evaluate(m2, held, tbytes, args.seq, args.bsz, dev, autocast=False,
                               max_tokens=args.eval_tokens)
    res["heldout_bf16_checkpoint"] = {"nll": nll, "ppl": math.exp(nll), "nll_per_byte": nllb,
                                      "ppl_per_byte": math.exp(nllb), "tokens": n, "bytes": nb}
    print(f"held-out (bf16 checkpoint as exported, fp32 compute): nll {nll:.4f} ppl {math.exp(nll):.2f}, per byte "
          f"{nllb:.4f} ({math.exp(nllb):.4f})", flush=True)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
