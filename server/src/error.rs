//! Errors as OpenAI-style JSON bodies: `{"error": {"message", "type", "param", "code"}}`.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fornax_engine::sched::SubmitError;
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something out of range.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::invalid(message)
        }
    }

    /// 400: prompt plus output do not fit the context (or the prompt limit).
    pub fn context_exceeded(message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            ..Self::invalid(message)
        }
    }

    /// 404: the model named in the request is not served here.
    pub fn unknown_model(name: &str, served: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("the model `{name}` does not exist; this server serves `{served}`"),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 401: the request has no valid API key.
    pub fn invalid_api_key(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_api_key"),
            ..Self::invalid(message)
        }
    }

    /// 429: the key has used up its requests or tokens for the window.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_exceeded",
            message: message.into(),
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// 503: the queue is full; the client should retry later.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_overloaded",
            message: message.into(),
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// Any status with a plain message (body-size and routing rejections).
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            ..Self::invalid(message)
        }
    }

    /// The same error with another status.
    pub fn with_code(self, status: StatusCode) -> Self {
        Self { status, ..self }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::ContextOverflow { .. } | SubmitError::NeverFits { .. } => {
                Self::context_exceeded(e.to_string())
            }
            SubmitError::BadQos(_) => Self::invalid_param("priority", e.to_string()),
            SubmitError::NoTokensWanted => Self::invalid_param("max_tokens", e.to_string()),
            SubmitError::EmptyPrompt | SubmitError::BadToken { .. } => {
                Self::invalid_param("prompt", e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
