#!/usr/bin/env python3
"""Trains the mini-K3 tokenizer (issue 17, item 2) and tokenizes the corpus.

A byte-level BPE with Kimi K3's pre-tokenizer pattern (K3.md 4.1), learned on the training split of the
corpus that tools/mini/corpus.py builds, written in the tiktoken format K3 ships: `tiktoken.model` (one
`base64(bytes) rank` line per rank; ranks 0..255 are the single bytes in byte order, then one token per
learned merge in merge order) and `tokenizer_config.json` with K3's 256 reserved special tokens
(`[BOS]`, `[EOS]`, `<|end_of_msg|>`, `<|open|>`, `<|close|>`, `<|sep|>`, ... at the same offsets as the
release; tools/gen_k3_goldens.py writes the tiny fixtures' the same way).

The merges are learned by the `tokenizers` (HF) BPE trainer over K3's pre-tokenized words; the corpus is then
encoded by `tiktoken` with the resulting rank table (the algorithm sluice-tokenizer implements), so the token
streams used for training are exactly what sluice produces for the same text. Each document starts with
`[BOS]`.

Outputs (under --out, default /work/mini-artifacts/tok): tiktoken.model, tokenizer_config.json,
train.u16 / heldout.u16 (little-endian uint16 token ids), tok_manifest.json (counts and SHA-256).

Usage: python3 tools/mini/tokenizer.py [--corpus DIR] [--out DIR] [--ranks 8192]
"""

import argparse
import base64
import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gen_k3_goldens import K3_PAT, SPECIAL_NAMES  # noqa: E402  (one definition of K3's pattern and specials)

SEP = "\x1e"


def byte_level_decoder():
    """GPT-2 byte-level alphabet (what `tokenizers`' ByteLevel uses): printable char -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def train_ranks(train_path, n_ranks):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(K3_PAT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n_ranks, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])

    def docs():
        with open(train_path, encoding="utf-8") as f:
            for d in f.read().split(SEP):
                if d:
                    yield d

    tok.train_from_iterator(docs(), trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    dec = byte_level_decoder()
    ranks = [bytes([b]) for b in range(256)]
    seen = set(ranks)
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ")
        t = bytes(dec[c] for c in a + b)
        if t not in seen:
            seen.add(t)
            ranks.append(t)
        if len(ranks) == n_ranks:
            break
    if len(ranks) != n_ranks:
        raise RuntimeError(f"trainer produced {len(ranks)} ranks, wanted {n_ranks}")
    return ranks


def special_name(n_base, off):
    return SPECIAL_NAMES.get(off, f"<|reserved_token_{n_base + off}|>")


def write_tokenizer(out, ranks):
    n_base = len(ranks)
    with open(os.path.join(out, "tiktoken.model"), "w") as f:
        for r, t in enumerate(ranks):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    added = {str(n_base + off): {"content": special_name(n_base, off), "lstrip": False, "normalized": False,
                                 "rstrip": False, "single_word": False, "special": True} for off in range(256)}
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
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def encoding(ranks):
    import tiktoken
    n_base = len(ranks)
    specials = {special_name(n_base, off): n_base + off for off in range(256)}
    return tiktoken.Encoding(name="mini-k3", pat_str=K3_PAT, mergeable_ranks={t: r for r, t in enumerate(ranks)},
                             special_tokens=specials)


def load_ranks(path):
    with open(path) as f:
        return [base64.b64decode(line.split()[0]) for line in f if line.strip()]


def encode_split(enc, path, bos):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split(SEP) if d]
    ids = enc.encode_ordinary_batch(docs, num_threads=2)
    out = []
    for d in ids:
        out.append(bos)
        out.extend(d)
    return np.asarray(out, dtype="<u2"), len(docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/work/mini-artifacts/corpus")
    ap.add_argument("--out", default="/work/mini-artifacts/tok")
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--reuse", action="store_true", help="reuse an existing tiktoken.model in --out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tm = os.path.join(args.out, "tiktoken.model")
    if args.reuse and os.path.exists(tm):
        ranks = load_ranks(tm)
    else:
        ranks = train_ranks(os.path.join(args.corpus, "train.txt"), args.ranks)
        write_tokenizer(args.out, ranks)
    enc = encoding(ranks)
    man = {"ranks": len(ranks), "vocab_size": len(ranks) + 256, "bos": len(ranks),
           "tiktoken_model_sha256": hashlib.sha256(open(tm, "rb").read()).hexdigest()}
    for split in ("train", "heldout"):
        arr, ndocs = encode_split(enc, os.path.join(args.corpus, f"{split}.txt"), len(ranks))
        p = os.path.join(args.out, f"{split}.u16")
        arr.tofile(p)
        nbytes = os.path.getsize(os.path.join(args.corpus, f"{split}.txt"))
        man[split] = {"docs": ndocs, "tokens": int(arr.size), "text_bytes": nbytes,
                      "bytes_per_token": nbytes / arr.size, "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
        print(f"{split}: {ndocs} docs, {arr.size} tokens, {nbytes / arr.size:.2f} bytes/token", flush=True)
    with open(os.path.join(args.out, "tok_manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
