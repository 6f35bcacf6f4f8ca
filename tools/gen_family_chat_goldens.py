#!/usr/bin/env python3
"""Chat-template and tokenizer goldens for the Qwen3-MoE, GPT-OSS and DeepSeek-V3 family fixtures.

1. Installs each family's published chat template into its fixture checkpoints, where the published checkpoints keep
   it: Qwen3 MoE checkpoints in `tokenizer_config.json` (`chat_template`), gpt-oss in `chat_template.jinja`. The
   template texts are in tools/chat_templates/ (sources in their fixture READMEs). The weight generators
   (gen_qwen3_moe_goldens.py, gen_gpt_oss_goldens.py) call `install_chat_template` too, so regenerating keeps them.
2. Renders the committed conversations (CASES below: system, multi-turn, tools, reasoning) with transformers'
   `apply_chat_template` (tokenize=False) and encodes text with the fixture's `tokenizer.json` through Python
   `tokenizers`, and writes `chat_golden.json` next to each checkpoint. The Rust tests
   (crates/sluice-tokenizer/tests/family_chat.rs) render the same conversations with minijinja and compare byte for
   byte.

gpt-oss's template prints the current date (`strftime_now("%Y-%m-%d")`); the goldens pin it to FIXED_DATE by
replacing the `datetime` that transformers' `strftime_now` reads, and the Rust side takes the same date as an option.

Usage: python3 tools/gen_family_chat_goldens.py   (needs transformers 5.17.0; see tools/requirements-qwen3-moe.txt)
"""

import datetime as _dt
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXED_DATE = _dt.datetime(2026, 1, 15, 9, 30, 0)

TEMPLATES = {
    "qwen3_moe": ("qwen3.jinja", "tokenizer_config"),
    "gpt_oss": ("gpt_oss.jinja", "jinja_file"),
    "deepseek_v3": ("deepseek_r1.jinja", "tokenizer_config"),
    "kimi_k2": ("kimi_k2.jinja", "jinja_file"),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "description": "Forecast days", "default": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
    }, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the notes",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "limit": {"type": "number"}}, "required": ["query"]}}}

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one sentence."}

QWEN_CASES = [
    ("user_only", [{"role": "user", "content": "What is the capital of France?"}], None, {}),
    ("system_no_think", [SYSTEM, {"role": "user", "content": "Hi there! 你好"}], None, {"enable_thinking": False}),
    ("multi_turn_reasoning", [
        SYSTEM,
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Simple arithmetic."},
        {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "<think>\nThe last answer was 4.\n</think>\n\n12."},
        {"role": "user", "content": "Thanks."},
    ], None, {}),
    ("tools_multi_step", [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich and notes about it?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Zürich", "unit": "celsius", "days": 2}}},
            {"type": "function", "function": {"name": "search", "arguments": {"query": "Zürich", "limit": 3.5}}},
        ]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "no notes"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tools_answered_no_generation_prompt", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "\nThe tool said sunny.\n"},
    ], [WEATHER_TOOL], {"add_generation_prompt": False}),
]

GPT_OSS_CASES = [
    ("user_only", [{"role": "user", "content": "What is the capital of France?"}], None, {}),
    ("developer_high_effort", [SYSTEM, {"role": "user", "content": "Hi there! 你好"}], None,
     {"reasoning_effort": "high"}),
    ("multi_turn", [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4.", "thinking": "Simple arithmetic."},
        {"role": "user", "content": "And times 3?"},
    ], None, {"reasoning_effort": "low", "model_identity": "You are sluice's test model."}),
    ("tools_call_and_result", [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "thinking": "I should call get_weather.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tools_then_final_training", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny in Paris.", "thinking": "The tool said sunny."},
    ], [WEATHER_TOOL], {"add_generation_prompt": False, "builtin_tools": ["browser", "python"]}),
]

TEXT_CASES = ["Hello, sluice", "The river keeper opened the gate at dawn.\n\n  Indented 3.14159 ü 河流",
              "<|im_start|>user\nspelled markers<|im_end|><think>", "<|start|>user<|message|>hi<|end|>"]

CASES = {"qwen3_moe": QWEN_CASES, "gpt_oss": GPT_OSS_CASES}

# DeepSeek V3/R1 (tests/fixtures/deepseek_v3/tiny-a, R1's template): its template concatenates tool-call arguments as
# strings, so they are JSON text here, as DeepSeek's API history carries them.
DEEPSEEK_CASES = [
    ("user_only", [{"role": "user", "content": "What is the capital of France?"}], None, {}),
    ("two_systems_multi_turn_reasoning", [
        SYSTEM, {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "2 + 2? 你好"},
        {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n4."},
        {"role": "user", "content": "And times 3?"},
    ], None, {}),
    ("tools_two_calls_and_outputs", [
        {"role": "user", "content": "Weather in Zürich and notes about it?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}},
            {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Zürich\"}"}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "no notes"},
        {"role": "assistant", "content": "It is 21 degrees; no notes."},
        {"role": "user", "content": "Thanks."},
    ], None, {}),
    ("tool_outputs_pending_no_generation_prompt", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "sunny"},
    ], None, {"add_generation_prompt": False}),
]

