#!/usr/bin/env python3
"""Builds the committed workload files of `sluice bench --workload NAME` (issue 19) from texts written for
this repository and from the repository's own sources and docs (the project's license covers them all), so
that the prompts can be regenerated and checked: `python3 tools/workloads/make_workloads.py` rewrites
tools/workloads/*.json; with `--tokenizer tests/fixtures/kimi_k3/mini-k3/tiktoken.model` it also prints each
prompt's length in mini-K3 tokens (needs the `tiktoken` package).

A workload is {name, about, source, max_new, and either "text" (a plain continuation) or "messages" (+ "tools")
rendered with the model's chat format, thinking off}.
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

PROSE = """The river had been rising for three days before anyone in the village took it seriously. On the \
first morning the water lay a hand's width below the old stone mark on the bridge, where it had lain every \
spring for as long as the oldest fishermen could remember, and the children threw sticks from the parapet and \
raced down the bank to watch them come out the other side. By the second evening the mark was gone, and the \
miller walked the length of the weir with a lantern, testing each plank with his boot and saying nothing. \
On the third day the rain stopped, which should have been a relief, but the water kept coming, brown and \
quick and carrying whole branches from the forests upstream. The schoolmaster, who kept a notebook of the \
weather and believed in numbers more than in omens, measured the level every hour from the steps of the \
church and wrote the figures in a neat column. When he showed the column to the council that night, the \
numbers told a story that nobody wanted to read: the river was not slowing down. It was"""

CHAT = [
    {"role": "system", "content": "You are a patient assistant who helps people learn Rust. Answer briefly and show small examples."},
    {"role": "user", "content": "What is the difference between a String and a &str in Rust?"},
    {"role": "assistant", "content": "A `String` owns its bytes on the heap and can grow; a `&str` is a borrowed view into \
UTF-8 bytes that live somewhere else, such as inside a `String` or in the program's binary. Functions that only read \
text should usually take `&str`, because a `&String` converts to it for free:\n\n```rust\nfn shout(s: &str) -> String {\n    \
s.to_uppercase()\n}\n\nlet owned = String::from(\"hello\");\nprintln!(\"{}\", shout(&owned));\nprintln!(\"{}\", shout(\"literal\"));\n```"},
    {"role": "user", "content": "So when should a struct field be a String instead of a &str?"},
    {"role": "assistant", "content": "When the struct should own the text. A `&str` field needs a lifetime parameter and \
ties the struct to whatever it borrows from, so the struct cannot outlive that data. For configuration, records you \
keep around, or anything you send to another thread, use `String`. Use `&str` fields for short-lived views, such as \
the tokens a parser returns while the input is still in scope."},
    {"role": "user", "content": "Can you show me a parser that returns tokens borrowing from the input, and explain the lifetime?"},
]

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the project and return its contents.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the project root."}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "search_code", "description": "Search the project's source files for a string; returns matching lines.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The text to look for."},
            "glob": {"type": "string", "description": "Only files whose path matches this glob, e.g. *.rs."}},
            "required": ["query"]}}},
]


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def workloads():
    policy = read("crates/sluice-store/src/policy.rs")
    cut = policy.index("impl Policy for Lru {")
    code = policy[:cut] + "impl Policy for Lru {\n    fn insert(&mut self, slot: usize, _key: Key) {\n"
    k3 = read("docs/K3.md")
    doc = k3[:20000]
    doc = doc[:doc.rindex("\n\n")]
    grep = "\n".join(l for l in policy.splitlines() if "fn victim" in l)
    return [
        {"name": "prose", "about": "continue a passage of English prose (written for this repository)",
         "source": "tools/workloads/make_workloads.py (PROSE)", "max_new": 64, "text": PROSE},
        {"name": "code", "about": "complete a real source file: sluice's own cache policy module, cut inside a method",
         "source": "crates/sluice-store/src/policy.rs (up to `impl Policy for Lru`)", "max_new": 64, "text": code},
        {"name": "long", "about": "summarize a long document (about 8k mini-K3 tokens of docs/K3.md)",
         "source": "docs/K3.md (first ~20,000 characters, cut at a paragraph)", "max_new": 32,
         "messages": [{"role": "user", "content": "Summarize the following document in five bullet points.\n\n" + doc}]},
        {"name": "chat", "about": "a multi-turn chat about Rust (three user turns, two answers in the history)",
         "source": "tools/workloads/make_workloads.py (CHAT)", "max_new": 64, "messages": CHAT},
        {"name": "tools", "about": "a tool-calling exchange: two tools declared, one call made and answered, then the answer",
         "source": "tools/workloads/make_workloads.py (TOOLS); the tool result is grep output over policy.rs",
         "max_new": 64, "tools": TOOLS,
         "messages": [
             {"role": "system", "content": "You are a coding assistant with access to the project's files. Use the tools to look things up before answering."},
             {"role": "user", "content": "Where does the expert cache choose which slot to evict, and how does it skip pinned slots?"},
             {"role": "assistant", "content": "",
              "tool_calls": [{"id": "call_1", "name": "search_code", "arguments": json.dumps({"query": "fn victim", "glob": "*.rs"})}]},
             {"role": "tool", "tool_call_id": "call_1", "name": "search_code",
              "content": "crates/sluice-store/src/policy.rs:\n" + grep},
         ]},
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", help="tiktoken.model to count prompt tokens with")
    a = ap.parse_args()
    enc = None
    if a.tokenizer:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        pat = r"""[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
        enc = tiktoken.Encoding("k3", pat_str=pat, mergeable_ranks=load_tiktoken_bpe(a.tokenizer), special_tokens={})
    for w in workloads():
        path = os.path.join(HERE, w["name"] + ".json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(w, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
        text = w.get("text") or "".join(m["content"] for m in w["messages"])
        n = f", about {len(enc.encode_ordinary(text))} tokens" if enc else ""
        print(f"{os.path.relpath(path, ROOT)}: {len(text)} characters{n}")


if __name__ == "__main__":
    main()
