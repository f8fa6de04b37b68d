//! The routes: completions and chat (JSON or server-sent events), models, health, metrics.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fornax_engine::tokenizer::Tokenizer;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use crate::access::Caller;
use crate::api::{Body, ChatRequest, CompletionRequest, Endpoint, GenerationParams, Prompt};
use crate::error::ApiError;
use crate::generation::{Generation, Job, Logprob, Piece};
use crate::logprobs;
use crate::tools::{self, CallStream, Streamed};
use crate::AppState;

/// The fields every response of one request repeats, and how its log-probabilities are
/// shown.
#[derive(Debug, Clone)]
struct Envelope {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    /// The vocabulary, where the request asked for log-probabilities.
    logprobs: Option<Arc<Tokenizer>>,
    /// Characters of the completion's text before the next token (`text_offset`).
    offset: usize,
    /// A streamed output that may be tool calls, as read so far.
    calls: Option<CallStream>,
    /// Log-probabilities of streamed text held back (until it shows whether it is calls).
    held: Vec<Logprob>,
}

impl Envelope {
    fn new(state: &AppState, endpoint: Endpoint, job: &Job) -> Self {
        let n = state.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{n}"),
            created: unix_now(),
            model: state.model.name.clone(),
            logprobs: job.logprobs.map(|_| state.tokenizer.clone()),
            offset: 0,
            calls: job.tools.then(CallStream::default),
            held: Vec::new(),
        }
    }

    /// The `logprobs` of a choice covering `entries` (`null` where not asked for).
    fn logprobs(&mut self, entries: &[Logprob]) -> Value {
        match (&self.logprobs, self.endpoint) {
            (None, _) => Value::Null,
            (Some(tok), Endpoint::Chat) => logprobs::chat(tok, entries),
            (Some(tok), Endpoint::Completions) => {
                logprobs::completion(tok, entries, &mut self.offset)
            }
        }
    }

    /// A whole response (`stream: false`).
    fn response(&mut self, text: &str, reason: &str, usage: Value, entries: &[Logprob]) -> Value {
        let logprobs = self.logprobs(entries);
        let calls = self.calls.as_ref().and_then(|_| tools::read_calls(text));
        let (object, choice) = match (self.endpoint, calls) {
            (Endpoint::Completions, _) => {
                ("text_completion", text_choice(text, Some(reason), logprobs))
            }
            (Endpoint::Chat, Some(Ok(calls))) => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": null,
                       "tool_calls": tools::tool_calls(&self.id, &calls)},
                       "logprobs": logprobs, "finish_reason": "tool_calls"}),
            ),
            (Endpoint::Chat, _) => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": logprobs, "finish_reason": reason}),
            ),
        };
        self.wrap(object, vec![choice], Some(usage))
    }

    /// The chunk for a streamed piece of the output with its tokens' `entries`: text, or
    /// tool-call deltas where the output is calls; none while a request with tools has
    /// not shown which.
    fn piece(&mut self, text: &str, entries: Vec<Logprob>) -> Result<Option<Value>, String> {
        let Some(calls) = self.calls.as_mut() else {
            return Ok(Some(self.chunk(text, None, &entries)));
        };
        self.held.extend(entries);
        let streamed = calls.push(&self.id, text)?;
        let entries = match streamed {
            None => return Ok(None),
            Some(_) => std::mem::take(&mut self.held),
        };
        Ok(match streamed {
            Some(Streamed::Text(t)) => Some(self.chunk(&t, None, &entries)),
            Some(Streamed::Calls(deltas)) => {
                let logprobs = match entries.is_empty() {
                    true => Value::Null,
                    false => self.logprobs(&entries),
                };
                let choice = json!({"index": 0, "delta": {"tool_calls": deltas},
                                    "logprobs": logprobs, "finish_reason": null});
                Some(self.wrap(self.chunk_object(), vec![choice], None))
            }
            None => None,
        })
    }

    /// The last chunks of a stream that ended for `reason`: held text, then the finish
    /// reason (`tool_calls` where the output was a complete list of calls).
    fn finish(&mut self, reason: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut reason = reason;
        if let Some(calls) = self.calls.take() {
            let (held, complete) = calls.finish();
            let entries = std::mem::take(&mut self.held);
            if !held.is_empty() || !entries.is_empty() {
                out.push(self.chunk(&held, None, &entries));
            }
            if complete && reason == "stop" {
                reason = "tool_calls";
            }
        }
        out.push(self.chunk("", Some(reason), &[]));
        out
    }

    /// A streamed chunk with `text` (and its tokens' `entries`), or with the finish reason
    /// at the end.
    fn chunk(&mut self, text: &str, reason: Option<&str>, entries: &[Logprob]) -> Value {
        let logprobs = match entries.is_empty() {
            true => Value::Null,
            false => self.logprobs(entries),
        };
        let choice = match self.endpoint {
            Endpoint::Completions => text_choice(text, reason, logprobs),
            Endpoint::Chat => {
                let delta = match reason {
                    Some(_) if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
        };
        self.wrap(self.chunk_object(), vec![choice], None)
    }

    /// The chat stream's first chunk, naming the role.
    fn role_chunk(&self) -> Value {
        let choice = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": null, "finish_reason": null});
        self.wrap(self.chunk_object(), vec![choice], None)
    }

    /// The last chunk of a stream with `include_usage`.
    fn usage_chunk(&self, usage: Value) -> Value {
        self.wrap(self.chunk_object(), Vec::new(), Some(usage))
    }

    /// The `object` of streamed chunks.
    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        }
    }

    fn wrap(&self, object: &str, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// A completion choice (whole or streamed).
fn text_choice(text: &str, reason: Option<&str>, logprobs: Value) -> Value {
    json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason})
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A body the extractor refused (too large, unreadable) as an OpenAI error.
fn body_error(rejection: BytesRejection) -> ApiError {
    let status = rejection.status();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than this server accepts".to_string()
        }
        _ => rejection.body_text(),
    };
    ApiError::with_status(status, message)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = Body::parse(&body.map_err(body_error)?, Endpoint::Completions)?;
    let req: CompletionRequest = body.view()?;
    let params: GenerationParams = body.view()?;
    state.check_model(&req.model)?;
    let tok = &state.tokenizer;
    let prompt = match &req.prompt {
        Prompt::Text(text) => tok.encode_prompt(text, true),
        Prompt::Texts(texts) if texts.len() == 1 => tok.encode_prompt(&texts[0], true),
        Prompt::Texts(_) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "send one prompt per request (lists of several prompts are not supported)",
            ))
        }
        Prompt::Ids(ids) => Ok(ids.clone()),
    }
    .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
    let echo = match (req.echo, &req.prompt) {
        (false, _) => None,
        (true, Prompt::Text(text)) => Some(text.clone()),
        (true, Prompt::Texts(texts)) => Some(texts[0].clone()),
        (true, Prompt::Ids(ids)) => Some(
            tok.decode(ids)
                .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?,
        ),
    };
    let job = Job::new(&state, params, prompt, caller.map(|Extension(c)| c))?;
    if echo.is_some() && job.logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo with logprobs is not supported: the prompt's log-probabilities are not \
             computed (send echo or logprobs, not both)",
        ));
    }
    respond(state, job, Endpoint::Completions, arrived, echo).await
}

