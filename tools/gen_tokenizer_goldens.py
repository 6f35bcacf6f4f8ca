#!/usr/bin/env python3
"""Tokenizer goldens for sluice-tokenizer, produced by Python tiktoken.

The script

1. learns a small byte-level BPE vocabulary (256 byte tokens + NUM_MERGES merges) from a multilingual corpus
   that is embedded here and extended by a seeded generator (English, Chinese, Cyrillic, Arabic, Devanagari,
   code, numbers, runs of punctuation and whitespace), pre-tokenised with Kimi K3's regex (K3.md 4.1);
2. writes it in the published Kimi K3 layout: `tiktoken.model` (`base64(bytes) rank` per line, ranks
   0..N-1) and `tokenizer_config.json` whose `added_tokens_decoder` holds the 256 reserved specials at ids
   N..N+255 with K3's spellings at K3's offsets;
3. encodes a varied test set with `tiktoken.Encoding(pat_str=K3_PAT, mergeable_ranks=..., special_tokens={})`
   and writes `encode_goldens.json`. Every case records what plain tiktoken gives for the whole string
   (`ids`) and, where it differs, what Kimi's `tokenization_kimi.py` gives (`kimi_ids`): that tokenizer
   first cuts the text into 400,000-character slices and each slice into pieces with no whitespace or
   non-whitespace run longer than 25,000 characters, then encodes the pieces separately. The piece
   lengths are recorded too (`kimi_chunks`), so the split itself is tested apart from BPE. Long results
   are stored as a length, an FNV-1a-64 digest of the ids as little-endian u32 and the first and last
   ids, to keep the fixture small; long texts are stored as `parts` ([string, repeat count] pairs).

The code points for which Python's `str.isspace()` is true are written too, because the 25,000-character
split is defined by that predicate (it differs from Unicode White_Space on U+001C..U+001F).

Usage (needs `tiktoken`, which brings `regex`):
    pip install tiktoken==0.14.0
    python3 tools/gen_tokenizer_goldens.py --out tests/fixtures/tokenizer
"""

import argparse
import base64
import collections
import heapq
import json
import os
import random
import sys

import regex
import tiktoken

NUM_MERGES = 3000
K3_PAT = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# K3's reserved-token spellings by offset from the first reserved id (K3.md 4.1).
SPECIAL_NAMES = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
    19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]",
}
MAX_SLICE_CHARS = 400_000  # tokenization_kimi.py: TIKTOKEN_MAX_ENCODE_CHARS
MAX_RUN_CHARS = 25_000  # tokenization_kimi.py: MAX_NO_WHITESPACES_CHARS
DIGEST_OVER = 400  # id lists longer than this are stored as a digest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import corpus, test_cases  # noqa: E402  (same directory)


