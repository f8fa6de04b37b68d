"""The official `openai` Python client asking `fornax serve` for structured outputs: a
chat completion under a JSON schema (streamed and not) and a completion in JSON mode, at
temperature 0.7, then vLLM's `structured_outputs` (a regex, a list of choices). Each JSON
output is parsed and validated with `jsonschema`. Prints one JSON object for the Rust
test to check.

Usage: structured_client.py BASE_URL MODEL
"""

import json
import re
import sys

import jsonschema
import openai

base_url, model = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["city", "country", "population", "landmarks"],
    "additionalProperties": False,
}
response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
messages = [{"role": "user", "content": "Describe Paris in JSON."}]

results = []
chat = client.chat.completions.create(
    model=model, messages=messages, max_tokens=200, temperature=0.7, seed=1,
    response_format=response_format,
)
results.append(("chat", chat.choices[0].message.content, chat.choices[0].finish_reason, schema))

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=200, temperature=0.7, seed=2,
    response_format=response_format, stream=True,
)
text, finish = "", None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
results.append(("chat streamed", text, finish, schema))

completion = client.completions.create(
    model=model, prompt="A JSON object describing a cat:", max_tokens=200, temperature=0.7,
    seed=3, extra_body={"response_format": {"type": "json_object"}},
)
results.append(("completion json_object", completion.choices[0].text, completion.choices[0].finish_reason, {"type": "object"}))

out = []
for name, text, finish, want in results:
    error = None
    try:
        jsonschema.validate(json.loads(text), want)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    out.append({"name": name, "text": text, "finish_reason": finish, "error": error})

# vLLM's structured_outputs: a regex on completions, a list of choices on chat.
regex = client.completions.create(
    model=model, prompt="A phone number:", max_tokens=20, temperature=0.7, seed=4,
    extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
)
text = regex.choices[0].text
error = None if re.fullmatch("[0-9]{3}-[0-9]{4}", text) else f"no match: {text!r}"
out.append({"name": "completion regex", "text": text, "finish_reason": regex.choices[0].finish_reason, "error": error})
choices = ["positive", "negative", "neutral"]
choice = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Is 'I love it' positive or negative?"}],
    max_tokens=20, temperature=0.7, seed=5, extra_body={"structured_outputs": {"choice": choices}},
)
text = choice.choices[0].message.content
error = None if text in choices else f"not a choice: {text!r}"
out.append({"name": "chat choice", "text": text, "finish_reason": choice.choices[0].finish_reason, "error": error})
print(json.dumps(out))
