//! Scoring text: the log-probability the model gives each next token (for perplexity).

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::model::{Logits, Model, ModelError};
use crate::seq_cache::SeqCache;

/// Log-probabilities of `ids[1..]`, each given the tokens before it, computed in chunks
/// of `chunk` tokens over a contiguous KV cache. Returns `ids.len() - 1` values.
pub fn token_logprobs<B: EngineBackend>(
    model: &Model<B>,
    ids: &[u32],
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    token_logprobs_in(model, &mut model.new_cache(), ids, chunk)
}

/// [`token_logprobs`] over an empty `cache` of any kind.
pub fn token_logprobs_in<B: EngineBackend>(
    model: &Model<B>,
    cache: &mut impl SeqCache<B>,
    ids: &[u32],
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    if ids.len() < 2 {
        return Err(ModelError::EmptyInput);
    }
    let device = model.device();
    let mut out = Vec::with_capacity(ids.len() - 1);
    let inputs = &ids[..ids.len() - 1];
    for (i, part) in inputs.chunks(chunk.max(1)).enumerate() {
        let start = i * chunk.max(1);
        let targets: Vec<i64> = ids[start + 1..start + 1 + part.len()]
            .iter()
            .map(|&t| i64::from(t))
            .collect();
        let targets =
            Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [part.len(), 1]), &device);
        let logits = cache.forward(model, part, Logits::All)?;
        let picked = log_softmax_rows(logits).gather(1, targets);
        out.extend(crate::logits_to_vec(picked));
    }
    Ok(out)
}

/// Columns reduced at a time by `log_softmax_rows`.
const REDUCE_SPAN: usize = 32768;

/// The log-softmax of each row of `logits` `[rows, width]`, its maximum and sum taken
/// over pieces of at most 32,768 columns: burn's wgpu reduction (0.21) reads
/// only the first 65,536 values of a wider row whose width is not a multiple of 4, as
/// the vocabularies of Llama 3.2 (128,257) and Qwen (151,669) are.
pub fn log_softmax_rows<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2> {
    let width = logits.dims()[1];
    let pieces = |f: &dyn Fn(Tensor<B, 2>) -> Tensor<B, 2>, t: &Tensor<B, 2>| {
        let parts: Vec<Tensor<B, 2>> = (0..width)
            .step_by(REDUCE_SPAN)
            .map(|at| f(t.clone().narrow(1, at, REDUCE_SPAN.min(width - at))))
            .collect();
        Tensor::cat(parts, 1)
    };
    let max = pieces(&|p| p.max_dim(1), &logits).max_dim(1);
    let shifted = logits - max;
    let sum = pieces(&|p| p.exp().sum_dim(1), &shifted).sum_dim(1);
    shifted - sum.log()
}

/// Perplexity from per-token log-probabilities: exp(mean negative log-likelihood).
pub fn perplexity(logprobs: &[f32]) -> f64 {
    let nll: f64 = logprobs.iter().map(|&l| -f64::from(l)).sum::<f64>() / logprobs.len() as f64;
    nll.exp()
}
