//! The Llama transformer: embedding, blocks, final norm and (tied) output layer.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use super::{Block, KvCache, Linear, LlamaConfig, ModelError, RmsNorm, Rope};

/// Which positions get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (generation).
    Last,
    /// Every position (scoring, perplexity, speculative verification).
    All,
}

/// The network's parameters.
#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    /// Token embedding table stored transposed, `[d_model, vocab]`, so the tied output
    /// layer is a plain `x @ table`.
    pub embedding: Param<Tensor<B, 2>>,
    /// Separate output layer when embeddings are not tied.
    pub output: Option<Linear<B>>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
}

/// A loaded model: parameters, RoPE tables and configuration.
#[derive(Debug)]
pub struct LlamaModel<B: Backend> {
    pub net: Llama<B>,
    pub rope: Rope<B>,
    pub config: LlamaConfig,
}

impl<B: Backend> LlamaModel<B> {
    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.config.n_layers)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> B::Device {
        self.net.embedding.val().device()
    }

    /// Runs `tokens` (continuing the sequence in `cache`) and returns logits
    /// `[rows, vocab]` for the requested positions.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let vocab = self.config.vocab_size;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        let start = cache.len();
        let needed = start + tokens.len();
        if needed > self.config.max_seq_len {
            return Err(ModelError::ContextOverflow {
                needed,
                limit: self.config.max_seq_len,
            });
        }
        let device = self.device();
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [tokens.len()]), &device);
        let mut x = self.net.embedding.val().select(1, ids).transpose();
        for (layer, block) in self.net.blocks.iter().enumerate() {
            x = block.forward(x, &self.rope, cache, layer, start);
        }
        cache.advance(tokens.len());
        if logits == Logits::Last {
            x = x.narrow(0, tokens.len() - 1, 1);
        }
        let x = self.net.norm.forward(x);
        Ok(match &self.net.output {
            Some(out) => out.forward(x),
            None => x.matmul(self.net.embedding.val()),
        })
    }
}
