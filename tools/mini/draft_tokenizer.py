#!/usr/bin/env python3
"""Trains mini-draft's tokenizer (issue 17, item 4) and tokenizes the corpus with it.

mini-draft drafts for mini-K3 through the cross-tokenizer path (crates/sluice-engine/src/draft_model.rs), so
its tokenizer is deliberately *not* mini-K3's: a Qwen3-shaped byte-level BPE in the Hugging Face
`tokenizer.json` format (NFC normalizer, the Qwen2/Qwen3 split regex, then ByteLevel without its own regex),
4096 entries (the 256 byte symbols and 3840 merges) learned by the `tokenizers` trainer on the same training
split that mini-K3's tokenizer learned from (tools/mini/corpus.py). After the BPE ids come its own added tokens,
as in Qwen3: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (special) and `<think>`, `</think>` (not special);
`tokenizer_config.json` carries a ChatML chat template. Each document of a split is encoded as
`<|endoftext|>` followed by its text.

Outputs (under --out, default /work/mini-artifacts/draft-tok): tokenizer.json, tokenizer_config.json,
train.u16 / heldout.u16 (little-endian uint16), draft_manifest.json (counts, text bytes and SHA-256; the
committed copy is tools/mini/draft_tok_manifest.json).

Usage: python3 tools/mini/draft_tokenizer.py [--corpus DIR] [--out DIR] [--vocab 4096]
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gen_qwen3_goldens import PLAIN_ADDED, QWEN_PATTERN, SPECIALS  # noqa: E402  (one definition of Qwen's layout)

SEP = "\x1e"  # the corpus's document separator (tools/mini/corpus.py)

# Qwen3's ChatML template without tools: system/user/assistant turns, then the assistant header on request.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def docs_of(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split(SEP) if d]


def build(train_docs, vocab):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_docs, trainer)
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(f"trainer produced {tok.get_vocab_size()} entries, wanted {vocab}")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in PLAIN_ADDED])
    return tok


def write_config(tok, out):
    decoder = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": s in SPECIALS}
               for s in SPECIALS + PLAIN_ADDED}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder, "bos_token": None,
           "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
           "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
           "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def token_bytes(tok):
    """UTF-8 byte length of every id's text (added tokens: 0, they stand for no corpus bytes)."""
    n = tok.get_vocab_size(with_added_tokens=True)
    added = {tok.token_to_id(s) for s in SPECIALS + PLAIN_ADDED}
    dec = {c: b for b, c in zip(*_byte_alphabet())}
    out = np.zeros(n, dtype=np.int64)
    for piece, i in tok.get_vocab(with_added_tokens=False).items():
        out[i] = sum(1 for _ in piece) if all(c in dec for c in piece) else len(piece.encode())
    for i in added:
        out[i] = 0
    return out


def _byte_alphabet():
    """GPT-2's byte-level alphabet: (bytes, chars) where each byte is spelled by one printable char."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def encode_split(tok, docs):
    eot = tok.token_to_id("<|endoftext|>")
    out = []
    for e in tok.encode_batch(docs, add_special_tokens=False):
        out.append(eot)
        out.extend(e.ids)
    return np.asarray(out, dtype="<u2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/work/mini-artifacts/corpus")
    ap.add_argument("--out", default="/work/mini-artifacts/draft-tok")
    ap.add_argument("--vocab", type=int, default=4096, help="BPE entries (256 bytes + merges)")
    ap.add_argument("--reuse", action="store_true", help="reuse an existing tokenizer.json in --out")
    ap.add_argument("--limit-docs", type=int, default=0, help="train/encode only this many documents (smoke tests)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    splits = {s: docs_of(os.path.join(args.corpus, f"{s}.txt")) for s in ("train", "heldout")}
    if args.limit_docs:
        splits = {s: d[:args.limit_docs] for s, d in splits.items()}
    tj = os.path.join(args.out, "tokenizer.json")
    if args.reuse and os.path.exists(tj):
        tok = Tokenizer.from_file(tj)
    else:
        tok = build(splits["train"], args.vocab)
        tok.save(tj)
        write_config(tok, args.out)
    tb = token_bytes(tok)
    man = {"bpe_vocab": args.vocab, "vocab_with_added": tok.get_vocab_size(with_added_tokens=True),
           "eot": tok.token_to_id("<|endoftext|>"),
           "tokenizer_json_sha256": hashlib.sha256(open(tj, "rb").read()).hexdigest()}
    for split, docs in splits.items():
        arr = encode_split(tok, docs)
        arr.tofile(os.path.join(args.out, f"{split}.u16"))
        nbytes = sum(len(d.encode()) for d in docs)
        man[split] = {"docs": len(docs), "tokens": int(arr.size), "text_bytes": nbytes,
                      "token_bytes": int(tb[arr].sum()), "bytes_per_token": nbytes / arr.size,
                      "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
        print(f"{split}: {len(docs)} docs, {arr.size} tokens, {nbytes / arr.size:.2f} bytes/token", flush=True)
    with open(os.path.join(args.out, "draft_manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
