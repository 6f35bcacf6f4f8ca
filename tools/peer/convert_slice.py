#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py on a `sluice synth` slice, unchanged but for the vocab.

    convert_slice.py LLAMA_CPP_DIR [convert_hf_to_gguf.py arguments...]

The slice's tokenizer is synthetic: `tiktoken.model` and `tokenizer_config.json` as the release
lays them out, but no `tokenization_kimi.py` (the release's transformers remote code). The
converter's Kimi vocab path loads the tokenizer through that remote code and then recognises the
pre-tokenizer by hashing what the real Kimi vocabulary makes of a test string, so it cannot read
a synthetic vocabulary. This wrapper replaces only `set_vocab`, writing the GGUF vocabulary the
converter's own "kimi-k2" path writes (gpt2-style BPE tokens, merges recovered from the ranks,
the 256 specials as control tokens, the configured eos), built from `tiktoken.model` directly.
Weights, hyperparameters and the MXFP4 expert repacking go through the converter untouched; the
benchmark feeds token ids, so the vocabulary only has to load.

The GPT-OSS and Qwen3-MoE slices (`--preset gpt-oss-slice`, `qwen3-30b-slice`, `qwen3-moe-slice`)
have no tokenizer at all (sluice runs them with --prompt-ids), while the converter's vocab path
for both reads `tokenizer.json` through transformers and recognises the pre-tokenizer by a hash of
the real vocabulary. For them `set_vocab` writes a byte-level BPE vocabulary of the config's
`vocab_size` tokens (the 256 byte tokens, then two-byte tokens with their merges), so that
llama.cpp loads the GGUF; again only the vocabulary differs from a real conversion.
"""
import base64
import json
import runpy
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ll = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(ll))
    sys.path.insert(1, str(ll / "gguf-py"))
    import gguf
    from conversion.qwen import QwenModel

    arch = json.loads(Path(sys.argv[2], "config.json").read_text())["architectures"][0]

    def set_vocab(self):
        ranks = {}
        for line in (self.dir_model / "tiktoken.model").read_text().splitlines():
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
        config = json.loads((self.dir_model / "tokenizer_config.json").read_text())
        specials = {int(i): t["content"] for i, t in config["added_tokens_decoder"].items()}
        vocab, merges = {}, []
        for token, rank in ranks.items():
            vocab[rank] = QwenModel.token_bytes_to_string(token)
            if len(token) > 1:
                merged = QwenModel.bpe(ranks, token, max_rank=rank)
                if len(merged) == 2:
                    merges.append(" ".join(map(QwenModel.token_bytes_to_string, merged)))
        tokens, types = [], []
        for i in range(self.hparams["vocab_size"]):
            if i in specials:
                tokens.append(specials[i])
                types.append(gguf.TokenType.CONTROL)
            elif i in vocab:
                tokens.append(vocab[i])
                types.append(gguf.TokenType.NORMAL)
            else:
                tokens.append(f"[PAD{i}]")
                types.append(gguf.TokenType.UNUSED)
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("kimi-k2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        gguf.SpecialVocab(self.dir_model, load_merges=False).add_to_gguf(w)
        if (eos := self.hparams.get("eos_token_id")) is not None:
            w.add_eos_token_id(eos)

    def byte_pair_vocab(self):
        n = self.hparams["vocab_size"]
        chars = [QwenModel.token_bytes_to_string(bytes([b])) for b in range(256)]
        tokens, merges = list(chars[:n]), []
        for a in chars:
            for b in chars:
                if len(tokens) >= n:
                    break
                tokens.append(a + b)
                merges.append(f"{a} {b}")
        tokens += [f"[PAD{i}]" for i in range(len(tokens), n)]
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * n)
        w.add_token_merges(merges)
        if (eos := self.hparams.get("eos_token_id")) is not None:
            w.add_eos_token_id(eos)

    if arch == "GptOssForCausalLM":
        from conversion.gpt_oss import GptOssModel
        GptOssModel.set_vocab = byte_pair_vocab
    elif arch == "Qwen3MoeForCausalLM":
        from conversion.qwen import Qwen3MoeModel
        Qwen3MoeModel.set_vocab = byte_pair_vocab
    else:
        from conversion.kimi_k3 import KimiK3Model
        KimiK3Model.set_vocab = set_vocab
    sys.argv = [str(ll / "convert_hf_to_gguf.py")] + sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
