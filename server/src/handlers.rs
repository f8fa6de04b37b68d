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
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use crate::access::Caller;
use crate::api::{Body, ChatRequest, CompletionRequest, Endpoint, GenerationParams, Prompt};
use crate::error::ApiError;
use crate::generation::{Generation, Job, Logprob, Piece};
use crate::logprobs;
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
}

impl Envelope {
    fn new(state: &AppState, endpoint: Endpoint, logprobs: bool) -> Self {
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
            logprobs: logprobs.then(|| state.tokenizer.clone()),
            offset: 0,
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
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => ("text_completion", text_choice(text, Some(reason), logprobs)),
            Endpoint::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": logprobs, "finish_reason": reason}),
            ),
        };
        self.wrap(object, vec![choice], Some(usage))
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
    let messages = req
        .messages
        .iter()
        .map(|m| Ok(ChatMessage::new(&m.role, &m.text()?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let prompt = state
        .tokenizer
        .encode_chat(&messages)
        .map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
    let job = Job::new(&state, params, prompt, caller.map(|Extension(c)| c))?;
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
    let mut envelope = Envelope::new(&state, endpoint, job.logprobs.is_some());
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
                match generation.next().await {
                    Piece::Text { text, logprobs } => {
                        queue.push_back(envelope.chunk(&text, None, &logprobs).to_string())
                    }
                    Piece::Done {
                        text,
                        reason,
                        logprobs,
                    } => {
                        if !text.is_empty() || !logprobs.is_empty() {
                            queue.push_back(envelope.chunk(&text, None, &logprobs).to_string());
                        }
                        queue.push_back(envelope.chunk("", Some(reason), &[]).to_string());
                        if include_usage {
                            queue.push_back(envelope.usage_chunk(generation.usage()).to_string());
                        }
                        queue.push_back("[DONE]".into());
                        done = true;
                    }
                    Piece::Failed(message) => {
                        queue.push_back(ApiError::internal(message).body().to_string());
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
