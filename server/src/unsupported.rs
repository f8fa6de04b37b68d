//! OpenAI request fields this server does not honour yet (tools, log-probabilities,
//! penalties): a request that asks for one is refused with a 400 naming
//! it, never answered as if it had not asked. A field sent with the value that asks for
//! nothing (`tools: []`, `logprobs: false`,
//! `presence_penalty: 0`, ...) passes, as clients and SDKs often send those defaults.

use serde_json::Value;

use crate::error::ApiError;

/// The fields checked, in the order an error names them (`suffix`: completions only),
/// each with the value of it that asks for nothing, as JSON text (`null` always does;
/// numbers compare as numbers, so `0` stands for `0.0` too).
const FIELDS: [(&str, &str); 14] = [
    ("tools", "[]"),
    ("tool_choice", r#""none""#),
    ("functions", "[]"),
    ("function_call", r#""none""#),
    ("logprobs", "false"),
    ("top_logprobs", "0"),
    ("echo", "false"),
    ("presence_penalty", "0"),
    ("frequency_penalty", "0"),
    ("repetition_penalty", "1"),
    ("min_p", "0"),
    ("logit_bias", "{}"),
    ("best_of", "1"),
    ("suffix", r#""""#),
];

/// Refuses a request `body` (a JSON object) that asks for a field this server does not
/// honour.
pub fn refuse_unsupported(body: &Value) -> Result<(), ApiError> {
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
            (
                "tools",
                json!([{"type": "function", "function": {"name": "f"}}]),
            ),
            ("tool_choice", json!("required")),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("logprobs", json!(true)),
            ("logprobs", json!(0)),
            ("top_logprobs", json!(5)),
            ("echo", json!(true)),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(-1)),
            ("repetition_penalty", json!(1.1)),
            ("min_p", json!(0.05)),
            ("logit_bias", json!({"50256": -100})),
            ("best_of", json!(3)),
            ("suffix", json!("end")),
        ];
        for (field, value) in asking {
            let body = json!({"model": "m", "prompt": "hi", field: value});
            let e = refuse_unsupported(&body).expect_err(field);
            assert_eq!(e.param, Some(field), "{field}");
            assert!(e.message.contains(field), "{}", e.message);
        }
        let defaults = json!({
            "model": "m", "prompt": "hi", "response_format": {"type": "text"}, "tools": [],
            "tool_choice": "none", "logprobs": false, "top_logprobs": 0, "echo": false,
            "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "min_p": 0, "logit_bias": {}, "best_of": 1, "suffix": "", "functions": null,
            "user": "someone", "parallel_tool_calls": true,
        });
        refuse_unsupported(&defaults).expect("defaults ask for nothing");
    }
}
