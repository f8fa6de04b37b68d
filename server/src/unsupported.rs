//! The request fields this server reads, and the refusals for the rest: a field that
//! would change the answer but is not honoured (the deprecated `functions`, `best_of`)
//! is refused with a 400 naming it unless it carries the value that asks for nothing
//! (`functions: []`, as clients and SDKs often send); a field this server does not know
//! is refused by name,
//! except those clients send routinely that change nothing here (`user`, `metadata`, ...).

use serde_json::Value;

use crate::error::ApiError;

/// The fields checked, in the order an error names them (`suffix`: completions only),
/// each with the value of it that asks for nothing, as JSON text (`null` always does;
/// numbers compare as numbers, so `0` stands for `0.0` too).
const FIELDS: [(&str, &str); 4] = [
    ("functions", "[]"),
    ("function_call", r#""none""#),
    ("best_of", "1"),
    ("suffix", r#""""#),
];

/// Fields both routes read.
const COMMON: [&str; 22] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "stream_options",
    "priority",
    "response_format",
    "structured_outputs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
];

/// Fields of one route only.
const CHAT: [&str; 5] = [
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];
const COMPLETIONS: [&str; 2] = ["prompt", "echo"];

/// Fields clients send routinely that change nothing here: accepted and ignored.
const NO_EFFECT: [&str; 6] = [
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// The routes that read a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Refuses a request `body` (a JSON object) for `endpoint` that asks for a field this
/// server does not honour or know.
pub fn refuse_unsupported(body: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    let own: &[&str] = match endpoint {
        Endpoint::Chat => &CHAT,
        Endpoint::Completions => &COMPLETIONS,
    };
    let fields = body.as_object().into_iter().flat_map(|o| o.keys());
    for field in fields {
        let known = [&COMMON[..], own, &NO_EFFECT]
            .iter()
            .any(|list| list.contains(&field.as_str()))
            || FIELDS.iter().any(|(f, _)| f == field);
        if !known {
            return Err(ApiError::invalid_param(
                field.clone(),
                format!(
                    "unknown field `{field}`: this server does not implement it, so the \
                     request is refused rather than answered without it"
                ),
            ));
        }
    }
    for (field, no_op) in FIELDS {
        let Some(value) = body.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let no_op: Value = serde_json::from_str(no_op).expect("the no-op values are JSON");
        if !same(&no_op, value) {
            return Err(ApiError::invalid_param(
                field,
                format!(
                    "`{field}` is not supported by this server yet: the answer would ignore it, \
                     so the request is refused (send it without `{field}`)"
                ),
            ));
        }
    }
    Ok(())
}

/// JSON equality with numbers compared as numbers (`0` and `0.0` alike).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn requests_for_a_field_are_refused_by_name_and_defaults_pass() {
        let asking = [
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("best_of", json!(3)),
            ("suffix", json!("end")),
        ];
        for (field, value) in asking {
            let body = json!({"model": "m", "prompt": "hi", field: value});
            let e = refuse_unsupported(&body, Endpoint::Completions).expect_err(field);
            assert_eq!(e.param.as_deref(), Some(field), "{field}");
            assert!(e.message.contains(field), "{}", e.message);
        }
        let defaults = json!({
            "model": "m", "prompt": "hi", "response_format": {"type": "text"},
            "logprobs": false, "top_logprobs": 0, "echo": false,
            "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "min_p": 0, "logit_bias": {}, "best_of": 1, "suffix": "", "functions": null,
            "user": "someone", "metadata": {"a": "b"},
        });
        refuse_unsupported(&defaults, Endpoint::Completions).expect("defaults ask for nothing");
    }

    #[test]
    fn unknown_fields_and_the_other_routes_fields_are_refused_by_name() {
        for (endpoint, field) in [
            (Endpoint::Chat, "reasoning_effort"),
            (Endpoint::Chat, "echo"),
            (Endpoint::Chat, "prompt"),
            (Endpoint::Completions, "messages"),
            (Endpoint::Completions, "temprature"),
        ] {
            let body = json!({"model": "m", field: 1});
            let e = refuse_unsupported(&body, endpoint).expect_err(field);
            assert_eq!(e.param.as_deref(), Some(field));
            assert!(e.message.contains("unknown field"), "{}", e.message);
        }
        let chat = json!({"model": "m", "messages": [], "logprobs": true, "top_logprobs": 3,
                          "logit_bias": {"1": 2}, "stop_token_ids": [2], "user": "u"});
        refuse_unsupported(&chat, Endpoint::Chat).expect("all read or without effect");
    }
}
