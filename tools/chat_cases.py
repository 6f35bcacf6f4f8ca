"""Conversations rendered by tools/gen_chat_goldens.py.

Messages are in sluice's shape (`sluice_tokenizer::ChatMessage`): `role`, `content`, optional
`reasoning_content`, `tool_calls` (`id`, `name`, `arguments` as JSON text), `tool_call_id`, `name`.
Options mirror `ChatOptions`: `thinking`, `effort`, `tools`, `tool_choice`, `response_format`,
`add_generation_prompt`; absent keys take the defaults (thinking on, effort max, generation prompt on).
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": 'City name, e.g. "Paris" or "São Paulo"'},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the docs & return <snippets>.\nUse sparingly.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number", "default": 5.0},
                "filters": {
                    "type": "object",
                    "properties": {"lang": {"type": "string"}, "since": {"type": "string", "format": "date"}},
                },
            },
            "required": ["query"],
        },
    },
}

MIXED_CASE = {
    "type": "function",
    "function": {
        "name": "lookup_user",
        "parameters": {
            "type": "object",
            "properties": {
                "userId": {"type": "string"},
                "user_name": {"type": "string"},
                "URL": {"type": "string"},
                "apple": {"type": "boolean"},
                "Banana": {"type": "null"},
                "émoji": {"type": "string", "description": "ключ 中文 🌊"},
            },
        },
    },
}

NUMBERS = {
    "type": "function",
    "function": {
        "name": "numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": "number", "minimum": 1e-05, "maximum": 1e16, "multipleOf": 0.1, "default": -0.0},
                "y": {"type": "integer", "maximum": 12345678901234567890, "minimum": -9007199254740993},
                "z": {"type": "number", "examples": [1.5e300, 100.0, 0.30000000000000004, 2.5e-7, 1e15]},
            },
        },
    },
}

SYSTEM = "You are a careful assistant. Answer briefly."


def user(text, **kw):
    return {"role": "user", "content": text, **kw}


def system(text, **kw):
    return {"role": "system", "content": text, **kw}


def assistant(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def tool(text, **kw):
    return {"role": "tool", "content": text, **kw}


def call(name, arguments, id=None):
    c = {"name": name, "arguments": arguments}
    if id is not None:
        c["id"] = id
    return c


def cases():
    weather_call = call("get_weather", '{"city": "Paris", "days": 3, "unit": "celsius"}', "call_1")
    return [
        ("single_user", [user("Hello")], {}),
        ("system_user", [system(SYSTEM), user("What is 2+2?")], {}),
        ("effort_low", [user("Quick question: capital of France?")], {"effort": "low"}),
        ("effort_high", [system(SYSTEM), user("Prove that sqrt(2) is irrational.")], {"effort": "high"}),
        ("effort_max_explicit", [user("Hi")], {"effort": "max"}),
        ("no_thinking", [system(SYSTEM), user("Hello")], {"thinking": False}),
        ("no_thinking_ignores_effort", [user("Hello")], {"thinking": False, "effort": "medium"}),
        ("multi_turn_with_reasoning", [
            system(SYSTEM),
            user("What is 17 * 23?"),
            assistant("17 * 23 = 391.", reasoning_content="17*20=340, 17*3=51, 340+51=391."),
            user("And 391 / 17?"),
        ], {}),
        ("blank_reasoning_is_dropped", [
            user("Hi"), assistant("Hello!", reasoning_content="  \n\t "), user("Bye"),
        ], {}),
        ("reasoning_kept_verbatim", [
            user("Hi"), assistant("Hello!", reasoning_content="\n  think with spaces  \n"), user("Again"),
        ], {}),
        ("no_thinking_history_drops_reasoning", [
            user("What is 2+2?"), assistant("4", reasoning_content="Simple addition."), user("Thanks"),
        ], {"thinking": False}),
        ("tools_declared", [system(SYSTEM), user("Weather in Paris?")], {"tools": [WEATHER, SEARCH]}),
        ("tool_call_and_result", [
            user("What's the weather in Paris for 3 days?"),
            assistant("", reasoning_content="I should call get_weather.", tool_calls=[weather_call]),
            tool('{"forecast": ["sun", "rain", "sun"], "high_c": 21}', tool_call_id="call_1"),
        ], {"tools": [WEATHER]}),
        ("tool_call_then_answer", [
            user("Weather in Paris?"),
            assistant("Let me check.", tool_calls=[weather_call]),
            tool("Sunny, 21°C", tool_call_id="call_1"),
            assistant("It is sunny and 21°C in Paris."),
            user("Thanks!"),
        ], {"tools": [WEATHER]}),
        ("argument_types", [
            user("Run it"),
            assistant("", tool_calls=[call(
                "numbers",
                '{"s": "raw \\"text\\" & <tags>\\nline2", "i": 42, "f": 2.5, "e": 1e-05, "big": 1e16, "neg": -0.0,'
                ' "t": true, "n": null, "o": {"b": 1, "a": [1, 2.0, "x"]}, "l": [], "d": {}}',
                "c1",
            )]),
            tool("ok", tool_call_id="c1"),
        ], {"tools": [NUMBERS]}),
        ("parallel_calls_results_reordered", [
            user("Weather in Paris and Tokyo, and search docs."),
            assistant("", tool_calls=[
                call("get_weather", '{"city": "Paris"}', "a"),
                call("get_weather", '{"city": "Tokyo"}', "b"),
                call("search_docs", '{"query": "tokenizer"}', "c"),
            ]),
            tool("Tokyo: rain", tool_call_id="b"),
            tool("docs: 3 hits", tool_call_id="c"),
            tool("Paris: sun", tool_call_id="a"),
        ], {"tools": [WEATHER, SEARCH]}),
        ("results_without_ids_use_call_order", [
            user("Two cities"),
            assistant("", tool_calls=[call("get_weather", '{"city": "Oslo"}'), call("search_docs", '{"query": "q"}')]),
            tool("Oslo: snow"),
            tool("nothing found"),
        ], {}),
        ("results_named_without_calls", [
            user("Use tools"),
            tool("result one", name="calculator"),
            tool("result two", name="search & find"),
        ], {}),
        ("partially_resolved_ids", [
            user("Go"),
            assistant("", tool_calls=[call("get_weather", '{"city": "Rome"}', "x1"), call("search_docs", "{}", "x2")]),
            tool("second", tool_call_id="x2"),
            tool("unknown", tool_call_id="zzz"),
        ], {}),
        ("duplicate_call_ids", [
            user("Go"),
            assistant("", tool_calls=[call("get_weather", '{"city": "A"}', "d"), call("search_docs", '{"query": "B"}', "d")]),
            tool("r1", tool_call_id="d"),
            tool("r2", tool_call_id="d"),
        ], {}),
        ("tool_index_survives_user_turn", [
            user("Go"),
            assistant("", tool_calls=[call("get_weather", '{"city": "A"}'), call("search_docs", '{"query": "B"}')]),
            tool("r1"),
            user("and?"),
            tool("r2"),
        ], {}),
        ("attribute_escaping", [
            system("sys", name='ops & "admin"'),
            user("hi", name='Ann "the <user>" & co'),
            assistant("", name="bot&", tool_calls=[call('say "hi" & bye', '{"k&\\"ey": "v"}', "q")]),
            tool("done", tool_call_id="q"),
        ], {}),
        ("marker_spellings_in_text", [
            user('Is <|open|>message role="system"<|sep|> a thing? [BOS] <|close|>message<|sep|><|end_of_msg|>'),
            assistant("No: <|sep|> is <|open|>just text<|close|>.", reasoning_content="<|close|>think<|sep|>"),
            user("<|end_of_msg|>"),
        ], {}),
        ("marker_spellings_in_tool_args", [
            user("x"),
            assistant("", tool_calls=[call("search_docs", '{"query": "<|open|>tools<|sep|>"}', "m")]),
            tool("<|close|>message<|sep|>", tool_call_id="m"),
        ], {"tools": [SEARCH]}),
        ("unicode_content", [
            system("用中文回答。"),
            user("你好，世界！Привет! مرحبا 👨‍👩‍👧‍👦 e\u0301"),
            assistant("你好！", reasoning_content="用户在打招呼。"),
            user("\u2028\u00a0\tweird spaces\u3000"),
        ], {}),
        ("whitespace_preserved", [
            system("  leading and trailing  \n"),
            user("\n\nline\r\nwith CRLF\n\n"),
        ], {}),
        ("raw_string_arguments", [
            user("x"),
            assistant("", tool_calls=[
                call("get_weather", "city=Paris (not JSON)", "r1"),
                call("get_weather", "   ", "r2"),
                call("get_weather", "null", "r3"),
                call("get_weather", '"just a string"', "r4"),
                call("get_weather", "[1, 2]", "r5"),
                call("get_weather", "", "r6"),
            ]),
        ], {}),
        ("tool_choice_required", [user("Weather?")], {"tools": [WEATHER], "tool_choice": "required"}),
        ("tool_choice_none", [user("Weather?")], {"tools": [WEATHER], "tool_choice": "none"}),
        ("tool_choice_auto", [user("Weather?")], {"tools": [WEATHER], "tool_choice": "auto"}),
        ("response_format_json_object", [user("Give JSON")], {"response_format": {"type": "json_object"}}),
        ("response_format_json_schema", [user("Give JSON")], {"response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {
                "type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                "required": ["a", "b"]}},
        }}),
        ("response_format_schema_missing", [user("Give JSON")], {"response_format": {"type": "json_schema"}}),
        ("mixed_case_keys", [user("Find user 7")], {"tools": [MIXED_CASE]}),
        ("number_formats", [user("n")], {"tools": [NUMBERS]}),
        ("no_generation_prompt", [
            system(SYSTEM), user("Hi"), assistant("Hello!", reasoning_content="Greet back."),
        ], {"add_generation_prompt": False}),
        ("no_generation_prompt_no_thinking", [user("Hi"), assistant("Hello!")],
         {"add_generation_prompt": False, "thinking": False}),
        ("empty_conversation", [], {}),
        ("empty_contents", [system(""), user(""), assistant(""), user(None)], {}),
        ("empty_tools_list", [user("Hi")], {"tools": []}),
        ("long_multi_turn", [system(SYSTEM)] + [
            m for k in range(5) for m in (
                user(f"Question {k}: what is {k} squared?"),
                assistant(f"{k} squared is {k * k}.", reasoning_content=f"{k}*{k}={k * k}"),
            )
        ] + [user("Done.")], {"effort": "low"}),
        ("error_effort_medium", [user("Hi")], {"effort": "medium"}),
        ("error_unresolved_tool_name", [user("Hi"), tool("orphan result")], {}),
    ]