# Kimi K2 (tests/fixtures/deepseek_v3/tiny-b): tool calls in the section markers, ids "functions.NAME:INDEX".
KIMI_CASES = [
    ("user_only_default_system", [{"role": "user", "content": "What is the capital of France?"}], None, {}),
    ("system_multi_turn_reasoning", [
        SYSTEM, {"role": "user", "content": "2 + 2? 你好"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Simple arithmetic."},
        {"role": "user", "content": "And times 3?"},
    ], None, {}),
    ("tools_declared_called_and_returned", [
        {"role": "user", "content": "Weather in Zürich and notes?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
            {"id": "functions.search:1", "type": "function",
             "function": {"name": "search", "arguments": "{\"query\": \"Zürich\"}"}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "functions.search:1", "content": "no notes"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {}),
]


def deepseek_family_main():
    """tests/fixtures/deepseek_v3: tiny-a (DeepSeek R1 template, tokenizer.json) through transformers'
    apply_chat_template; tiny-b (Kimi K2, tiktoken) through transformers' own renderer
    (`render_jinja_template`, what apply_chat_template calls) because AutoTokenizer needs Kimi's remote
    tokenization_kimi.py for a tiktoken model; ids from tiktoken with the specials allowed."""
    import base64

    import tiktoken
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    import gen_k3_goldens as k3

    root = os.path.join(ROOT, "tests", "fixtures", "deepseek_v3")
    for name, family, cases in (("tiny-a", "deepseek_v3", DEEPSEEK_CASES), ("tiny-b", "kimi_k2", KIMI_CASES)):
        d = os.path.join(root, name)
        install_chat_template(d, family)
        out = {"generator": "tools/gen_family_chat_goldens.py", "versions": {"transformers": transformers.__version__},
               "date": FIXED_DATE.strftime("%Y-%m-%d"), "cases": [], "text_cases": []}
        if family == "deepseek_v3":
            tok = AutoTokenizer.from_pretrained(d)
            raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            render = lambda m, tools, kw: tok.apply_chat_template(m, tools=tools, tokenize=False, **kw)  # noqa: E731
            encode = lambda t: raw.encode(t, add_special_tokens=False).ids  # noqa: E731
            encode_text = lambda t: raw.encode(t).ids  # noqa: E731
            texts = ["Hello, sluice", "<｜User｜>hi<｜Assistant｜><think>\nok</think>"]
        else:
            cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
            ranks = {}
            for line in open(os.path.join(d, "tiktoken.model")):
                b, r = line.split()
                ranks[base64.b64decode(b)] = int(r)
            specials = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
            enc = tiktoken.Encoding(name="k2-tiny", pat_str=k3.K3_PAT, mergeable_ranks=ranks, special_tokens=specials)
            text = template_text(family)

            def render(m, tools, kw):
                kw = dict(kw)
                agp = kw.pop("add_generation_prompt")
                rendered, _ = render_jinja_template(conversations=[m], tools=tools, chat_template=text,
                                                    add_generation_prompt=agp, **kw)
                return rendered[0]
            encode = lambda t: enc.encode(t, allowed_special="all")  # noqa: E731
            encode_text = enc.encode_ordinary
            texts = ["Hello, sluice", "The keeper opened the gate at dawn. 河流"]
        for case, messages, tools, kwargs in cases:
            kwargs = {"add_generation_prompt": True, **kwargs}
            rendered = render(messages, tools, kwargs)
            out["cases"].append({"name": case, "messages": messages, "tools": tools, "kwargs": kwargs,
                                 "text": rendered, "ids": encode(rendered)})
        for t in texts:
            out["text_cases"].append({"text": t, "ids": encode_text(t)})
        with open(os.path.join(d, "chat_golden.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"deepseek_v3/{name} ({family}): {len(out['cases'])} conversations")


def template_text(family):
    with open(os.path.join(HERE, "chat_templates", TEMPLATES[family][0]), encoding="utf-8") as f:
        return f.read()


def install_chat_template(out_dir, family):
    """Puts the family's published template where its published checkpoints keep it."""
    text = template_text(family)
    if TEMPLATES[family][1] == "jinja_file":
        with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(text)
        return
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] = text
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


class _FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_DATE


def main():
    import transformers
    import transformers.utils.chat_template_utils as ctu
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ctu.datetime = _FrozenDatetime
    deepseek_family_main()
    for family, cases in CASES.items():
        for name in ("tiny-a", "tiny-b"):
            d = os.path.join(ROOT, "tests", "fixtures", family, name)
            install_chat_template(d, family)
            tok = AutoTokenizer.from_pretrained(d)
            raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            out = {"generator": "tools/gen_family_chat_goldens.py",
                   "versions": {"transformers": transformers.__version__},
                   "date": FIXED_DATE.strftime("%Y-%m-%d"), "cases": [], "text_cases": []}
            for case, messages, tools, kwargs in cases:
                kwargs = {"add_generation_prompt": True, **kwargs}
                text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
                out["cases"].append({"name": case, "messages": messages, "tools": tools, "kwargs": kwargs,
                                     "text": text, "ids": raw.encode(text, add_special_tokens=False).ids})
            for text in TEXT_CASES:
                out["text_cases"].append({"text": text, "ids": raw.encode(text).ids})
            with open(os.path.join(d, "chat_golden.json"), "w", encoding="utf-8") as f:
                json.dump(out, f, indent=1, ensure_ascii=False)
                f.write("\n")
            print(f"{family}/{name}: {len(out['cases'])} conversations")


if __name__ == "__main__":
    main()
