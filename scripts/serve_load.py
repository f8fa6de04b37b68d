#!/usr/bin/env python3
"""A bounded load run of `fornax serve` on loopback (not a test: it prints figures).

Starts the server, runs mixed clients through the official `openai` package for a fixed
time (streamed and whole completions and chats, some clients hanging up mid-stream),
samples the server's RSS, then checks that every KV block came back, stops the server
with SIGTERM and reports.

    PYTHONPATH=~/.cache/fornax/python scripts/serve_load.py --duration 180 --clients 8

`--keys N` serves with N API keys (a keys file in a temporary folder, classes 0..3 in
turn): each client sends one of them, and the run ends by checking that no key appears
in the server's log or metrics.
"""

import argparse
import os
import random
import re
import statistics
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import openai

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "Write a short poem about the sea.",
    "Explain why the sky is blue.",
    "List three uses of a paperclip.",
    "What is 12 times 7?",
    "Describe a cat to someone who has never seen one.",
    "Give me a recipe for pancakes.",
]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metrics_text(base, key):
    request = urllib.request.Request(base + "/metrics")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    return urllib.request.urlopen(request, timeout=10).read().decode()


def scrape(base, key=None):
    text = metrics_text(base, key)
    values = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if m and m.group(2) is None:
            values[m.group(1)] = float(m.group(3))
    return values


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.hung_up = 0
        self.tokens = 0
        self.latency = []
        self.ttft = []
        self.errors = []

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                if isinstance(getattr(self, k), list):
                    getattr(self, k).append(v)
                else:
                    setattr(self, k, getattr(self, k) + v)


