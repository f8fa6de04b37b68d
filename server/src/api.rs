//! The OpenAI request bodies this server accepts, parsed with errors that name the field.
//! A body is read as a [`Body`] and then viewed twice: as the endpoint's own fields and as
//! the [`GenerationParams`] both endpoints share. Fields that are not supported yet, and
//! fields this server does not know, are refused by name (`unsupported.rs`).

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ApiError;
use crate::response_format::{ResponseFormat, StructuredOutputs};
use crate::tools::{Tool, ToolChoice};
pub use crate::unsupported::Endpoint;

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    /// Repeat the prompt before the completion.
    #[serde(default)]
    pub echo: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// More variables for the chat template (vLLM's and SGLang's field: Qwen3's
    /// `enable_thinking`, Llama 3's `date_string`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A completion prompt: text, a one-element list of text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of one string, or a list of token ids"
)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// A chat message; `content` is text or a list of text parts (none for an assistant turn
/// that called tools).
#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// The calls an assistant turn made.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallMessage>>,
    /// The call a `tool` turn answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A call in an assistant message.
#[derive(Debug, Deserialize)]
pub struct ToolCallMessage {
    #[serde(default)]
    pub id: Option<String>,
    pub function: CalledFunction,
}

/// The function of a call: its name and arguments (JSON text).
#[derive(Debug, Deserialize)]
pub struct CalledFunction {
    pub name: String,
    pub arguments: String,
}

/// Message content.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of text parts")]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message; only `text` parts are supported.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `logprobs`: a flag on chat (with `top_logprobs` for the alternatives), the number of
/// alternatives on completions.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "true, false or a number of alternatives (0 to 20)"
)]
pub enum Logprobs {
    Flag(bool),
    Top(usize),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and output parameters common to both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationParams {
    pub max_tokens: Option<usize>,
    /// The chat endpoint's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0 or -1: no limit.
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Fornax extension: the QoS class, 0 (interactive, served first) .. 3 (batch).
    pub priority: Option<i64>,
    pub response_format: Option<ResponseFormat>,
    /// vLLM's extension: a regex, a Lark grammar, a JSON schema or a list of choices.
    pub structured_outputs: Option<StructuredOutputs>,
    /// Token ids that end the output (a vLLM extension), besides the model's own.
    pub stop_token_ids: Option<Vec<u32>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_p: Option<f32>,
    /// Token id (as text) to bias, -100 to 100.
    pub logit_bias: Option<HashMap<String, f32>>,
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<usize>,
}

impl Message {
    /// The message text; non-text parts are refused.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::invalid_param(
                        "messages",
                        format!("content parts of type `{kind}` are not supported (only text)"),
                    )),
                })
                .collect(),
        }
    }
}

impl Stop {
    /// The stop strings, empty ones dropped.
    pub fn strings(self) -> Vec<String> {
        let all = match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        };
        all.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

/// A request body: a JSON object.
pub struct Body(serde_json::Value);

impl Body {
    /// Parses the bytes for `endpoint`; anything but a JSON object is refused, and so is
    /// a field the server does not honour.
    pub fn parse(bytes: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        if let Err(e) = std::str::from_utf8(bytes) {
            return Err(ApiError::invalid(format!(
                "the body is not valid UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            )));
        }
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::invalid("the body must be a JSON object"));
        }
        crate::unsupported::refuse_unsupported(&value, endpoint)?;
        Ok(Self(value))
    }

    /// The body as `T`; errors name the field (`max_tokens: invalid type ...`).
    pub fn view<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_path_to_error::deserialize(&self.0).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match path.as_str() {
                "." => ApiError::invalid(inner.to_string()),
                _ => ApiError::invalid(format!("{path}: {inner}")),
            }
        })
    }
}
