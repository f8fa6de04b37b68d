//! Who may use the server: the middleware that checks each request's API key before any
//! handler runs, enforces the key's limits and names the caller for the handlers
//! ([`Caller`]: the QoS cap, the token count); and the keys file re-read on SIGHUP.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::counter;

use crate::error::ApiError;
use crate::keys::{ApiKey, KeyRing};
use crate::telemetry::{AUTH_FAILURES, KEY_REFUSALS};
use crate::usage::Usage;
use crate::AppState;

/// The key a request came with (a request extension set by [`authorize`]).
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<ApiKey>);

/// The server's keys, their use, and where they come from.
pub struct Access {
    ring: RwLock<Arc<KeyRing>>,
    /// Requests and tokens per key over the window.
    pub usage: Usage,
    /// Whether `/metrics` answers without a key.
    pub metrics_open: bool,
    file: Option<PathBuf>,
    extra: Vec<ApiKey>,
}

/// Routes that run the model: the ones a key's limits count.
const GENERATION_ROUTES: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

impl Access {
    /// The keys of `file` (if any) and `extra` (flags, environment).
    pub fn new(
        file: Option<PathBuf>,
        extra: Vec<ApiKey>,
        usage: Usage,
        metrics_open: bool,
    ) -> anyhow::Result<Self> {
        let ring = KeyRing::load(file.as_deref(), &extra)?;
        Ok(Self {
            ring: RwLock::new(Arc::new(ring)),
            usage,
            metrics_open,
            file,
            extra,
        })
    }

    /// The keys now in force.
    pub fn keys(&self) -> Arc<KeyRing> {
        self.ring.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-reads the keys file. A file that does not parse keeps the keys in force.
    pub fn reload(&self) -> anyhow::Result<usize> {
        let ring = KeyRing::load(self.file.as_deref(), &self.extra)?;
        let n = ring.len();
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ring);
        Ok(n)
    }
}

/// A 401 with OpenAI's `invalid_api_key` body; `reason` labels the metric.
fn unauthorized(reason: &'static str, message: &str) -> Response {
    counter!(AUTH_FAILURES, "reason" => reason).increment(1);
    let mut response = ApiError::invalid_api_key(message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Checks the request's key (`Authorization: Bearer KEY`) unless the route is open:
/// `/health` always, `/metrics` with `--metrics-open`, everything when no key is
/// configured. Generation requests also count against the key's limits (429 with
/// `Retry-After` when used up).
pub async fn authorize(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let access = &state.access;
    if path == "/health" || (path == "/metrics" && access.metrics_open) {
        return next.run(request).await;
    }
    let keys = access.keys();
    if keys.is_empty() {
        return next.run(request).await;
    }
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return unauthorized(
            "missing",
            "this server needs an API key: send `Authorization: Bearer KEY`",
        );
    };
    let presented = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let Some(presented) = presented else {
        return unauthorized("malformed", "the Authorization header must be `Bearer KEY`");
    };
    let Some(key) = keys.identify(presented.as_bytes(), None) else {
        return unauthorized("unknown", "the API key is not valid on this server");
    };
    let key = Arc::new(key.clone());
    if GENERATION_ROUTES.contains(&path) {
        if let Err(refusal) = access.usage.admit(&key, Instant::now()) {
            counter!(KEY_REFUSALS, "key" => key.name.clone(), "reason" => refusal.label())
                .increment(1);
            let seconds = refusal.retry_after().as_secs_f64().ceil().max(1.0) as u64;
            let mut response = ApiError::rate_limited(format!(
                "key `{}` has used its {} for this {} s window; retry in {seconds} s",
                key.name,
                refusal.label(),
                access.usage.window().as_secs()
            ))
            .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            return response;
        }
    }
    request.extensions_mut().insert(Caller(key));
    next.run(request).await
}

/// Re-reads the keys file on every SIGHUP until the server stops.
pub async fn reload_on_sighup(state: Arc<AppState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(%e, "cannot listen for SIGHUP: the keys file will not be re-read");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        match state.access.reload() {
            Ok(n) => tracing::info!(keys = n, "SIGHUP: keys re-read"),
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "SIGHUP: the keys file does not parse; keeping the previous keys"
            ),
        }
    }
}