/// `POST /v1/chat/completions`: the messages rendered with the model's chat template.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = Body::parse(&body.map_err(body_error)?, Endpoint::Chat)?;
    let req: ChatRequest = body.view()?;
    let params: GenerationParams = body.view()?;
    state.check_model(&req.model)?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let reads_tools = state
        .tokenizer
        .chat_template()
        .is_ok_and(|t| t.reads_tools());
    let plan = tools::plan(
        req.tools,
        req.tool_choice,
        req.parallel_tool_calls,
        reads_tools,
    )?;
    let system = plan.as_ref().and_then(|p| p.system.as_deref());
    let messages = tools::conversation(&req.messages, system, reads_tools)?;
    let prompt = state
        .tokenizer
        .encode_chat_with_tools(&messages, plan.as_ref().map(|p| &p.tools))
        .map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
    let mut job = Job::new(&state, params, prompt, caller.map(|Extension(c)| c))?;
    if let Some(plan) = plan {
        job = job.with_tools(plan)?;
    }
    respond(state, job, Endpoint::Chat, arrived, None).await
}

/// The response header naming the QoS class a request ran at (its `priority`, capped at
/// its key's class).
pub const PRIORITY_HEADER: &str = "x-fornax-priority";

/// Runs `job` and answers it, whole or streamed; `echo` (completions) comes before the
/// generated text.
async fn respond(
    state: Arc<AppState>,
    job: Job,
    endpoint: Endpoint,
    arrived: Instant,
    echo: Option<String>,
) -> Result<Response, ApiError> {
    let (stream, include_usage) = (job.stream, job.include_usage);
    let class = [(PRIORITY_HEADER, job.qos.to_string())];
    let mut envelope = Envelope::new(&state, endpoint, &job);
    let mut generation = Generation::start(state, job, arrived).await?;
    let mut text = echo.unwrap_or_default();
    if stream {
        let events = events(generation, envelope, include_usage, text);
        return Ok((class, Sse::new(events)).into_response());
    }
    let mut entries = Vec::new();
    loop {
        match generation.next().await {
            Piece::Text { text: t, logprobs } => {
                text.push_str(&t);
                entries.extend(logprobs);
            }
            Piece::Done {
                text: rest,
                reason,
                logprobs,
            } => {
                text.push_str(&rest);
                entries.extend(logprobs);
                let body = envelope.response(&text, reason, generation.usage(), &entries);
                return Ok((class, Json(body)).into_response());
            }
            Piece::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
}

/// The server-sent events of a streamed response (after `echo`, if not empty), ending
/// with `data: [DONE]`. When the client disconnects the stream is dropped, and with it the
/// generation (cancelled).
fn events(
    generation: Generation,
    mut envelope: Envelope,
    include_usage: bool,
    echo: String,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut queue = VecDeque::new();
    if envelope.endpoint == Endpoint::Chat {
        queue.push_back(envelope.role_chunk().to_string());
    }
    if !echo.is_empty() {
        queue.push_back(envelope.chunk(&echo, None, &[]).to_string());
    }
    stream::unfold(
        (generation, envelope, queue, false),
        move |(mut generation, mut envelope, mut queue, mut done)| async move {
            loop {
                if let Some(data) = queue.pop_front() {
                    let event = Event::default().data(data);
                    return Some((Ok(event), (generation, envelope, queue, done)));
                }
                if done {
                    return None;
                }
                let (text, logprobs, end) = match generation.next().await {
                    Piece::Text { text, logprobs } => (text, logprobs, None),
                    Piece::Done {
                        text,
                        reason,
                        logprobs,
                    } => (text, logprobs, Some(reason)),
                    Piece::Failed(message) => {
                        queue.push_back(ApiError::internal(message).body().to_string());
                        queue.push_back("[DONE]".into());
                        done = true;
                        continue;
                    }
                };
                if !text.is_empty() || !logprobs.is_empty() {
                    match envelope.piece(&text, logprobs) {
                        Ok(chunk) => queue.extend(chunk.map(|c| c.to_string())),
                        Err(e) => {
                            let message = format!("the tool calls did not parse: {e}");
                            queue.push_back(ApiError::internal(message).body().to_string());
                            queue.push_back("[DONE]".into());
                            done = true;
                            continue;
                        }
                    }
                }
                match end {
                    None => {}
                    Some(reason) => {
                        queue.extend(envelope.finish(reason).iter().map(Value::to_string));
                        if include_usage {
                            queue.push_back(envelope.usage_chunk(generation.usage()).to_string());
                        }
                        queue.push_back("[DONE]".into());
                        done = true;
                    }
                }
            }
        },
    )
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model.name,
            "object": "model",
            "created": state.model.created,
            "owned_by": "fornax",
            "max_model_len": state.model.context,
        }],
    }))
}

/// `GET /health`: 200 while the engine runs.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine_alive.load(Ordering::Acquire) {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::internal("the engine has stopped")
            .with_code(StatusCode::SERVICE_UNAVAILABLE)
            .into_response()
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    state.metrics.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// Unknown routes.
pub async fn not_found() -> ApiError {
    ApiError::with_status(StatusCode::NOT_FOUND, "no such route")
}

/// Known routes with the wrong method.
pub async fn wrong_method() -> ApiError {
    ApiError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}
