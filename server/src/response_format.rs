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

/// vLLM's `structured_outputs` (sent with OpenAI clients through `extra_body`): exactly
/// one of a JSON schema, a regex, a Lark grammar (llguidance's dialect) or a list of
/// choices the whole output must be one of.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub grammar: Option<String>,
    pub choice: Option<Vec<String>>,
}

impl StructuredOutputs {
    /// The grammar it asks for.
    pub fn grammar(self) -> Result<Grammar, ApiError> {
        let bad = |m: &str| ApiError::invalid_param("structured_outputs", m.to_string());
        let given = [
            self.json.is_some(),
            self.regex.is_some(),
            self.grammar.is_some(),
            self.choice.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() != 1 {
            return Err(bad(
                "structured_outputs takes exactly one of json, regex, grammar and choice",
            ));
        }
        Ok(match self {
            Self { json: Some(s), .. } => Grammar::JsonSchema(s),
            Self { regex: Some(r), .. } => Grammar::Regex(r),
            Self {
                grammar: Some(g), ..
            } => Grammar::Lark(g),
            Self {
                choice: Some(c), ..
            } => {
                if c.is_empty() {
                    return Err(bad("structured_outputs.choice must not be empty"));
                }
                let alternatives: Vec<String> = c
                    .iter()
                    .map(|s| Value::String(s.clone()).to_string())
                    .collect();
                Grammar::Lark(format!("start: {}\n", alternatives.join(" | ")))
            }
            _ => unreachable!("one field is given"),
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn structured_outputs_take_exactly_one_grammar() {
        let parse = |v: Value| {
            serde_json::from_value::<StructuredOutputs>(v)
                .unwrap()
                .grammar()
        };
        assert_eq!(
            parse(json!({"choice": ["yes", "no \"maybe\""]})).unwrap(),
            Grammar::Lark("start: \"yes\" | \"no \\\"maybe\\\"\"\n".into())
        );
        assert_eq!(
            parse(json!({"regex": "[a-z]+"})).unwrap(),
            Grammar::Regex("[a-z]+".into())
        );
        for bad in [
            json!({}),
            json!({"regex": "a", "grammar": "start: \"a\""}),
            json!({"choice": []}),
        ] {
            let e = parse(bad.clone()).expect_err(&bad.to_string());
            assert_eq!(e.param.as_deref(), Some("structured_outputs"));
        }
        assert!(serde_json::from_value::<StructuredOutputs>(json!({"ebnf": "x"})).is_err());
    }
}
