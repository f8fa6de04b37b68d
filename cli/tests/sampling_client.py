"""The official `openai` Python client asking `fornax serve` for log-probabilities, echo
(with the prompt's log-probabilities), logit biases, penalties and extra stop token ids, on both routes, streamed and not, all
greedy. Prints each response (as the client parsed it) for the Rust test to check.

Usage: sampling_client.py BASE_URL MODEL
"""

import json
import sys

import openai

base_url, model = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
out = {}

chat = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3,
)
out["chat"] = chat.model_dump()

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3,
    stream=True,
)
out["chat_stream"] = [chunk.model_dump() for chunk in stream]

completion = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2,
)
out["completion"] = completion.model_dump()

echo = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True,
)
out["echo"] = echo.model_dump()

# The prompt's log-probabilities with its echo: two choices, then streamed.
echo_logprobs = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True,
    logprobs=2, n=2,
)
out["echo_logprobs"] = echo_logprobs.model_dump()

stream = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True,
    logprobs=2, stream=True,
)
out["echo_logprobs_stream"] = [chunk.model_dump() for chunk in stream]

# Token 314 selected at every step by a +100 bias; a penalty and min_p are accepted.
biased = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=0,
    logit_bias={"314": 100}, presence_penalty=0.5, frequency_penalty=0.5,
    extra_body={"repetition_penalty": 1.1, "min_p": 0.05},
)
out["biased"] = biased.model_dump()

# The same bias with token 314 as a stop token id: the output ends at its first token.
stopped = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=5, temperature=0,
    logit_bias={"314": 100}, extra_body={"stop_token_ids": [314]},
)
out["stopped"] = stopped.model_dump()

json.dump(out, sys.stdout)
