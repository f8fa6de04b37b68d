#!/usr/bin/env python3
"""Renders the published chat templates in tests/reference/templates/ with transformers'
renderer (Jinja2, as `apply_chat_template` renders them) for conversations with tools,
calls and results, and writes tests/reference/templates/renders.json. The fornax-tests
`templates` tests render the same inputs with our minijinja path and compare.

Run once, by hand (it needs only transformers and jinja2, not torch):
    pip install --target /tmp/tfpy transformers==4.57.1 jinja2
    PYTHONPATH=/tmp/tfpy python3 scripts/template-references.py
"""

import json
import os

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.join(os.path.dirname(__file__), "..", "tests", "reference", "templates")

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "La météo d'une ville <aujourd'hui> & demain",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Ville, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}

def call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}

TWO_CALLS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {"role": "assistant", "content": "", "tool_calls": [
        call("c1", "get_weather", {"city": "Paris", "days": [1, 2], "note": "é \"q\""}),
        call("c2", "now", {})]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "c1"},
    {"role": "tool", "content": "12:00", "tool_call_id": "c2"},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]
ONE_CALL = [
    {"role": "system", "content": "  You are terse.  "},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        call("c1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "c1"},
    {"role": "user", "content": "And in Lyon?"},
]
THINKING = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>\nI should call it.\n</think>\n\n", "tool_calls": [
        call("c1", "get_weather", {"city": "Paris"})]},
    {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nIt is sunny."},
    {"role": "user", "content": "Thanks"},
]
PLAIN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]

SPECIALS = {
    "qwen2.5-instruct": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "llama3.2-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
}

CASES = [
    ("qwen2.5-instruct", TWO_CALLS, [WEATHER, NOW], {}),
    ("qwen2.5-instruct", PLAIN, None, {}),
    ("qwen3", TWO_CALLS, [WEATHER, NOW], {}),
    ("qwen3", THINKING, [WEATHER], {"enable_thinking": False}),
    ("qwen3", PLAIN, None, {}),
    ("llama3.2-instruct", ONE_CALL, [WEATHER, NOW], {"date_string": "05 Dec 2026"}),
    ("llama3.2-instruct", ONE_CALL, [WEATHER], {"date_string": "05 Dec 2026",
                                                "tools_in_user_message": False}),
    ("llama3.2-instruct", PLAIN, None, {"date_string": "05 Dec 2026"}),
]


def main():
    out = []
    for name, messages, tools, kwargs in CASES:
        source = open(os.path.join(HERE, name + ".jinja")).read()
        bos, eos = SPECIALS[name]
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=source,
            add_generation_prompt=True, bos_token=bos, eos_token=eos, **kwargs)
        out.append({"template": name, "messages": messages, "tools": tools,
                    "kwargs": kwargs, "bos_token": bos, "eos_token": eos,
                    "text": rendered[0]})
    doc = {"transformers": transformers.__version__, "cases": out}
    with open(os.path.join(HERE, "renders.json"), "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} renders")


if __name__ == "__main__":
    main()
