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
use fornax_engine::grammar::CallSyntax;
use fornax_engine::tokenizer::{TemplateInputs, Tokenizer};
use futures_util::stream::{self, Stream, StreamExt};
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
    /// The choice this envelope's chunks are for.
    index: usize,
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
            index: 0,
            id: format!("{prefix}-{n}"),
            created: unix_now(),
            model: state.model.name.clone(),
            logprobs: job.logprobs.map(|_| state.tokenizer.clone()),
            offset: 0,
            calls: job.tools.map(CallStream::new),
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

    /// This envelope for choice `index`.
    fn for_choice(&self, index: usize) -> Self {
        Self {
            index,
            ..self.clone()
        }
    }

    /// A whole response (`stream: false`) with `choices`.
    fn response(&self, choices: Vec<Value>, usage: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        self.wrap(object, choices, Some(usage))
    }

    /// This choice of a whole response.
    fn choice(&mut self, text: &str, reason: &str, entries: &[Logprob]) -> Value {
        let logprobs = self.logprobs(entries);
        let calls = self
            .calls
            .as_ref()
            .and_then(|c| tools::read_calls(c.syntax(), text));
        match (self.endpoint, calls) {
            (Endpoint::Completions, _) => text_choice(self.index, text, Some(reason), logprobs),
            (Endpoint::Chat, Some(Ok(calls))) => {
                json!({"index": self.index, "message": {"role": "assistant", "content": null,
                       "tool_calls": tools::tool_calls(&self.call_prefix(), &calls)},
                       "logprobs": logprobs, "finish_reason": "tool_calls"})
            }
            (Endpoint::Chat, _) => {
                json!({"index": self.index, "message": {"role": "assistant", "content": text},
                       "logprobs": logprobs, "finish_reason": reason})
            }
        }
    }

    /// What this choice's call ids start with.
    fn call_prefix(&self) -> String {
        match self.index {
            0 => self.id.clone(),
            i => format!("{}-{i}", self.id),
        }
    }

    /// The chunk for a streamed piece of the output with its tokens' `entries`: text, or
    /// tool-call deltas where the output is calls; none while a request with tools has
    /// not shown which.
    fn piece(&mut self, text: &str, entries: Vec<Logprob>) -> Result<Option<Value>, String> {
        let prefix = self.call_prefix();
        let Some(calls) = self.calls.as_mut() else {
            return Ok(Some(self.chunk(text, None, &entries)));
        };
        self.held.extend(entries);
        let Some(streamed) = calls.push(&prefix, text)? else {
            return Ok(None);
        };
        let entries = std::mem::take(&mut self.held);
        Ok(Some(match streamed {
            Streamed::Text(t) => self.chunk(&t, None, &entries),
            Streamed::Calls(deltas) => {
                let logprobs = self.chunk_logprobs(&entries);
                let choice = json!({"index": self.index, "delta": {"tool_calls": deltas},
                                    "logprobs": logprobs, "finish_reason": null});
                self.wrap(self.chunk_object(), vec![choice], None)
            }
        }))
    }

    /// A streamed chunk's `logprobs`: `null` where it covers no token.
    fn chunk_logprobs(&mut self, entries: &[Logprob]) -> Value {
        match entries.is_empty() {
            true => Value::Null,
            false => self.logprobs(entries),
        }
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
        let logprobs = self.chunk_logprobs(entries);
        let choice = match self.endpoint {
            Endpoint::Completions => text_choice(self.index, text, reason, logprobs),
            Endpoint::Chat => {
                let delta = match reason {
                    Some(_) if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                json!({"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
        };
        self.wrap(self.chunk_object(), vec![choice], None)
    }

    /// The chat stream's first chunk, naming the role.
    fn role_chunk(&self) -> Value {
        let choice = json!({"index": self.index, "delta": {"role": "assistant", "content": ""},
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
fn text_choice(index: usize, text: &str, reason: Option<&str>, logprobs: Value) -> Value {
    json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason})
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
    let mut job = Job::new(&state, params, prompt, caller.map(|Extension(c)| c))?;
    if echo.is_some() {
        job.prompt_logprobs = job.logprobs;
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
    let template = state
        .tokenizer
        .chat_template()
        .map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
    let reads_tools = template.reads_tools();
    let syntax = CallSyntax::of_template(template.source());
    let plan = tools::plan(
        req.tools,
        req.tool_choice,
        req.parallel_tool_calls,
        reads_tools,
        syntax,
    )?;
    let system = plan.as_ref().and_then(|p| p.system.as_deref());
    let messages = tools::conversation(&req.messages, system, reads_tools)?;
    let inputs = TemplateInputs {
        tools: plan.as_ref().map(|p| &p.tools),
        kwargs: req.chat_template_kwargs.as_ref(),
    };
    let prompt = state
        .tokenizer
        .encode_chat_with(&messages, inputs)
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
/// generated text, with the prompt's log-probabilities where `logprobs` asks for them
/// (those of the first choice, the same for all). With `n` > 1 the first choice runs
/// until its prompt is computed, then the others start and reuse its prompt's KV blocks
/// through the prefix cache.
async fn respond(
    state: Arc<AppState>,
    job: Job,
    endpoint: Endpoint,
    arrived: Instant,
    echo: Option<String>,
) -> Result<Response, ApiError> {
    let (stream, include_usage) = (job.stream, job.include_usage);
    let class = [(PRIORITY_HEADER, job.qos.to_string())];
    let envelope = Envelope::new(&state, endpoint, &job);
    let mut first = Generation::start(state.clone(), job.choice(0), arrived).await?;
    if job.n > 1 || job.prompt_logprobs.is_some() {
        first.prompt_computed().await;
    }
    let echo = Echo {
        text: echo.unwrap_or_default(),
        logprobs: first.prompt_logprobs(),
    };
    let mut generations = vec![first];
    for i in 1..job.n {
        generations.push(Generation::start(state.clone(), job.choice(i), arrived).await?);
    }
    if stream {
        let events = events(generations, envelope, include_usage, echo);
        return Ok((class, Sse::new(events)).into_response());
    }
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, mut generation) in generations.into_iter().enumerate() {
        let mut envelope = envelope.for_choice(i);
        let mut text = echo.text.clone();
        let mut entries = echo.logprobs.clone();
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
                    choices.push(envelope.choice(&text, reason, &entries));
                    break;
                }
                Piece::Failed(message) => return Err(ApiError::internal(message)),
            }
        }
        let (p, c) = generation.tokens();
        prompt_tokens = p;
        completion_tokens += c;
    }
    let body = envelope.response(choices, usage(prompt_tokens, completion_tokens));
    Ok((class, Json(body)).into_response())
}

/// Token counts as OpenAI reports them (the prompt once, every choice's output).
fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// What one choice's stream yields: an event's data, or its end with its token counts.
enum Out {
    Data(String),
    End(usize, usize),
}

/// The prompt as a completion echoes it: its text, and its tokens' log-probabilities
/// where asked for.
#[derive(Clone, Default)]
struct Echo {
    text: String,
    logprobs: Vec<Logprob>,
}

/// One choice's chunks (after its role chunk and `echo`), then its end.
fn choice_events(
    generation: Generation,
    mut envelope: Envelope,
    echo: Echo,
) -> impl Stream<Item = Out> {
    let mut queue = VecDeque::new();
    if envelope.endpoint == Endpoint::Chat {
        queue.push_back(Out::Data(envelope.role_chunk().to_string()));
    }
    if !echo.text.is_empty() || !echo.logprobs.is_empty() {
        let chunk = envelope.chunk(&echo.text, None, &echo.logprobs);
        queue.push_back(Out::Data(chunk.to_string()));
    }
    stream::unfold(
        (generation, envelope, queue, false),
        move |(mut generation, mut envelope, mut queue, mut done)| async move {
            loop {
                if let Some(out) = queue.pop_front() {
                    return Some((out, (generation, envelope, queue, done)));
                }
                if done {
                    return None;
                }
                let data = |v: Value| Out::Data(v.to_string());
                let (text, logprobs, end) = match generation.next().await {
                    Piece::Text { text, logprobs } => (text, logprobs, None),
                    Piece::Done {
                        text,
                        reason,
                        logprobs,
                    } => (text, logprobs, Some(reason)),
                    Piece::Failed(message) => {
                        queue.push_back(data(ApiError::internal(message).body()));
                        done = true;
                        continue;
                    }
                };
                if !text.is_empty() || !logprobs.is_empty() {
                    match envelope.piece(&text, logprobs) {
                        Ok(chunk) => queue.extend(chunk.map(data)),
                        Err(e) => {
                            let message = format!("the tool calls did not parse: {e}");
                            queue.push_back(data(ApiError::internal(message).body()));
                            done = true;
                            continue;
                        }
                    }
                }
                if let Some(reason) = end {
                    queue.extend(envelope.finish(reason).into_iter().map(data));
                    let (p, c) = generation.tokens();
                    queue.push_back(Out::End(p, c));
                    done = true;
                }
            }
        },
    )
}

/// The server-sent events of a streamed response: every choice's chunks as they come,
/// then the usage (with `include_usage`) and `data: [DONE]`. When the client disconnects
/// the stream is dropped, and with it the generations (cancelled).
fn events(
    generations: Vec<Generation>,
    envelope: Envelope,
    include_usage: bool,
    echo: Echo,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let choices = generations
        .into_iter()
        .enumerate()
        .map(|(i, g)| Box::pin(choice_events(g, envelope.for_choice(i), echo.clone())));
    let merged = stream::select_all(choices);
    let tail = VecDeque::new();
    stream::unfold(
        (merged, envelope, tail, (0, 0), false),
        move |(mut merged, envelope, mut tail, mut tokens, mut ended)| async move {
            loop {
                if let Some(data) = tail.pop_front() {
                    let event = Event::default().data(data);
                    return Some((Ok(event), (merged, envelope, tail, tokens, ended)));
                }
                if ended {
                    return None;
                }
                match merged.next().await {
                    Some(Out::Data(data)) => tail.push_back(data),
                    Some(Out::End(p, c)) => tokens = (p, tokens.1 + c),
                    None => {
                        if include_usage {
                            let usage = usage(tokens.0, tokens.1);
                            tail.push_back(envelope.usage_chunk(usage).to_string());
                        }
                        tail.push_back("[DONE]".into());
                        ended = true;
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
