//! The OpenAI-compatible HTTP server (axum on tokio): request types, validation into
//! engine jobs, streamed text with stop strings, admission limits, API keys and their
//! usage, metrics and logs. It talks to the engine loop (`engine_loop`), which runs on a
//! thread of its own, through [`Command`]s; each request gets its tokens back on a channel
//! of its own.

pub mod access;
pub mod api;
pub mod engine_loop;
pub mod error;
pub mod generation;
mod handlers;
mod logprobs;
pub use handlers::unix_now;
pub mod keys;
pub mod limits;
pub mod response_format;
pub mod sampling;
pub mod telemetry;
pub mod text;
pub mod tools;
mod unsupported;
pub mod usage;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use fornax_engine::grammar::GrammarCompiler;
use fornax_engine::tokenizer::Tokenizer;
use metrics::counter;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::engine_loop::Command;
use access::Access;
use error::ApiError;
use limits::{LimitedListener, Queue};
use telemetry::HTTP_REQUESTS;

/// The served model as clients see it.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The name clients put in `model`.
    pub name: String,
    /// Unix time the server started.
    pub created: u64,
    /// Context length in tokens.
    pub context: usize,
}

/// Per-request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_prompt_tokens: usize,
    pub max_output_tokens: usize,
}

/// Connection-level settings.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    pub max_body_bytes: usize,
    pub max_connections: usize,
    /// How long running requests may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
}

/// What every handler shares.
pub struct AppState {
    pub commands: Sender<Command>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: ModelInfo,
    pub limits: Limits,
    pub queue: Queue,
    /// Tokens that end a generation (end of sequence, end of turn).
    pub stop_ids: Vec<u32>,
    pub metrics: PrometheusHandle,
    pub next_id: AtomicU64,
    /// Cleared when the engine loop ends.
    pub engine_alive: Arc<AtomicBool>,
    /// API keys and their use.
    pub access: Access,
    /// Compiles `response_format` grammars for the model's vocabulary.
    pub grammars: Arc<GrammarCompiler>,
}

impl AppState {
    /// 404 unless `name` is the served model.
    pub fn check_model(&self, name: &str) -> Result<(), ApiError> {
        if name == self.model.name {
            Ok(())
        } else {
            Err(ApiError::unknown_model(name, &self.model.name))
        }
    }
}

/// The routes, with the body limit and request accounting.
pub fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::wrong_method)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::authorize,
        ))
        .layer(middleware::from_fn(account))
        .with_state(state)
}

/// Routes named in metrics; anything else counts as `other`.
const ROUTES: [&str; 5] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
];

/// Counts and logs every response by route and status.
async fn account(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path();
    let route = ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other");
    let response = next.run(request).await;
    let status = response.status().as_u16();
    counter!(HTTP_REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
    tracing::info!(%method, route, status, ms = started.elapsed().as_millis() as u64, "response");
    response
}

/// Starts [`serve`] on a thread of its own ("http") with its own tokio runtime; the
/// thread ends when the server has stopped and every task is dropped (and with them the
/// last senders to the engine loop).
pub fn spawn_http(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    config: ServerConfig,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let thread = std::thread::Builder::new().name("http".into());
    let spawned = thread.spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("tokio runtime")?;
        let served = runtime.block_on(serve(listener, state, config));
        runtime.shutdown_timeout(Duration::from_secs(1));
        served
    });
    spawned.context("cannot start the HTTP thread")
}

/// Serves on `listener` until SIGTERM or Ctrl-C, then stops accepting and lets running
/// requests finish for at most `config.shutdown_grace`.
pub async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    config: ServerConfig,
) -> Result<()> {
    listener.set_nonblocking(true).context("listener")?;
    let listener = tokio::net::TcpListener::from_std(listener).context("listener")?;
    let listener = LimitedListener::new(listener, config.max_connections);
    let reload = tokio::spawn(access::reload_on_sighup(state.clone()));
    let app = router(state, config.max_body_bytes);
    let stopping = Arc::new(Notify::new());
    let signal = {
        let stopping = stopping.clone();
        async move {
            shutdown_signal().await;
            tracing::info!(
                grace_s = config.shutdown_grace.as_secs_f64(),
                "shutting down: no new connections, running requests may finish"
            );
            stopping.notify_one();
        }
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(signal);
    tokio::select! {
        done = async { server.await } => done.context("server")?,
        _ = async { stopping.notified().await; tokio::time::sleep(config.shutdown_grace).await } => {
            tracing::warn!("grace period over: closing the remaining connections");
        }
    }
    reload.abort();
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(%e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
