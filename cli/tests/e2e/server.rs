//! `fornax serve` on the real model (CPU backend), started as a process on 127.0.0.1 and
//! spoken to over HTTP: answers equal the engine's own greedy output, streams, concurrency,
//! metrics, the official `openai` Python client, bad input, disconnects, a full queue and
//! SIGTERM.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fornax_engine::gguf::GgufFile;
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use serde_json::{json, Value};

pub(crate) const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";
pub(crate) const COMPLETION_PROMPT: &str = "The capital of France is";
const CHAT_PROMPT: &str = "What is the capital of France?";
pub(crate) const MAX_TOKENS: usize = 12;

fn model_path() -> PathBuf {
    fornax_engine::store::ensure_default_model(&mut |s| eprintln!("{s}")).expect("default model")
}

/// A `fornax serve` process, killed on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
    agent: ureq::Agent,
    /// Everything the server wrote to stderr so far.
    pub(crate) log: Arc<Mutex<String>>,
}

/// A response: status, headers of interest and the body parsed as JSON.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
    /// The raw body.
    pub(crate) text: String,
    pub(crate) header: std::collections::HashMap<String, String>,
}

impl Server {
    pub(crate) fn start(extra: &[&str]) -> Self {
        Self::launch(extra, &[])
    }

    /// With extra arguments and environment variables (logs at `info`).
    pub(crate) fn launch(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::serving(&model_path(), extra, env)
    }

    /// Serving the model file at `model`.
    pub(crate) fn serving(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fornax"))
            .args([
                "serve",
                "--backend",
                "cpu",
                "--port",
                "0",
                "--batch-window-ms",
                "20",
            ])
            .arg("--model")
            .arg(model)
            .args(extra)
            .env("RUST_LOG", if env.is_empty() { "warn" } else { "info" })
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start fornax serve");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, addr)) = line.split_once(" on http://") {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("the server printed its address");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(300)))
            .build()
            .into();
        Self {
            child,
            addr,
            agent,
            log,
        }
    }

    /// A request with `Authorization: Bearer key` (when given) and a JSON body (when
    /// given: POST, else GET).
    pub(crate) fn send(&self, path: &str, body: Option<&Value>, key: Option<&str>) -> Reply {
        let bearer = key.map(|k| format!("Bearer {k}"));
        self.send_authorized(path, body, bearer.as_deref())
    }

    /// [`Self::send`] with `authorization` as the raw `Authorization` header.
    pub(crate) fn send_authorized(
        &self,
        path: &str,
        body: Option<&Value>,
        authorization: Option<&str>,
    ) -> Reply {
        let url = self.url(path);
        let mut r = match body {
            Some(b) => {
                let mut req = self
                    .agent
                    .post(&url)
                    .header("content-type", "application/json");
                if let Some(a) = authorization {
                    req = req.header("authorization", a);
                }
                req.send(b.to_string().as_bytes())
            }
            None => {
                let mut req = self.agent.get(&url);
                if let Some(a) = authorization {
                    req = req.header("authorization", a);
                }
                req.call()
            }
        }
        .expect("request");
        let header = ["x-fornax-priority", "retry-after", "www-authenticate"]
            .iter()
            .filter_map(|h| {
                r.headers()
                    .get(*h)
                    .map(|v| (h.to_string(), v.to_str().unwrap().to_string()))
            })
            .collect();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            body,
            text,
            header,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs raw bytes; returns the status and the body parsed as JSON.
    fn post_raw(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let mut r = self
            .agent
            .post(&self.url(path))
            .header("content-type", "application/json")
            .send(body)
            .expect("request");
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().expect("body");
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, value)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().as_bytes())
    }

    /// Starts a streamed request; returns the event reader once the headers arrived.
    pub(crate) fn stream(&self, path: &str, body: &Value) -> Events {
        self.stream_as(path, body, None)
    }

    /// [`Self::stream`] with `Authorization: Bearer key` when given.
    pub(crate) fn stream_as(&self, path: &str, body: &Value, key: Option<&str>) -> Events {
        let mut req = self
            .agent
            .post(&self.url(path))
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        let r = req.send(body.to_string().as_bytes()).expect("request");
        assert_eq!(r.status().as_u16(), 200, "stream status");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Events(BufReader::new(Box::new(r.into_body().into_reader())))
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut r = self.agent.get(&self.url(path)).call().expect("request");
        (
            r.status().as_u16(),
            r.body_mut().read_to_string().expect("body"),
        )
    }

    pub(crate) fn metrics(&self) -> Metrics {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        Metrics::parse(&text)
    }
}

impl Metrics {
    pub(crate) fn parse(text: &str) -> Self {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("Prometheus text format");
        Metrics(scrape)
    }
}

