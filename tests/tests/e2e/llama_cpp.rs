//! Reference outputs of llama.cpp for one GGUF (written by
//! `scripts/peer/llama-reference.mjs`): tokenizer cases, greedy continuations with each
//! step's top-1/top-2 margin, and the log-probability of each token of a text; and the
//! rule by which greedy tokens are compared with a reference's.

use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{Logits, Model, SeqTokens};
use fornax_engine::sampling::argmax;
use fornax_engine::EngineBackend;
use serde::Deserialize;

/// A greedy divergence is allowed only after a step whose reference top-1/top-2
/// log-probability margin is below this.
pub(crate) const MIN_MARGIN: f64 = 0.1;

#[derive(Debug, Deserialize)]
pub(crate) struct Reference {
    pub tokenizer: Vec<TokenizerCase>,
    pub prompts: Vec<PromptCase>,
    pub text: Text,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TokenizerCase {
    pub name: String,
    pub text: String,
    pub parse_special: bool,
    pub ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PromptCase {
    pub prompt: String,
    /// The prompt's ids, BOS first where the file adds it.
    pub ids: Vec<u32>,
    pub greedy: Vec<u32>,
    pub margins: Vec<f64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Text {
    pub ids: Vec<u32>,
    /// llama.cpp's log-probability of each token after the first.
    pub logprobs: Vec<f64>,
}

impl Text {
    /// llama.cpp's perplexity over the first `n` tokens.
    pub fn perplexity(&self, n: usize) -> f64 {
        let lp = &self.logprobs[..n - 1];
        (-lp.iter().sum::<f64>() / lp.len() as f64).exp()
    }
}

/// How many of `ours` equal llama.cpp's greedy tokens; an error where they part after a
/// step with a clear margin.
pub(crate) fn check_greedy(ours: &[u32], case: &PromptCase) -> Result<usize, String> {
    agreeing_steps(ours, &case.greedy, &case.margins)
}

/// How many of `ours` equal a reference's greedy tokens `want`; an error where they part
/// at a step whose reference margin (`margins`) is [`MIN_MARGIN`] or more, or where the
/// lengths differ.
pub(crate) fn agreeing_steps(ours: &[u32], want: &[u32], margins: &[f64]) -> Result<usize, String> {
    for (i, (&a, &b)) in ours.iter().zip(want).enumerate() {
        if a != b {
            let margin = margins[i];
            return match margin < MIN_MARGIN {
                true => Ok(i),
                false => Err(format!(
                    "step {i}: {a} vs the reference's {b} (margin {margin:.3})"
                )),
            };
        }
    }
    match ours.len() == want.len() {
        true => Ok(ours.len()),
        false => Err(format!("{} of {} tokens", ours.len(), want.len())),
    }
}

/// Greedy tokens and, at each step, the top-1/top-2 logit margin (that of the
/// log-probabilities).
pub(crate) struct Greedy {
    pub tokens: Vec<u32>,
    pub margins: Vec<f64>,
}

/// `steps` greedy tokens after each of `prompts`, all of them in one ragged batch, one
/// forward pass a step, as the engine runs them.
pub(crate) fn greedy_batch<B: EngineBackend>(
    model: &Model<B>,
    prompts: &[&[u32]],
    steps: usize,
) -> Result<Vec<Greedy>, String> {
    let blocks: usize = prompts
        .iter()
        .map(|p| (p.len() + steps).div_ceil(BLOCK_TOKENS))
        .sum();
    let mut kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
    let seqs: Vec<_> = prompts.iter().map(|_| kv.add_sequence()).collect();
    let mut inputs: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut ours: Vec<Greedy> = prompts
        .iter()
        .map(|_| Greedy {
            tokens: Vec::new(),
            margins: Vec::new(),
        })
        .collect();
    for _ in 0..steps {
        let batch: Vec<SeqTokens> = seqs
            .iter()
            .zip(&inputs)
            .map(|(&seq, tokens)| SeqTokens { seq, tokens })
            .collect();
        let logits = model
            .forward_batch(&batch, &mut kv, Logits::Last)
            .map_err(|e| e.to_string())?;
        let vocab = logits.dims()[1];
        let logits = fornax_engine::logits_to_vec(logits);
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let token = argmax(row);
            let second = row
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != token as usize)
                .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
            ours[i].tokens.push(token);
            ours[i]
                .margins
                .push(f64::from(row[token as usize] - second));
            inputs[i] = vec![token];
        }
    }
    Ok(ours)
}
