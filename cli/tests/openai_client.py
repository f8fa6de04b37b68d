"""The official `openai` Python client against `fornax serve`: a chat completion and a
streamed completion, both greedy. Prints one JSON object for the Rust test to check.

Usage: openai_client.py BASE_URL MODEL CHAT_PROMPT COMPLETION_PROMPT MAX_TOKENS [API_KEY]
"""

import json
import sys

import openai

base_url, model, chat_prompt, completion_prompt, max_tokens = sys.argv[1:6]
max_tokens = int(max_tokens)
api_key = sys.argv[6] if len(sys.argv) > 6 else "unused"
client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": chat_prompt}],
    max_tokens=max_tokens,
    temperature=0,
)

stream = client.completions.create(
    model=model,
    prompt=completion_prompt,
    max_tokens=max_tokens,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
text, chunks, usage = "", 0, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].text
        chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens

print(
    json.dumps(
        {
            "chat": chat.choices[0].message.content,
            "chat_completion_tokens": chat.usage.completion_tokens,
            "streamed": text,
            "streamed_completion_tokens": usage,
            "chunks": chunks,
            "models": [m.id for m in client.models.list()],
        }
    )
)