impl Server {
    pub(crate) fn assert_healthy(&self) {
        assert_eq!(self.get("/health").0, 200, "healthy");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Server-sent events of one response.
pub(crate) struct Events(BufReader<Box<dyn Read + Send>>);

impl Events {
    /// The next `data:` payload as JSON, or `None` at `[DONE]`.
    pub(crate) fn next(&mut self) -> Option<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.0.read_line(&mut line).expect("read the stream");
            assert!(n > 0, "the stream ended without [DONE]");
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                if data == "[DONE]" {
                    return None;
                }
                return Some(serde_json::from_str(data).expect("JSON chunk"));
            }
        }
    }

    /// Every chunk up to `[DONE]`.
    pub(crate) fn rest(mut self) -> Vec<Value> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// A parsed `/metrics` scrape.
pub(crate) struct Metrics(prometheus_parse::Scrape);

impl Metrics {
    /// A counter's or gauge's value (0 when absent), matching `labels`.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        use prometheus_parse::Value as V;
        self.0
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                V::Counter(v) | V::Gauge(v) | V::Untyped(v) => v,
                _ => panic!("{name} is not a single value"),
            })
            .sum()
    }

    /// A histogram's cumulative bucket counts.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        self.0
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(b) => {
                    b.iter().map(|c| (c.less_than, c.count)).collect()
                }
                _ => panic!("{name} is not a histogram"),
            })
            .unwrap_or_default()
    }

    fn has(&self, name: &str) -> bool {
        self.0.samples.iter().any(|s| s.metric == name)
    }
}

pub(crate) fn completion(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "stream": stream, "stream_options": {"include_usage": true}})
}

fn chat(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
           "max_tokens": max_tokens, "temperature": 0, "stream": stream,
           "stream_options": {"include_usage": true}})
}

/// The engine's own greedy text and token count for a prompt, as `fornax generate` gives them.
struct Expected {
    text: String,
    tokens: usize,
}

/// Greedy generations of the completion and chat prompts by the engine outside the server:
/// `fornax generate` on the plain (contiguous) cache, CPU backend. Its prompt ids are
/// checked against the tokenizer's encoding of the same request.
fn reference() -> (Expected, Expected) {
    let path = model_path();
    let file = fornax_engine::store::ModelFile::open(&path).unwrap();
    let gguf = GgufFile::parse(file.bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let stop_ids = tok.stop_ids();
    let run = |prompt_ids: Vec<u32>, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fornax"))
            .args(["generate", "--json", "--backend", "cpu", "--contiguous-kv"])
            .args(["--max-tokens", &MAX_TOKENS.to_string()])
            .arg("--model")
            .arg(&path)
            .args(args)
            .output()
            .expect("run fornax generate");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids = |key: &str| -> Vec<u32> { serde_json::from_value(out[key].clone()).unwrap() };
        assert_eq!(ids("prompt_ids"), prompt_ids, "{args:?}");
        let generated = ids("generated_ids");
        let shown: Vec<u32> = generated
            .iter()
            .copied()
            .filter(|t| !stop_ids.contains(t))
            .collect();
        Expected {
            text: tok.decode(&shown).unwrap(),
            tokens: generated.len(),
        }
    };
    let completion = run(
        tok.encode(COMPLETION_PROMPT, true).unwrap(),
        &[COMPLETION_PROMPT],
    );
    let chat = run(
        tok.encode_chat(&[ChatMessage::new("user", CHAT_PROMPT)])
            .unwrap(),
        &["--chat", CHAT_PROMPT],
    );
    (completion, chat)
}

/// Runs the Python script `tests/{script}` against `server` with `args` after the
/// server's URL and the model name; returns what it printed, as JSON. scripts/test.sh
/// installs its packages (`openai`, `jsonschema`) under FORNAX_PYTHONPATH.
fn python_client(script: &str, server: &Server, args: &[&str]) -> Value {
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .env(
            "PYTHONPATH",
            std::env::var("FORNAX_PYTHONPATH").unwrap_or_default(),
        )
        .arg(path)
        .args([server.url(""), MODEL.to_string()])
        .args(args)
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed (scripts/test.sh installs its packages and sets FORNAX_PYTHONPATH):\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).expect("client output")
}

/// Runs `tests/openai_client.py` (the official client: a chat completion and a streamed
/// completion) against `server`, with `key` as its `api_key` when given.
pub(crate) fn openai_client(server: &Server, key: Option<&str>) -> Value {
    let max_tokens = MAX_TOKENS.to_string();
    let mut args = vec![CHAT_PROMPT, COMPLETION_PROMPT, &max_tokens];
    args.extend(key);
    python_client("openai_client.py", server, &args)
}

