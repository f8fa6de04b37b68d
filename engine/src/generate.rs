//! The generation loop for one sequence: chunked prefill, then one token per step.

use crate::EngineBackend;
use burn::tensor::{backend::Backend, Tensor};

use crate::model::{LlamaModel, Logits, ModelError};
use crate::sampling::{Sampler, SamplingParams};
use crate::seq_cache::SeqCache;

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after emitting any of these.
    pub stop_ids: Vec<u32>,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 32,
            sampling: SamplingParams::greedy(),
            stop_ids: Vec::new(),
            prefill_chunk: 256,
        }
    }
}

/// Reads a `[1, vocab]` or `[rows, vocab]` logits tensor back to the host.
pub fn logits_to_vec<B: Backend>(logits: Tensor<B, 2>) -> Vec<f32> {
    logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 logits")
}

/// Runs the prompt through the model in chunks and returns the last position's logits.
pub fn prefill<B: EngineBackend>(
    model: &LlamaModel<B>,
    prompt: &[u32],
    cache: &mut impl SeqCache<B>,
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::EmptyInput);
    }
    let limit = model.config.max_seq_len;
    if cache.cached() + prompt.len() >= limit {
        return Err(ModelError::ContextOverflow {
            needed: cache.cached() + prompt.len() + 1,
            limit,
        });
    }
    let mut last = None;
    for part in prompt.chunks(chunk.max(1)) {
        last = Some(cache.forward(model, part, Logits::Last)?);
    }
    Ok(logits_to_vec(last.expect("non-empty prompt")))
}

/// Generates up to `params.max_tokens` tokens after `prompt` over a fresh contiguous
/// cache, calling `on_token` with each one as it is sampled; `on_token` returns `false`
/// to stop early. Returns the new tokens.
pub fn generate<B: EngineBackend>(
    model: &LlamaModel<B>,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>, ModelError> {
    generate_in(model, &mut model.new_cache(), prompt, params, on_token)
}

/// [`generate`] continuing the sequence in `cache` (contiguous or paged).
pub fn generate_in<B: EngineBackend>(
    model: &LlamaModel<B>,
    cache: &mut impl SeqCache<B>,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>, ModelError> {
    let mut sampler = Sampler::new(params.sampling.clone());
    let mut logits = prefill(model, prompt, cache, params.prefill_chunk)?;
    let mut out = Vec::with_capacity(params.max_tokens);
    while out.len() < params.max_tokens {
        let token = sampler.sample(&logits);
        out.push(token);
        if !on_token(token) || params.stop_ids.contains(&token) || out.len() == params.max_tokens {
            break;
        }
        if cache.cached() + 1 > model.config.max_seq_len {
            break;
        }
        logits = logits_to_vec(cache.forward(model, &[token], Logits::Last)?);
    }
    Ok(out)
}
