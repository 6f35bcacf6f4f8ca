#!/usr/bin/env python3
"""Chat-format goldens for sluice-tokenizer's Kimi K3 XTML renderer.

The reference is the `Kimi-K3.jinja` chat template that llama.cpp ships and llama-cpp-python 0.3.36
vendors (`vendor/llama.cpp/models/templates/Kimi-K3.jinja`). It is not stored in this repository: the
script downloads the llama-cpp-python source distribution from PyPI at generation time (needs network
access to PyPI), checks its SHA-256, and reads the template out of the tarball.

Each conversation in `tools/chat_cases.py` is rendered with Python jinja2 the way chat-template hosts
(transformers, vLLM) do: a sandboxed environment with `trim_blocks`, `lstrip_blocks` and the
loop-controls extension, `raise_exception`, and `tojson` = `json.dumps(x, ensure_ascii=False, ...)`.
One deviation, recorded per case: jinja2's `dictsort` sorts keys case-insensitively, while the template
states that it sorts "to match the reference implementation" (`json.dumps(sort_keys=True)`, code-point
order) and llama.cpp's own Jinja engine sorts case-sensitively. The goldens use the case-sensitive order;
`stock_jinja2_differs` marks the cases where stock jinja2 would print another key order.

For every case the output holds the expected string and its `segments`: the four structural markers
(`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) as `["S", spelling]` and the text between them as
`["T", text]`. Marker spellings typed inside message data are kept apart from real markers by rendering
once more with those spellings replaced by private-use sentinels. A case whose rendering raises gets
`error` instead (the template's message).

Usage (needs `jinja2` and PyPI access):
    pip install jinja2==3.1.6
    python3 tools/gen_chat_goldens.py --out tests/fixtures/tokenizer
    python3 tools/gen_chat_goldens.py --sdist /path/to/llama_cpp_python-0.3.36.tar.gz  # offline
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import jinja2
import jinja2.filters
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_cases import cases  # noqa: E402  (same directory)

PACKAGE = "llama-cpp-python==0.3.36"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TEMPLATE_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Kimi-K3.jinja"
MARKERS = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]


def fetch_template(sdist, cache_dir):
    if sdist is None:
        os.makedirs(cache_dir, exist_ok=True)
        sdist = os.path.join(cache_dir, SDIST)
        if not os.path.exists(sdist):
            # `--no-binary` only for this package, so pip may use wheels for the build backend it
            # runs to read the metadata (with `:all:` it would compile cmake from source).
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                 PACKAGE, "-d", cache_dir],
                check=True,
            )
    with open(sdist, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {digest} != pinned {SDIST_SHA256}")
    with tarfile.open(sdist) as tar:
        source = tar.extractfile(TEMPLATE_MEMBER).read().decode("utf-8")
    return source


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' `tojson` filter (jinja2's own escapes HTML and takes no `ensure_ascii`)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_template(source, case_sensitive_dictsort):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    if case_sensitive_dictsort:
        env.filters["dictsort"] = (
            lambda value, case_sensitive=False, by="key", reverse=False:
            jinja2.filters.do_dictsort(value, True, by, reverse)
        )
    return env.from_string(source)


def template_arguments(arguments):
    """What a server hands the template for OpenAI `arguments` text: `json.loads` of it when that is an
    object or null (vLLM parses arguments before rendering), otherwise the text itself."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if value is None or isinstance(value, dict) else arguments


def template_messages(messages):
    out = []
    for m in messages:
        t = {"role": m["role"], "content": m.get("content")}
        for key in ("reasoning_content", "tool_call_id", "name"):
            if m.get(key) is not None:
                t[key] = m[key]
        if m.get("tool_calls"):
            t["tool_calls"] = []
            for c in m["tool_calls"]:
                call = {"type": "function",
                        "function": {"name": c["name"], "arguments": template_arguments(c.get("arguments", ""))}}
                if c.get("id") is not None:
                    call["id"] = c["id"]
                t["tool_calls"].append(call)
        out.append(t)
    return out


def template_kwargs(messages, options):
    kw = {"messages": template_messages(messages), "add_generation_prompt": options.get("add_generation_prompt", True)}
    kw["thinking"] = options.get("thinking", True)
    for ours, theirs in (("effort", "thinking_effort"), ("tools", "tools"), ("tool_choice", "tool_choice"),
                         ("response_format", "response_format")):
        if options.get(ours) is not None:
            kw[theirs] = options[ours]
    return kw


def hide_markers(value):
    """Replaces marker spellings in every string (keys too) by sentinels U+E000 k U+E001."""
    if isinstance(value, str):
        for k, m in enumerate(MARKERS):
            value = value.replace(m, f"\ue000{k}\ue001")
        return value
    if isinstance(value, list):
        return [hide_markers(v) for v in value]
    if isinstance(value, dict):
        return {hide_markers(k): hide_markers(v) for k, v in value.items()}
    return value


def unhide(text):
    for k, m in enumerate(MARKERS):
        text = text.replace(f"\ue000{k}\ue001", m)
    return text


def segments_of(rendered_hidden):
    segments, pos = [], 0
    while pos < len(rendered_hidden):
        hits = [(rendered_hidden.find(m, pos), m) for m in MARKERS]
        hits = [(i, m) for i, m in hits if i >= 0]
        if not hits:
            segments.append(["T", unhide(rendered_hidden[pos:])])
            break
        i, m = min(hits)
        if i > pos:
            segments.append(["T", unhide(rendered_hidden[pos:i])])
        segments.append(["S", m])
        pos = i + len(m)
    return segments


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    ap.add_argument("--sdist", help="a local llama_cpp_python-0.3.36.tar.gz instead of downloading")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "sluice-chat-goldens"))
    args = ap.parse_args()

    source = fetch_template(args.sdist, args.cache_dir)
    golden = make_template(source, case_sensitive_dictsort=True)
    stock = make_template(source, case_sensitive_dictsort=False)
    out_cases = []
    for name, messages, options in cases():
        case = {"name": name, "messages": messages, "options": options}
        kw = template_kwargs(messages, options)
        try:
            expected = golden.render(**kw)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
            out_cases.append(case)
            continue
        hidden = golden.render(**template_kwargs(hide_markers(messages), hide_markers(options)))
        segments = segments_of(hidden)
        assert "".join(s for _, s in segments) == expected, name
        case["expected"] = expected
        case["segments"] = segments
        case["stock_jinja2_differs"] = stock.render(**kw) != expected
        out_cases.append(case)

    doc = {
        "generator": "tools/gen_chat_goldens.py",
        "template": {"package": PACKAGE, "sdist_sha256": SDIST_SHA256, "member": TEMPLATE_MEMBER,
                     "sha256": hashlib.sha256(source.encode()).hexdigest(), "lines": source.count("\n")},
        "jinja2_version": jinja2.__version__,
        "cases": out_cases,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "chat_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in out_cases)
    differ = sum(c.get("stock_jinja2_differs", False) for c in out_cases)
    print(f"{len(out_cases)} conversations ({errors} expected errors, {differ} where stock jinja2 dictsort "
          f"differs) -> {path}")


if __name__ == "__main__":
    main()