pub(crate) fn streamed_text(chunks: &[Value], chat: bool) -> (String, String, u64) {
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = 0;
    for c in chunks {
        if let Some(choice) = c["choices"].get(0) {
            let piece = if chat {
                &choice["delta"]["content"]
            } else {
                &choice["text"]
            };
            text.push_str(piece.as_str().unwrap_or(""));
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        if let Some(n) = c["usage"]["completion_tokens"].as_u64() {
            usage = n;
        }
    }
    (text, finish, usage)
}

#[test]
fn answers_equal_the_engine_greedy_output_through_http_and_the_openai_client() {
    let server = Server::start(&[]);
    let (want_completion, want_chat) = reference();
    eprintln!(
        "engine: completion {:?}, chat {:?}",
        want_completion.text, want_chat.text
    );
    let before = server.metrics();

    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);

    let (status, r) = server.post(
        "/v1/completions",
        &completion(COMPLETION_PROMPT, MAX_TOKENS, false),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], want_completion.text);
    assert_eq!(r["usage"]["completion_tokens"], want_completion.tokens);
    assert_eq!(r["usage"]["prompt_tokens"], 5);

    let chunks = server
        .stream(
            "/v1/completions",
            &completion(COMPLETION_PROMPT, MAX_TOKENS, true),
        )
        .rest();
    let (text, finish, usage) = streamed_text(&chunks, false);
    assert!(chunks.len() > 3, "streamed in pieces: {}", chunks.len());
    assert_eq!(text, want_completion.text);
    assert_eq!(finish, "length");
    assert_eq!(usage, want_completion.tokens as u64);

    let (status, r) = server.post(
        "/v1/chat/completions",
        &chat(CHAT_PROMPT, MAX_TOKENS, false),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["message"]["content"], want_chat.text);
    assert_eq!(r["usage"]["completion_tokens"], want_chat.tokens);

    let chunks = server
        .stream("/v1/chat/completions", &chat(CHAT_PROMPT, MAX_TOKENS, true))
        .rest();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (text, _, usage) = streamed_text(&chunks, true);
    assert_eq!(text, want_chat.text);
    assert_eq!(usage, want_chat.tokens as u64);

    // A stop string cuts the text where it starts, and the request ends there.
    let stop_at = want_completion
        .text
        .find(' ')
        .expect("a space in the reference text")
        + 1;
    let cut = want_completion.text[stop_at..]
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let mut body = completion(COMPLETION_PROMPT, MAX_TOKENS, false);
    body["stop"] = json!([cut.clone()]);
    let (_, r) = server.post("/v1/completions", &body);
    assert_eq!(
        r["choices"][0]["finish_reason"], "stop",
        "{r} (stop {cut:?})"
    );
    assert_eq!(r["choices"][0]["text"], want_completion.text[..stop_at]);

    // The official client: a chat completion and a streamed completion.
    // scripts/test.sh installs the package under FORNAX_PYTHONPATH.
    let client = openai_client(&server, None);
    eprintln!("openai client: {client}");
    assert_eq!(client["chat"], want_chat.text);
    assert_eq!(client["chat_completion_tokens"], want_chat.tokens);
    assert_eq!(client["streamed"], want_completion.text);
    assert_eq!(client["streamed_completion_tokens"], want_completion.tokens);
    assert!(client["chunks"].as_u64().unwrap() > 3);
    assert_eq!(client["models"], json!([MODEL]));

    // Counters moved by what this test did.
    let after = server.metrics();
    let ok = |m: &Metrics, route| {
        m.value(
            "fornax_http_requests_total",
            &[("route", route), ("status", "200")],
        )
    };
    assert_eq!(
        ok(&after, "/v1/completions") - ok(&before, "/v1/completions"),
        4.0
    );
    assert_eq!(
        ok(&after, "/v1/chat/completions") - ok(&before, "/v1/chat/completions"),
        3.0
    );
    let generated = after.value("fornax_generated_tokens_total", &[]);
    assert!(
        generated >= (4 * want_completion.tokens + 3 * want_chat.tokens) as f64 - 12.0,
        "{generated}"
    );
    let ttft = after.buckets("fornax_time_to_first_token_seconds");
    assert_eq!(
        ttft.last().map(|b| b.1),
        Some(7.0),
        "7 first tokens: {ttft:?}"
    );
    for name in [
        "fornax_kv_blocks_used",
        "fornax_kv_blocks_free",
        "fornax_requests_running",
        "fornax_requests_waiting",
        "fornax_preemptions_total",
        "fornax_kv_waste_ratio",
        "fornax_prompt_tokens_total",
        "fornax_prefix_lookups_total",
        "fornax_prefix_hit_rate",
        "fornax_kv_blocks_cached",
    ] {
        assert!(after.has(name), "{name} in /metrics");
    }
    assert!(!after
        .buckets("fornax_inter_token_latency_seconds")
        .is_empty());
    assert!(!after.buckets("fornax_request_latency_seconds").is_empty());
    assert!(!after.buckets("fornax_batch_sequences").is_empty());
}

