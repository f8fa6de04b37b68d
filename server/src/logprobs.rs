//! Log-probabilities in OpenAI's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.

use fornax_engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::generation::Logprob;

/// A token's text (lossy where it holds part of a character) and bytes.
fn token_text(tok: &Tokenizer, token: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(token).unwrap_or_default().to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` for `entries`.
pub fn chat(tok: &Tokenizer, entries: &[Logprob]) -> Value {
    let entry = |token: u32, logprob: f32| {
        let (text, bytes) = token_text(tok, token);
        json!({"token": text, "logprob": logprob, "bytes": bytes})
    };
    let content: Vec<Value> = entries
        .iter()
        .filter_map(|e| {
            let l = e.logprobs.as_ref()?;
            let mut v = entry(e.token, l.logprob);
            v["top_logprobs"] = l.top.iter().map(|&(t, l)| entry(t, l)).collect();
            Some(v)
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs` for `entries`, whose text starts at character `offset` of the
/// choice's text (`null` values for an entry without them, the prompt's first token);
/// moves `offset` past them.
pub fn completion(tok: &Tokenizer, entries: &[Logprob], offset: &mut usize) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in entries {
        let (text, _) = token_text(tok, e.token);
        offsets.push(*offset);
        *offset += text.chars().count();
        tokens.push(text);
        let Some(l) = &e.logprobs else {
            logprobs.push(Value::Null);
            tops.push(Value::Null);
            continue;
        };
        logprobs.push(json!(l.logprob));
        let top: Map<String, Value> = l
            .top
            .iter()
            .map(|&(t, l)| (token_text(tok, t).0, json!(l)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}
