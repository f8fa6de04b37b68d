"""The official `openai` Python client calling tools through `fornax serve`: two tools, a
conversation; tool_choice required (streamed and not, parallel or one call), named
(streamed and not) and auto, sampled at temperature 0.7; then the conversation goes on
with the calls' results. Every call's arguments are checked against the tool's schema
with `jsonschema`. Prints one JSON object for the Rust test to check.

Usage: tools_client.py BASE_URL MODEL
"""

import json
import sys

import jsonschema
import openai

base_url, model = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

weather = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
clock = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
schemas = {"get_weather": weather, "get_time": clock}
tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": weather, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone.",
                                      "parameters": clock}},
]
messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris, and what time is it there?"},
]


def check(calls):
    """Each call's name and arguments: (name, arguments, error or None)."""
    out = []
    for name, arguments in calls:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
            out.append((name, arguments, None))
        except Exception as e:  # noqa: BLE001 - reported to the Rust test
            out.append((name, arguments, f"{type(e).__name__}: {e}"))
    return out


def whole(seed, **kwargs):
    r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=120,
                                       temperature=0.7, seed=seed, **kwargs)
    c = r.choices[0]
    calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    ids = [t.id for t in c.message.tool_calls or []]
    return {"finish_reason": c.finish_reason, "content": c.message.content, "calls": check(calls), "ids": ids}


def streamed(seed, **kwargs):
    stream = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=120,
                                            temperature=0.7, seed=seed, stream=True, **kwargs)
    calls, content, finish = {}, "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            if d.id:
                entry["id"] = d.id
            if d.function and d.function.name:
                entry["name"] += d.function.name
            if d.function and d.function.arguments:
                entry["arguments"] += d.function.arguments
    ordered = [calls[i] for i in sorted(calls)]
    return {"finish_reason": finish, "content": content,
            "calls": check([(c["name"], c["arguments"]) for c in ordered]), "ids": [c["id"] for c in ordered]}


named = {"type": "function", "function": {"name": "get_time"}}
out = {
    "required": whole(1, tool_choice="required"),
    "required_one_streamed": streamed(2, tool_choice="required", parallel_tool_calls=False),
    "named": whole(3, tool_choice=named),
    "named_streamed": streamed(4, tool_choice=named),
    "auto": whole(5),
}

# The conversation goes on with the results of the first answer's calls.
first = out["required"]
follow = messages + [{
    "role": "assistant", "content": None,
    "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                   for i, (n, a, _) in zip(first["ids"], first["calls"])],
}] + [{"role": "tool", "tool_call_id": i, "content": "18 degrees, sunny" if n == "get_weather" else "14:05"}
      for i, (n, _, _) in zip(first["ids"], first["calls"])]
r = client.chat.completions.create(model=model, messages=follow, tools=tools, tool_choice="none",
                                   max_tokens=40, temperature=0)
out["after_results"] = {"finish_reason": r.choices[0].finish_reason, "content": r.choices[0].message.content}

try:
    client.chat.completions.create(model=model, messages=messages, tools=tools,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    out["unknown_tool"] = None
except openai.BadRequestError as e:
    out["unknown_tool"] = e.body

json.dump(out, sys.stdout)