#[test]
fn sixteen_concurrent_streams_all_complete_in_shared_batches() {
    let server = Server::start(&[]);
    let results: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let prompt = format!("Story {}: Once upon a time", i % 8);
                    let chunks = server
                        .stream("/v1/completions", &completion(&prompt, 8, true))
                        .rest();
                    let (text, finish, usage) = streamed_text(&chunks, false);
                    assert!((1..=8).contains(&usage), "client {i}: {usage} tokens");
                    (text, finish)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    for (i, (text, finish)) in results.iter().enumerate() {
        assert!(!text.is_empty(), "client {i}");
        assert!(
            finish == "length" || finish == "stop",
            "client {i}: {finish}"
        );
        assert_eq!(
            text,
            &results[i % 8].0,
            "clients {i} and {} sent the same prompt",
            i % 8
        );
    }
    let m = server.metrics();
    let batches = m.buckets("fornax_batch_sequences");
    let total = batches.last().unwrap().1;
    let at_most_4 = batches.iter().find(|b| b.0 == 4.0).unwrap().1;
    eprintln!(
        "engine steps {total}, of which with more than 4 sequences {}",
        total - at_most_4
    );
    assert!(
        at_most_4 < total,
        "some steps batched more than 4 sequences: {batches:?}"
    );
    assert_eq!(m.value("fornax_requests_finished_total", &[]), 16.0);
    assert_eq!(
        m.value("fornax_kv_blocks_used", &[]),
        0.0,
        "every block back"
    );
    server.assert_healthy();
}

#[test]
fn bad_input_gets_openai_errors_and_the_server_stays_healthy() {
    let server = Server::start(&["--max-body-bytes", "65536", "--max-output-tokens", "512"]);
    let c = "/v1/completions";
    let long_prompt = "hello ".repeat(9000);
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "invalid JSON",
            c,
            b"{\"model\": ".to_vec(),
            400,
            "not valid JSON",
        ),
        (
            "wrong type",
            c,
            json!({"model": MODEL, "prompt": "hi", "max_tokens": "ten"})
                .to_string()
                .into_bytes(),
            400,
            "max_tokens: invalid type",
        ),
        (
            "prompt of the wrong type",
            c,
            json!({"model": MODEL, "prompt": {"a": 1}})
                .to_string()
                .into_bytes(),
            400,
            "prompt: a string, a list of one string, or a list of token ids",
        ),
        (
            "missing prompt",
            c,
            json!({"model": MODEL}).to_string().into_bytes(),
            400,
            "missing field `prompt`",
        ),
        (
            "prompt longer than the context",
            c,
            json!({"model": MODEL, "prompt": long_prompt})
                .to_string()
                .into_bytes(),
            400,
            "context",
        ),
        (
            "max_tokens beyond the limit",
            c,
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 513})
                .to_string()
                .into_bytes(),
            400,
            "at most 512",
        ),
        (
            "max_tokens 0",
            c,
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 0})
                .to_string()
                .into_bytes(),
            400,
            "at least 1",
        ),
        (
            "unknown model",
            c,
            json!({"model": "gpt-4o", "prompt": "hi"})
                .to_string()
                .into_bytes(),
            404,
            "does not exist",
        ),
        ("oversized body", c, vec![b' '; 100_000], 413, "larger than"),
        (
            "empty messages",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []})
                .to_string()
                .into_bytes(),
            400,
            "must not be empty",
        ),
        (
            "invalid UTF-8",
            c,
            b"{\"model\": \"SmolLM2-135M-Instruct.Q4_1\", \"prompt\": \"\xff\xfe\"}".to_vec(),
            400,
            "not valid UTF-8",
        ),
        (
            "n = 17",
            c,
            json!({"model": MODEL, "prompt": "hi", "n": 17})
                .to_string()
                .into_bytes(),
            400,
            "n must be 1 to 16",
        ),
        (
            "temperature out of range",
            c,
            json!({"model": MODEL, "prompt": "hi", "temperature": -1})
                .to_string()
                .into_bytes(),
            400,
            "temperature",
        ),
        (
            "priority out of range",
            c,
            json!({"model": MODEL, "prompt": "hi", "priority": 7})
                .to_string()
                .into_bytes(),
            400,
            "priority",
        ),
        (
            "token id outside the vocabulary",
            c,
            json!({"model": MODEL, "prompt": [1, 99999999], "max_tokens": 1})
                .to_string()
                .into_bytes(),
            400,
            "outside the vocabulary",
        ),
        (
            "a JSON schema that does not compile",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}})
                .to_string()
                .into_bytes(),
            400,
            "does not compile: Invalid type: objekt",
        ),
        (
            "a response format that does not exist",
            c,
            json!({"model": MODEL, "prompt": "hi", "response_format": {"type": "yaml"}})
                .to_string()
                .into_bytes(),
            400,
            "response_format.type: unknown variant `yaml`",
        ),
        (
            "a tool choice naming no tool",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "g"}}})
                .to_string()
                .into_bytes(),
            400,
            "tool_choice names no tool of the request: `g`",
        ),
        (
            "a tool whose parameters do not compile",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "function", "function": {"name": "f",
                              "parameters": {"type": "objekt"}}}]})
                .to_string()
                .into_bytes(),
            400,
            "does not compile",
        ),
        (
            "the deprecated functions",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "functions": [{"name": "f"}]})
                .to_string()
                .into_bytes(),
            400,
            "`functions` is not supported",
        ),
        (
            "a field the server does not know",
            c,
            json!({"model": MODEL, "prompt": "hi", "temprature": 0.5})
                .to_string()
                .into_bytes(),
            400,
            "unknown field `temprature`",
        ),
        (
            "a logit bias on no token of the model",
            c,
            json!({"model": MODEL, "prompt": "hi", "logit_bias": {"99999999": 5}})
                .to_string()
                .into_bytes(),
            400,
            "is not a token id of this model",
        ),
        (
            "too many alternatives",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "logprobs": true, "top_logprobs": 21})
                .to_string()
                .into_bytes(),
            400,
            "top_logprobs must be 0 to 20",
        ),
        (
            "unknown route",
            "/v1/embeddings",
            b"{}".to_vec(),
            404,
            "no such route",
        ),
    ];
    for (what, path, body, status, needle) in cases {
        let (got, r) = server.post_raw(path, &body);
        eprintln!("{what}: {got} {}", r["error"]["message"]);
        assert_eq!(got, status, "{what}: {r}");
        let message = r["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: {r}"));
        assert!(
            message.contains(needle),
            "{what}: {message:?} lacks {needle:?}"
        );
        assert!(r["error"]["type"].is_string(), "{what}: {r}");
        assert!(
            r["error"].get("code").is_some() && r["error"].get("param").is_some(),
            "{what}: {r}"
        );
    }
    let (_, r) = server.post_raw(
        c,
        json!({"model": MODEL, "prompt": long_prompt})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    server.assert_healthy();
    let (status, r) = server.post(c, &completion(COMPLETION_PROMPT, 2, false));
    assert_eq!(status, 200, "a good request after the bad ones: {r}");
    assert_eq!(server.metrics().value("fornax_kv_blocks_used", &[]), 0.0);
}