def client(base, model, deadline, seed, tally, key):
    rng = random.Random(seed)
    api = openai.OpenAI(base_url=base + "/v1", api_key=key or "unused", max_retries=0, timeout=600)
    while time.time() < deadline:
        prompt = rng.choice(PROMPTS)
        max_tokens = rng.randint(8, 48)
        kind = rng.choice(["stream", "stream", "whole", "chat-stream", "chat-whole", "hang-up"])
        started = time.time()
        try:
            if kind in ("whole", "chat-whole"):
                if kind == "whole":
                    r = api.completions.create(model=model, prompt=prompt, max_tokens=max_tokens)
                else:
                    r = api.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
                    )
                tally.add(ok=1, tokens=r.usage.completion_tokens, latency=time.time() - started)
                continue
            chat = kind == "chat-stream"
            opts = dict(model=model, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
            if chat:
                stream = api.chat.completions.create(messages=[{"role": "user", "content": prompt}], **opts)
            else:
                stream = api.completions.create(prompt=prompt, **opts)
            first = None
            pieces = 0
            for chunk in stream:
                if chunk.choices and first is None:
                    first = time.time() - started
                pieces += 1
                if kind == "hang-up" and pieces >= 3:
                    stream.close()
                    break
                if chunk.usage is not None:
                    tally.add(tokens=chunk.usage.completion_tokens)
            if kind == "hang-up":
                tally.add(hung_up=1)
            else:
                tally.add(ok=1, latency=time.time() - started, ttft=first)
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            tally.add(failed=1, errors=f"{kind}: {e!r}")


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="target/release/fornax")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--duration", type=float, default=180, help="seconds of load")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the run before RSS is compared")
    ap.add_argument("--keys", type=int, default=0, help="serve with this many API keys")
    ap.add_argument("extra", nargs="*", help="more `fornax serve` flags (after --)")
    a = ap.parse_args()

    keys, key_args = [], []
    folder = tempfile.TemporaryDirectory()
    if a.keys:
        keys = [f"sk-load-{secrets.token_hex(12)}" for _ in range(a.keys)]
        path = os.path.join(folder.name, "keys")
        with open(path, "w") as f:
            for i, key in enumerate(keys):
                f.write(f"{key} load-{i} {i % 4}\n")
        key_args = ["--api-keys", path]
    log = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen(
        [a.binary, "serve", "--backend", a.backend, "--port", "0", *key_args, *a.extra],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    line = server.stdout.readline()
    m = re.search(r"serving (\S+) on (http://\S+)", line)
    if not m:
        sys.exit(f"unexpected first line: {line!r}")
    model, base = m.group(1), m.group(2)
    print(f"server pid {server.pid}: {model} at {base}, {a.clients} clients for {a.duration:.0f} s", flush=True)
    key0 = keys[0] if keys else None
    idle = scrape(base, key0)

    tally = Tally()
    start = time.time()
    deadline = start + a.duration
    threads = [
        threading.Thread(
            target=client, args=(base, model, deadline, seed, tally, keys[seed % len(keys)] if keys else None)
        )
        for seed in range(a.clients)
    ]
    for t in threads:
        t.start()
    rss = []
    while any(t.is_alive() for t in threads):
        rss.append((time.time() - start, rss_kib(server.pid)))
        time.sleep(2)
    elapsed = time.time() - start

    settled = None
    for _ in range(300):
        now = scrape(base, key0)
        if now.get("fornax_kv_blocks_used") == idle.get("fornax_kv_blocks_used", 0) and now.get(
            "fornax_requests_running"
        ) == 0:
            settled = now
            break
        time.sleep(0.1)
    final = settled or scrape(base, key0)
    page = metrics_text(base, key0)

    server.send_signal(15)
    code = server.wait(timeout=120)
    log.seek(0)
    server_log = log.read()
    keys_shown = [k for k in keys if k in server_log or k in page]

    warm = [kib for t, kib in rss if t >= a.warmup * a.duration]
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| requests completed | {tally.ok} |")
    print(f"| requests failed | {tally.failed} |")
    print(f"| clients that hung up mid-stream (cancelled) | {tally.hung_up} |")
    print(f"| generated tokens (usage) | {tally.tokens} |")
    print(f"| throughput | {tally.tokens / elapsed * 60:.0f} tokens/min |")
    print(f"| latency P50 / P99 | {pct(tally.latency, 50):.2f} / {pct(tally.latency, 99):.2f} s |")
    print(f"| streamed TTFT P50 / P99 | {pct(tally.ttft, 50):.2f} / {pct(tally.ttft, 99):.2f} s |")
    print(
        f"| KV blocks used after the run | {final.get('fornax_kv_blocks_used')} "
        f"(idle {idle.get('fornax_kv_blocks_used')}) |"
    )
    print(f"| requests running after the run | {final.get('fornax_requests_running')} |")
    print(f"| preemptions | {final.get('fornax_preemptions_total', 0):.0f} |")
    if warm:
        # Compare the peaks of the two halves after warm-up: a leak raises the second.
        half = len(warm) // 2
        first, second = max(warm[: half or 1]), max(warm[half:])
        print(
            f"| server RSS peak, first / second half after warm-up | {first / 1024:.1f} / "
            f"{second / 1024:.1f} MiB ({(second - first) / first * 100:+.1f}%) |"
        )
        print(f"| server RSS at the end | {warm[-1] / 1024:.1f} MiB |")
    print(f"| exit status after SIGTERM | {code} |")
    if keys:
        by_key = re.findall(r'^fornax_key_requests_total\{(?:class="(\d)",key="([^"]+)"|key="([^"]+)",class="(\d)")\} (\S+)$', page, re.M)
        print(f"| API keys | {len(keys)}, requests by key and class: " + ", ".join(
            f"{m[1] or m[2]}/{m[0] or m[3]} {float(m[4]):.0f}" for m in by_key) + " |")
        print(f"| keys in the server's log or metrics | {len(keys_shown)} |")
    for e in tally.errors[:10]:
        print("error:", e)
    leaked = settled is None
    sys.exit(1 if tally.failed or leaked or keys_shown or code != 0 else 0)


if __name__ == "__main__":
    main()
