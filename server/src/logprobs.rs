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
        .map(|e| {
            let mut v = entry(e.token, e.logprobs.logprob);
            v["top_logprobs"] = e.logprobs.top.iter().map(|&(t, l)| entry(t, l)).collect();
            v
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs` for `entries`, whose text starts at character `offset` of the
/// choice's text; moves `offset` past them.
pub fn completion(tok: &Tokenizer, entries: &[Logprob], offset: &mut usize) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in entries {
        let (text, _) = token_text(tok, e.token);
        offsets.push(*offset);
        *offset += text.chars().count();
        tokens.push(text);
        logprobs.push(e.logprobs.logprob);
        let top: Map<String, Value> = e
            .logprobs
            .top
            .iter()
            .map(|&(t, l)| (token_text(tok, t).0, json!(l)))
            .collect();
        tops.push(top);
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}
