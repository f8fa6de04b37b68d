//! The sampling fields of a request, checked and turned into the engine's settings:
//! temperature, top-k/p, min-p, seed, penalties, `logit_bias`, and `logprobs` with
//! `top_logprobs` (a flag and a count on chat, a count on completions).

use fornax_engine::sampling::{Adjustments, SamplingParams, MAX_TOP_LOGPROBS};

use crate::api::{GenerationParams, Logprobs};
use crate::error::ApiError;

/// `params`' sampling settings for a vocabulary of `vocab` tokens, and how many
/// alternatives to report with each token's log-probability (`None`: no logprobs).
pub fn sampling(
    params: &GenerationParams,
    vocab: usize,
) -> Result<(SamplingParams, Option<usize>), ApiError> {
    let temperature = params.temperature.unwrap_or(1.0);
    in_range("temperature", temperature, 0.0, 2.0)?;
    let top_p = params.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param("top_p", "top_p must be in (0, 1]"));
    }
    let top_k = match params.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        _ => {
            return Err(ApiError::invalid_param(
                "top_k",
                "top_k must be positive (0 or -1: no limit)",
            ))
        }
    };
    let min_p = params.min_p.unwrap_or(0.0);
    in_range("min_p", min_p, 0.0, 1.0)?;
    let presence_penalty = params.presence_penalty.unwrap_or(0.0);
    in_range("presence_penalty", presence_penalty, -2.0, 2.0)?;
    let frequency_penalty = params.frequency_penalty.unwrap_or(0.0);
    in_range("frequency_penalty", frequency_penalty, -2.0, 2.0)?;
    let repetition_penalty = params.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty <= 10.0) {
        return Err(ApiError::invalid_param(
            "repetition_penalty",
            "repetition_penalty must be in (0, 10] (1: none)",
        ));
    }
    let mut logit_bias = Vec::new();
    for (key, &bias) in params.logit_bias.iter().flatten() {
        let token = token_id("logit_bias", key, vocab)?;
        in_range("logit_bias", bias, -100.0, 100.0)?;
        logit_bias.push((token, bias));
    }
    logit_bias.sort_by_key(|&(t, _)| t);
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: params.seed.unwrap_or_else(rand::random),
        adjust: Adjustments {
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            logit_bias,
        },
    };
    Ok((sampling, logprobs(params)?))
}

/// How many alternatives to report, if logprobs are asked for.
fn logprobs(params: &GenerationParams) -> Result<Option<usize>, ApiError> {
    let top = params.top_logprobs;
    if top.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            format!("top_logprobs must be 0 to {MAX_TOP_LOGPROBS}"),
        ));
    }
    match (&params.logprobs, top) {
        (Some(Logprobs::Flag(true)), top) => Ok(Some(top.unwrap_or(0))),
        (Some(Logprobs::Top(n)), None) if *n <= MAX_TOP_LOGPROBS => Ok(Some(*n)),
        (Some(Logprobs::Top(_)), None) => Err(ApiError::invalid_param(
            "logprobs",
            format!("logprobs must be 0 to {MAX_TOP_LOGPROBS}"),
        )),
        (Some(Logprobs::Top(_)), Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "give the number of alternatives either as logprobs (completions) or as \
             top_logprobs with logprobs: true (chat), not both",
        )),
        (_, Some(n)) if n > 0 => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        _ => Ok(None),
    }
}

/// `shown` (a field's token id, as text) as a token id of a vocabulary of `vocab` tokens.
pub fn token_id(field: &'static str, shown: &str, vocab: usize) -> Result<u32, ApiError> {
    let token = shown.parse::<u32>().ok().filter(|&t| (t as usize) < vocab);
    token.ok_or_else(|| {
        ApiError::invalid_param(
            field,
            format!(
                "{field}: `{shown}` is not a token id of this model (0 to {})",
                vocab - 1
            ),
        )
    })
}

fn in_range(field: &'static str, value: f32, min: f32, max: f32) -> Result<(), ApiError> {
    match (min..=max).contains(&value) {
        true => Ok(()),
        false => Err(ApiError::invalid_param(
            field,
            format!("{field} must be between {min} and {max}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(json: serde_json::Value) -> GenerationParams {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn fields_become_settings_and_out_of_range_values_are_refused_by_name() {
        let p = params(serde_json::json!({
            "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
            "min_p": 0.1, "logit_bias": {"7": -100, "3": 2.5}, "logprobs": true,
            "top_logprobs": 4, "seed": 9,
        }));
        let (s, lp) = sampling(&p, 100).unwrap();
        assert_eq!(lp, Some(4));
        assert_eq!(s.adjust.logit_bias, [(3, 2.5), (7, -100.0)]);
        assert_eq!((s.min_p, s.seed), (0.1, 9));
        assert_eq!(s.adjust.repetition_penalty, 1.2);
        let top = params(serde_json::json!({"logprobs": 3}));
        assert_eq!(sampling(&top, 100).unwrap().1, Some(3));
        let off = params(serde_json::json!({"logprobs": false, "top_logprobs": 0}));
        assert_eq!(sampling(&off, 100).unwrap().1, None);
        for (bad, field) in [
            (
                serde_json::json!({"presence_penalty": 2.5}),
                "presence_penalty",
            ),
            (
                serde_json::json!({"frequency_penalty": -3}),
                "frequency_penalty",
            ),
            (
                serde_json::json!({"repetition_penalty": 0}),
                "repetition_penalty",
            ),
            (serde_json::json!({"min_p": 1.5}), "min_p"),
            (serde_json::json!({"logit_bias": {"100": 1}}), "logit_bias"),
            (serde_json::json!({"logit_bias": {"x": 1}}), "logit_bias"),
            (serde_json::json!({"logit_bias": {"1": 101}}), "logit_bias"),
            (
                serde_json::json!({"top_logprobs": 21, "logprobs": true}),
                "top_logprobs",
            ),
            (serde_json::json!({"top_logprobs": 2}), "top_logprobs"),
            (serde_json::json!({"logprobs": 21}), "logprobs"),
            (serde_json::json!({"temperature": 2.1}), "temperature"),
        ] {
            let e = sampling(&params(bad.clone()), 100).expect_err(&bad.to_string());
            assert_eq!(e.param.as_deref(), Some(field), "{bad}");
        }
    }
}