#[test]
fn a_client_that_disconnects_mid_stream_is_cancelled_and_its_blocks_return() {
    let server = Server::start(&[]);
    let idle = server.metrics().value("fornax_kv_blocks_used", &[]);
    assert_eq!(idle, 0.0);
    let mut events = server.stream(
        "/v1/completions",
        &completion("Once upon a time", 400, true),
    );
    for _ in 0..2 {
        assert!(events.next().is_some());
    }
    let busy = server.metrics();
    assert!(
        busy.value("fornax_kv_blocks_used", &[]) > 0.0,
        "the request holds blocks"
    );
    assert_eq!(busy.value("fornax_requests_running", &[]), 1.0);
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(60);
    let m = loop {
        let m = server.metrics();
        if m.value("fornax_kv_blocks_used", &[]) == idle
            && m.value("fornax_requests_running", &[]) == 0.0
        {
            break m;
        }
        assert!(Instant::now() < deadline, "blocks did not return");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        m.value("fornax_requests_finished_total", &[("reason", "cancelled")]),
        1.0
    );
    let generated = m.value("fornax_generated_tokens_total", &[]);
    assert!(generated < 400.0, "stopped early: {generated} tokens");
    eprintln!("cancelled after {generated} tokens; KV blocks used back to {idle}");
    server.assert_healthy();
}

#[test]
fn a_full_queue_is_refused_at_once_with_503() {
    // First come, first served: under the default policy the short B would overtake A
    // (least remaining work), get its first token, give back its queue place, and a C
    // delayed by a loaded machine would then be queued instead of refused.
    let server = Server::start(&["--max-queue", "1", "--max-batch", "1", "--policy", "fcfs"]);
    // A runs (the only batch slot); B waits for its first token (the only queue place).
    // A is long (several seconds at the CPU backend's speed) so that it is still running
    // when B and C arrive on a loaded machine; it is cancelled at the end.
    let mut running = server.stream(
        "/v1/completions",
        &completion("Once upon a time", 2000, true),
    );
    assert!(running.next().is_some());
    let waiting = server.stream("/v1/completions", &completion("Long ago", 4, true));
    let started = Instant::now();
    let (status, r) = server.post("/v1/completions", &completion("Refused", 4, false));
    let waited = started.elapsed();
    assert_eq!(status, 503, "{r}");
    assert_eq!(r["error"]["code"], "queue_full");
    eprintln!("refused in {waited:?}");
    assert!(
        running.next().is_some(),
        "the running request is still streaming"
    );
    drop(running);
    let chunks = waiting.rest();
    assert!(
        !streamed_text(&chunks, false).0.is_empty(),
        "the waiting request ran next"
    );
    server.assert_healthy();
}

