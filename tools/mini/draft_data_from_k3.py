#!/usr/bin/env python3
"""Rebuilds mini-draft's token streams from mini-K3's (issue 17; how the GPU machine got them).

The device copies at most 64 MiB, too little for both tokenized corpora, so only mini-K3's streams travel: each
document (a `[BOS]` then its tokens, tools/mini/tokenizer.py) is decoded back to its exact text with the tiktoken
rank table and re-encoded with mini-draft's tokenizer.json as tools/mini/draft_tokenizer.py does (`<|endoftext|>`
then the text). The result is checked against the SHA-256 in draft_manifest.json.

Usage: python3 tools/mini/draft_data_from_k3.py K3_DIR DRAFT_DIR   (K3_DIR: *.u16, tiktoken.model, tok_manifest.json;
DRAFT_DIR: tokenizer.json, draft_manifest.json; writes DRAFT_DIR/{train,heldout}.u16)
"""

import base64
import hashlib
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer


def main():
    k3, dr = sys.argv[1], sys.argv[2]
    with open(os.path.join(k3, "tiktoken.model")) as f:
        ranks = [base64.b64decode(line.split()[0]) for line in f if line.strip()]
    bos = json.load(open(os.path.join(k3, "tok_manifest.json")))["bos"]
    man = json.load(open(os.path.join(dr, "draft_manifest.json")))
    tok = Tokenizer.from_file(os.path.join(dr, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    ok = True
    for split in ("train", "heldout"):
        ids = np.fromfile(os.path.join(k3, f"{split}.u16"), dtype="<u2")
        cuts = np.flatnonzero(ids == bos).tolist() + [len(ids)]
        docs = [b"".join(ranks[t] for t in ids[a + 1:b].tolist()).decode("utf-8") for a, b in zip(cuts, cuts[1:])]
        out = []
        for e in tok.encode_batch(docs, add_special_tokens=False):
            out.append(eot)
            out.extend(e.ids)
        arr = np.asarray(out, dtype="<u2")
        arr.tofile(os.path.join(dr, f"{split}.u16"))
        sha = hashlib.sha256(arr.tobytes()).hexdigest()
        same = sha == man[split]["sha256"]
        ok &= same
        print(f"{split}: {len(docs)} docs, {arr.size} tokens, sha256 {'matches' if same else 'DIFFERS from'} the manifest")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