def train_bpe(text, num_merges):
    """Byte-level BPE over K3 pre-tokenised words. Returns merged token byte strings in rank order.

    Each step merges the most frequent adjacent pair; ties break on the smaller (left rank, right rank).
    Pair counts are updated incrementally, so a few thousand merges take seconds."""
    pat = regex.compile(K3_PAT, regex.V1)
    counts = collections.Counter(m.group(0).encode() for m in pat.finditer(text))
    words = list(counts)
    freq = [counts[w] for w in words]
    seqs = [[bytes([b]) for b in w] for w in words]
    rank = {bytes([b]): b for b in range(256)}
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    heap = [(-n, rank[a], rank[b], a, b) for (a, b), n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < num_merges:
        if not heap:
            raise RuntimeError("corpus too small for the requested number of merges")
        neg, _, _, a, b = heapq.heappop(heap)
        if pairs.get((a, b), 0) != -neg or neg == 0:
            continue  # stale heap entry
        new = a + b
        if new not in rank:  # two different pairs can spell the same bytes; rank it once
            rank[new] = len(rank)
            merges.append(new)
        touched = set()
        for i in sorted(where.pop((a, b), ())):
            s = seqs[i]
            for x, y in zip(s, s[1:]):
                pairs[(x, y)] -= freq[i]
                touched.add((x, y))
            out, k = [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == a and s[k + 1] == b:
                    out.append(new)
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            seqs[i] = out
            for x, y in zip(out, out[1:]):
                pairs[(x, y)] += freq[i]
                where[(x, y)].add(i)
                touched.add((x, y))
        for x, y in touched:
            n = pairs[(x, y)]
            if n > 0:
                heapq.heappush(heap, (-n, rank[x], rank[y], x, y))
            else:
                del pairs[(x, y)]
    return merges


def write_tokenizer(out_dir, ranks):
    n = len(ranks)
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        for r, tok in enumerate(ranks):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")
    added = {
        str(n + off): {
            "content": SPECIAL_NAMES.get(off, f"<|reserved_token_{off}|>"),
            "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True,
        }
        for off in range(256)
    }
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"],
        "bos_token": "[BOS]", "eos_token": "<|end_of_msg|>", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False, "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")


def split_runs(s, max_run):
    """tokenization_kimi.py `_split_whitespaces_or_nonwhitespaces`: cut `s` so that no piece holds more
    than `max_run` consecutive whitespace or non-whitespace characters (by `str.isspace`)."""
    run_len, run_is_space, start = 0, (s[0].isspace() if s else False), 0
    for i, ch in enumerate(s):
        is_space = ch.isspace()
        if run_is_space ^ is_space:
            run_len, run_is_space = 1, is_space
        else:
            run_len += 1
            if run_len > max_run:
                yield s[start:i]
                start, run_len = i, 1
    yield s[start:]


def kimi_chunks(text):
    """tokenization_kimi.py `encode`: 400,000-character slices, each split by `split_runs`."""
    return [
        piece
        for i in range(0, len(text), MAX_SLICE_CHARS)
        for piece in split_runs(text[i:i + MAX_SLICE_CHARS], MAX_RUN_CHARS)
    ]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        for byte in t.to_bytes(4, "little"):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def ids_record(ids):
    if len(ids) <= DIGEST_OVER:
        return ids
    return {"len": len(ids), "fnv1a64": fnv1a64(ids), "head": ids[:32], "tail": ids[-32:]}


def isspace_ranges():
    out = []
    for cp in range(0x110000):
        if chr(cp).isspace():
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    ranks = [bytes([b]) for b in range(256)] + train_bpe(corpus(), NUM_MERGES)
    assert len(set(ranks)) == len(ranks)
    write_tokenizer(args.out, ranks)
    enc = tiktoken.Encoding(
        name="k3-golden", pat_str=K3_PAT, mergeable_ranks={t: r for r, t in enumerate(ranks)}, special_tokens={}
    )

    cases = []
    for name, spec in test_cases():
        text = spec if isinstance(spec, str) else "".join(s * n for s, n in spec)
        plain = enc.encode_ordinary(text)
        assert enc.decode_bytes(plain) == text.encode()
        chunks = kimi_chunks(text)
        kimi = [t for c in chunks for t in enc.encode_ordinary(c)]
        case = {"name": name}
        case["text" if isinstance(spec, str) else "parts"] = spec if isinstance(spec, str) else [list(p) for p in spec]
        case["ids"] = ids_record(plain)
        if len(chunks) > 1:
            case["kimi_chunks"] = [len(c) for c in chunks]
        if kimi != plain:
            case["kimi_ids"] = ids_record(kimi)
        cases.append(case)

    doc = {
        "generator": "tools/gen_tokenizer_goldens.py",
        "tiktoken_version": tiktoken.__version__,
        "pattern": K3_PAT,
        "num_ranks": len(ranks),
        "python_isspace": isspace_ranges(),
        "cases": cases,
    }
    path = os.path.join(args.out, "encode_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        head = {k: v for k, v in doc.items() if k != "cases"}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n"cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    differ = sum("kimi_ids" in c for c in cases)
    print(f"{len(ranks)} ranks, {len(cases)} cases ({differ} where Kimi's split changes the ids) -> {args.out}")


if __name__ == "__main__":
    main()