#[test]
fn sigterm_stops_accepting_lets_running_requests_finish_and_exits_zero() {
    let mut server = Server::start(&["--shutdown-grace-s", "120"]);
    let mut events = server.stream("/v1/completions", &completion("Once upon a time", 24, true));
    assert!(events.next().is_some());
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&server.addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting connections after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let chunks = events.rest();
    let (_, finish, usage) = streamed_text(&chunks, false);
    assert_eq!(
        (finish.as_str(), usage),
        ("length", 24),
        "the running request finished"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit status {status}");
}

#[test]
fn connections_beyond_the_limit_wait_until_one_closes() {
    let server = Server::start(&["--max-connections", "1"]);
    // An idle client holds the only connection slot.
    let idle = TcpStream::connect(&server.addr).expect("connect");
    std::thread::sleep(Duration::from_millis(300));
    let (tx, rx) = mpsc::channel();
    let (agent, url) = (server.agent.clone(), server.url("/health"));
    std::thread::spawn(move || {
        let status = agent.get(&url).call().map(|r| r.status().as_u16());
        let _ = tx.send(status.ok());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(2)).is_err(),
        "a second connection was served while the only slot was taken"
    );
    drop(idle);
    let status = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("served once the slot freed");
    assert_eq!(status, Some(200));
}

/// `response_format` through the official client (`tests/structured_client.py`): a JSON
/// schema on the chat route, streamed and not, and JSON mode on completions, sampled at
/// temperature 0.7; then `structured_outputs` with a regex and with choices; every output
/// parses and validates (or matches) and ends with `stop`.
#[test]
fn response_formats_hold_through_the_openai_client() {
    let server = Server::start(&[]);
    let results = python_client("structured_client.py", &server, &[]);
    let results = results.as_array().expect("a list");
    assert_eq!(results.len(), 5);
    for r in results {
        eprintln!("{}: {}", r["name"], r["text"]);
        assert_eq!(r["error"], Value::Null, "{r}");
        assert_eq!(r["finish_reason"], "stop", "{r}");
    }
    server.assert_healthy();
}

/// Log-probabilities, echo, biases, penalties and stop token ids through the official
/// client (`tests/sampling_client.py`), greedy: chat's `logprobs.content` (streamed and
/// not) has one entry per token whose texts make the reply, each with 3 alternatives
/// headed by itself; completions' `logprobs` lists tokens, log-probabilities, 2
/// alternatives and text offsets; echo repeats the prompt, and with logprobs lists the
/// prompt's tokens first (the first without values), the same in both choices and
/// streamed, followed by the generated tokens' values as a request without echo gets
/// them; a +100 bias selects its token at every step, and the same token as a stop token
/// id ends the output at once.
#[test]
fn logprobs_biases_and_penalties_through_the_openai_client() {
    let server = Server::start(&[]);
    let r = python_client("sampling_client.py", &server, &[]);
    let check_chat_entries = |entries: &[Value], text: &str| {
        let joined: String = entries
            .iter()
            .map(|e| e["token"].as_str().unwrap())
            .collect();
        assert_eq!(joined, text);
        for e in entries {
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3, "{e}");
            assert_eq!(top[0]["token"], e["token"], "greedy: {e}");
            assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
            assert!(e["logprob"].as_f64().unwrap() <= 0.0, "{e}");
            let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                e["token"].as_str().unwrap()
            );
        }
    };
    let chat = &r["chat"]["choices"][0];
    let text = chat["message"]["content"].as_str().unwrap();
    let entries = chat["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        entries.len() as u64,
        r["chat"]["usage"]["completion_tokens"].as_u64().unwrap()
    );
    check_chat_entries(entries, text);
    let chunks = r["chat_stream"].as_array().unwrap();
    let streamed: Vec<Value> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .flat_map(|c| {
            c["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let streamed_text: String = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed_text, text, "greedy: the same reply streamed");
    assert_eq!(streamed, *entries, "and the same log-probabilities");

    let values = |lp: &Value, key: &str| lp[key].as_array().unwrap().clone();
    let texts = |lp: &Value| -> Vec<String> {
        serde_json::from_value(lp["tokens"].clone()).expect("token texts")
    };
    // The best of a position's two alternatives.
    let best = |top: &Value| {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2, "{top:?}");
        top.values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max)
    };
    let completion = &r["completion"]["choices"][0];
    let lp = &completion["logprobs"];
    let tokens = texts(lp);
    assert_eq!(tokens.concat(), completion["text"].as_str().unwrap());
    let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at);
        at += t.chars().count() as u64;
    }
    for (top, l) in lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["token_logprobs"].as_array().unwrap())
    {
        assert_eq!(best(top), l.as_f64().unwrap(), "greedy takes the top token");
    }

    let echo = r["echo"]["choices"][0]["text"].as_str().unwrap();
    assert!(
        echo.starts_with(COMPLETION_PROMPT) && echo.len() > COMPLETION_PROMPT.len(),
        "{echo}"
    );

    let close = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-3,
        _ => a == b,
    };
    let echoed = r["echo_logprobs"]["choices"].as_array().unwrap();
    let usage = &r["echo_logprobs"]["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(echoed.len(), 2);
    let lp = &echoed[0]["logprobs"];
    let (logprobs, tops) = (values(lp, "token_logprobs"), values(lp, "top_logprobs"));
    assert_eq!(logprobs.len(), prompt_tokens + 4, "{lp}");
    assert_eq!((&logprobs[0], &tops[0]), (&Value::Null, &Value::Null));
    let tokens = texts(lp);
    assert_eq!(tokens.concat(), echoed[0]["text"].as_str().unwrap());
    assert!(tokens[..prompt_tokens]
        .concat()
        .ends_with(COMPLETION_PROMPT));
    for (l, top) in logprobs.iter().zip(&tops).skip(1) {
        let best = best(top);
        assert!(
            l.as_f64().unwrap() <= best + 1e-6,
            "{l} above the best {best}"
        );
    }
    assert!(
        logprobs[1..prompt_tokens]
            .iter()
            .any(|l| l.as_f64().unwrap() < -1.0),
        "a prompt is not the model's greedy text: {lp}"
    );
    let other = values(&echoed[1]["logprobs"], "token_logprobs");
    assert!(other.iter().zip(&logprobs).all(|(a, b)| close(a, b)));
    let generated = values(&completion["logprobs"], "token_logprobs");
    assert!(
        logprobs[prompt_tokens..]
            .iter()
            .zip(&generated)
            .all(|(a, b)| close(a, b)),
        "the generated tokens' values as without echo: {lp}, {generated:?}"
    );
    let streamed: Vec<Value> = r["echo_logprobs_stream"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .flat_map(|c| {
            c["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed.len(), logprobs.len());
    assert!(streamed.iter().zip(&logprobs).all(|(a, b)| close(a, b)));

    let biased = &r["biased"]["choices"][0];
    let tokens = biased["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert!(tokens.iter().all(|t| *t == tokens[0]), "{biased}");
    let stopped = &r["stopped"]["choices"][0];
    assert_eq!(stopped["text"], "", "{stopped}");
    assert_eq!(stopped["finish_reason"], "stop", "{stopped}");
    server.assert_healthy();
}

/// Tool calls through the official client (`tests/tools_client.py`) with two tools at
/// temperature 0.7: `tool_choice` required and named, streamed and not, answer with
/// `tool_calls` (finish reason `tool_calls`) whose arguments, streamed deltas joined,
/// validate against the tool's schema; `parallel_tool_calls: false` gives one call, a named
/// choice only that tool; `auto` answers with text or valid calls; the conversation goes
/// on with the calls' results as `tool` messages; a choice naming no tool is a 400.
#[test]
fn tool_calls_through_the_openai_client() {
    let server = Server::start(&[]);
    let r = python_client("tools_client.py", &server, &[]);
    check_tools_client(&r);
    server.assert_healthy();
}

/// What `tests/tools_client.py` printed, checked (see its test above).
fn check_tools_client(r: &Value) {
    eprintln!("{r:#}");
    for case in [
        "required",
        "required_one_streamed",
        "named",
        "named_streamed",
    ] {
        let c = &r[case];
        assert_eq!(c["finish_reason"], "tool_calls", "{case}: {c}");
        let calls = c["calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{case}: {c}");
        for call in calls {
            assert_eq!(call[2], Value::Null, "{case}: arguments invalid: {call}");
        }
        let ids = c["ids"].as_array().unwrap();
        assert!(
            ids.iter()
                .all(|i| i.as_str().is_some_and(|i| i.starts_with("call_"))),
            "{c}"
        );
        if case.starts_with("named") {
            assert!(
                calls.iter().all(|call| call[0] == "get_time"),
                "{case}: {c}"
            );
        }
    }
    assert_eq!(
        r["required_one_streamed"]["calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let auto = &r["auto"];
    match auto["finish_reason"].as_str() {
        Some("tool_calls") => assert!(auto["calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c[2].is_null())),
        _ => assert!(
            auto["content"].as_str().is_some_and(|t| !t.is_empty()),
            "{auto}"
        ),
    }
    let after = &r["after_results"];
    assert!(
        after["content"].as_str().is_some_and(|t| !t.is_empty()),
        "{after}"
    );
    // The client raises `BadRequestError` with the body's `error` object.
    assert_eq!(
        r["unknown_tool"]["param"], "tool_choice",
        "{}",
        r["unknown_tool"]
    );
}

/// A family checkpoint (`scripts/family-checkpoints.py`, which the test command runs)
/// served with its family's tool-calling template through `--chat-template-file`.
fn family_server(file: &str, template: &str) -> Server {
    let model = fornax_engine::store::home()
        .join("models/families")
        .join(format!("{file}.gguf"));
    assert!(
        model.exists(),
        "{}: scripts/test.sh writes it",
        model.display()
    );
    let template = format!(
        "{}/../tests/reference/templates/{template}.jinja",
        env!("CARGO_MANIFEST_DIR")
    );
    let name = format!("--served-model-name={MODEL}");
    Server::serving(&model, &["--chat-template-file", &template, &name], &[])
}

/// The family checkpoints served with their families' tool-calling templates: Llama 3's
/// JSON call (one a turn) on the Llama 3 checkpoint with Llama 3.2's template, Qwen2.5's
/// `<tool_call>` blocks on the Qwen2 checkpoint. Asked for a call (greedy; random
/// weights, so with a bounded schema), each answers with `tool_calls` that validate,
/// streamed deltas joining into the same arguments; the conversation goes on with the
/// call and its result, which the template renders (the prompt grows by them); asking
/// Llama 3's template for parallel calls is a 400 naming `parallel_tool_calls`.
#[test]
fn family_templates_call_tools_in_their_own_syntax() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": false}}}]);
    let question = json!({"role": "user", "content": "Weather in Paris?"});
    let ask = |messages: Value, extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 120, "temperature": 0,
            "messages": messages, "tools": tools, "tool_choice": "required",
            "parallel_tool_calls": false});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (file, template) in [
        ("llama3-f32", "llama3.2-instruct"),
        ("qwen2-f32", "qwen2.5-instruct"),
    ] {
        let server = family_server(file, template);
        let (status, body) =
            server.post("/v1/chat/completions", &ask(json!([question]), json!({})));
        assert_eq!(status, 200, "{file}: {body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{file}: {body}");
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{body}");
        let arguments = call["function"]["arguments"].as_str().unwrap();
        let args: Value = serde_json::from_str(arguments).unwrap();
        assert!(
            args["city"]
                .as_str()
                .is_some_and(|c| c.chars().count() <= 12),
            "{file}: {args}"
        );
        let chunks = server
            .stream(
                "/v1/chat/completions",
                &ask(json!([question]), json!({"stream": true})),
            )
            .rest();
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        assert_eq!(streamed, arguments, "{file}: greedy, streamed as whole");
        let last = chunks
            .iter()
            .rev()
            .find(|c| !c["choices"][0]["finish_reason"].is_null())
            .unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{file}");
        // The conversation goes on with the call and its result.
        let follow = json!([question,
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees, sunny"}]);
        let (status, next) = server.post(
            "/v1/chat/completions",
            &ask(follow, json!({"tool_choice": "none", "max_tokens": 4})),
        );
        assert_eq!(status, 200, "{file}: {next}");
        let grown = next["usage"]["prompt_tokens"].as_u64().unwrap()
            - body["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            grown > 10,
            "{file}: the call and its result add {grown} tokens"
        );
        if template.starts_with("llama") {
            let (status, e) = server.post(
                "/v1/chat/completions",
                &ask(json!([question]), json!({"parallel_tool_calls": true})),
            );
            assert_eq!(status, 400, "{e}");
            assert_eq!(e["error"]["param"], "parallel_tool_calls", "{e}");
        }
        server.assert_healthy();
    }
}

/// `n` = 3 on the chat route, whole and streamed (with usage), sampled: three choices
/// indexed 0 to 2, each ending with its own finish reason; the usage counts the prompt
/// once and every choice's tokens; choices 1 and 2 reuse the prompt's full KV blocks
/// (the prefix cache's hit tokens grow by at least their two prompts' full blocks).
#[test]
fn several_choices_share_the_prompt() {
    let server = Server::start(&[]);
    let question = "Explain, in a few sentences, why the sky looks blue on a clear day \
                    and why sunsets are red, orange and pink instead. Mention Rayleigh \
                    scattering, the path of light through the atmosphere, and dust.";
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": question}],
                      "n": 3, "max_tokens": 8, "temperature": 1.0, "seed": 5});
    let hits = |s: &Server| s.metrics().value("fornax_prefix_hit_tokens_total", &[]);
    let before = hits(&server);
    let (status, r) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    let indices: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2]);
    let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt >= 64,
        "a prompt of two full blocks at least: {prompt}"
    );
    let full_blocks = (prompt - 1) / 32 * 32;
    let reused = hits(&server) - before;
    assert!(
        reused >= 2.0 * full_blocks as f64,
        "{reused} of {full_blocks} per choice"
    );
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "seeds differ: {texts:?}"
    );
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() >= 3);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/chat/completions", &streamed).rest();
    let mut finished = [0; 3];
    let mut text = vec![String::new(); 3];
    for c in &chunks {
        for choice in c["choices"].as_array().into_iter().flatten() {
            let i = choice["index"].as_u64().unwrap() as usize;
            text[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            finished[i] += usize::from(choice["finish_reason"].is_string());
        }
    }
    assert_eq!(finished, [1, 1, 1], "{chunks:?}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt));
    assert_eq!(text, texts, "the same seeds give the same choices streamed");
    server.assert_healthy();
}
