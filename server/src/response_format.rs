//! `response_format`: the grammar a request's output must match (OpenAI's `text`,
//! `json_object` and `json_schema`), compiled off the async threads under a deadline. A
//! schema that does not compile in time, or at all, is a 400 naming the problem, never an
//! unconstrained answer.

use std::sync::Arc;
use std::time::Duration;

use fornax_engine::grammar::{Constraint, Grammar, GrammarCompiler};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// How long a grammar may take to compile (llguidance's own limits bound most schemas
/// well inside it).
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(5);

/// `response_format` as OpenAI defines it.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchema },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
pub struct JsonSchema {
    pub name: String,
    pub schema: Option<Value>,
    /// Fornax always enforces the schema whole; `strict: false` asks for no less.
    #[serde(default)]
    pub strict: Option<bool>,
    #[serde(default)]
    pub description: Option<String>,
}

impl ResponseFormat {
    /// The grammar it asks for (`None` for free text).
    pub fn grammar(self) -> Result<Option<Grammar>, ApiError> {
        Ok(match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(Grammar::JsonObject),
            ResponseFormat::JsonSchema { json_schema } => {
                let schema = json_schema.schema.unwrap_or(Value::Bool(true));
                Some(Grammar::JsonSchema(schema))
            }
        })
    }
}

/// Compiles `grammar` on a blocking thread within [`COMPILE_DEADLINE`]; a failure is a
/// 400 naming `param`, the field the grammar came from.
pub async fn compile(
    compiler: Arc<GrammarCompiler>,
    grammar: Grammar,
    param: &'static str,
) -> Result<Constraint, ApiError> {
    let refused = |why: String| ApiError::invalid_param(param, why);
    let task = tokio::task::spawn_blocking(move || compiler.compile(&grammar));
    match tokio::time::timeout(COMPILE_DEADLINE, task).await {
        Err(_) => Err(refused(format!(
            "the schema did not compile within {} s",
            COMPILE_DEADLINE.as_secs()
        ))),
        Ok(Err(e)) => Err(refused(format!("the schema compiler failed: {e}"))),
        Ok(Ok(Err(e))) => Err(refused(e.to_string())),
        Ok(Ok(Ok(constraint))) => Ok(constraint),
    }
}
