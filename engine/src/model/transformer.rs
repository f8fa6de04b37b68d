//! The transformer every family runs: embedding, blocks, final norm and (tied) output
//! layer.

use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor, TensorData};

use super::{Block, KvCache, Linear, ModelConfig, ModelError, RmsNorm, Rope};
use crate::kv::{KvCapacity, KvDims, PagedKv, SeqId, Sliding, TierPolicy};

/// Which positions get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (generation).
    Last,
    /// Every position (scoring, perplexity, speculative verification).
    All,
}

/// New tokens of one sequence in a ragged batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqTokens<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
}

/// The network's parameters.
#[derive(Debug, Clone)]
pub struct Net<B: Backend> {
    /// Token embedding table as the layer `d_model -> vocab`, so that it also serves as
    /// the tied output layer; the lookup reads its columns.
    pub embedding: Linear<B>,
    /// Separate output layer when embeddings are not tied.
    pub output: Option<Linear<B>>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
}

/// A loaded model: parameters, RoPE tables and configuration.
#[derive(Debug)]
pub struct Model<B: Backend> {
    pub net: Net<B>,
    /// One table per RoPE base (`ModelConfig::rope_thetas`); each block names its own.
    pub ropes: Vec<Rope<B>>,
    pub config: ModelConfig,
}

impl<B: Backend> Model<B> {
    /// Whether any matrix is kept quantized (else every weight is FP32: the reference path).
    pub fn quantized(&self) -> bool {
        self.matrices().any(|m| m.quant().is_some())
    }

    /// Every matrix: the embedding (also the tied output layer), the output layer if
    /// separate, then each block's (seven, or four where Q, K, V and gate, up are joined).
    pub fn matrices(&self) -> impl Iterator<Item = &Linear<B>> {
        let blocks = self.net.blocks.iter().flat_map(|b| {
            b.attn
                .qkv
                .layers()
                .chain([&b.attn.o])
                .chain(b.mlp.gate_up.layers())
                .chain([&b.mlp.down])
        });
        std::iter::once(&self.net.embedding)
            .chain(&self.net.output)
            .chain(blocks)
    }

    /// Bytes of all weights on the device: matrices and norm vectors.
    pub fn weight_bytes(&self) -> usize {
        let c = &self.config;
        let per_layer = match c.post_norms {
            true => 4 * c.d_model,
            false => 2 * c.d_model,
        } + usize::from(c.qk_norm) * 2 * c.head_dim;
        let norms = (c.n_layers * per_layer + c.d_model) * 4;
        self.matrices().map(Linear::bytes).sum::<usize>() + norms
    }

    /// RoPE tables for `config`: one per distinct base, in `rope_thetas` order.
    pub fn rope_tables(config: &ModelConfig, device: &B::Device) -> Vec<Rope<B>> {
        config
            .rope_thetas()
            .into_iter()
            .map(|theta| {
                let (hd, len) = (config.head_dim, config.max_seq_len);
                let factors = config.rope_factors.as_deref();
                Rope::new(hd, len, theta, factors, config.rope_style, device)
            })
            .collect()
    }

    /// Which of [`Self::rope_tables`] layer `layer` rotates by.
    pub fn rope_index(config: &ModelConfig, layer: usize) -> usize {
        let theta = config.layers[layer].rope_theta;
        let thetas = config.rope_thetas();
        thetas.iter().position(|&t| t == theta).unwrap_or(0)
    }
}

impl<B: EngineBackend> Model<B> {
    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.config.n_layers)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> B::Device {
        self.net.embedding.device()
    }

    /// Runs `tokens` (continuing the sequence in `cache`) and returns logits
    /// `[rows, vocab]` for the requested positions.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let start = cache.len();
        self.check(tokens, start)?;
        let mut x = self.embed(tokens.iter().copied());
        for (layer, block) in self.net.blocks.iter().enumerate() {
            x = block.forward(x, &self.ropes[block.rope], cache, layer, start);
        }
        cache.advance(tokens.len());
        if logits == Logits::Last {
            x = x.narrow(0, tokens.len() - 1, 1);
        }
        Ok(self.output(x))
    }

    /// A paged KV cache for this model with `capacity` blocks aged by `policy`.
    pub fn new_paged_cache(&self, capacity: KvCapacity, policy: TierPolicy) -> PagedKv<B> {
        PagedKv::new(self.kv_dims(), capacity, policy, &self.device())
    }

    /// The dimensions a KV cache of this model stores.
    pub fn kv_dims(&self) -> KvDims {
        let windows: Vec<Option<usize>> = self.config.layers.iter().map(|l| l.window).collect();
        KvDims {
            n_layers: self.config.n_layers,
            n_kv_heads: self.config.n_kv_heads,
            head_dim: self.config.head_dim(),
            sliding: Sliding::of_layers(&windows),
        }
    }

    /// Runs a ragged batch: each sequence's new tokens continue what `kv` holds for it.
    /// Returns logits `[rows, vocab]`: with [`Logits::Last`] one row per sequence (its last
    /// token), with [`Logits::All`] every new token in batch order. Running out of KV
    /// blocks is [`ModelError::Kv`] and leaves every sequence as it was.
    pub fn forward_batch(
        &self,
        batch: &[SeqTokens<'_>],
        kv: &mut PagedKv<B>,
        logits: Logits,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let tails = match logits {
            Logits::Last => Some(vec![1; batch.len()]),
            Logits::All => None,
        };
        self.run_batch(batch, kv, self.net.blocks.len(), tails.as_deref())
    }

    /// [`Self::forward_batch`] returning logits for the last `tails[i]` tokens of each
    /// sequence `i`, in batch order (a speculative verification needs every drafted
    /// position of a sequence, and one row of the others).
    pub fn forward_batch_tails(
        &self,
        batch: &[SeqTokens<'_>],
        kv: &mut PagedKv<B>,
        tails: &[usize],
    ) -> Result<Tensor<B, 2>, ModelError> {
        assert_eq!(tails.len(), batch.len(), "a tail per sequence");
        self.run_batch(batch, kv, self.net.blocks.len(), Some(tails))
    }

    /// The first `layers` blocks only, then the final norm and the output layer: the
    /// shallow self-draft of speculative decoding. Its keys and values are those the
    /// full model writes for those layers. Logits of each sequence's last token.
    pub fn forward_batch_shallow(
        &self,
        batch: &[SeqTokens<'_>],
        kv: &mut PagedKv<B>,
        layers: usize,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let layers = layers.clamp(1, self.net.blocks.len());
        self.run_batch(batch, kv, layers, Some(&vec![1; batch.len()]))
    }

    /// The ragged forward pass through the first `layers` blocks; `tails`: rows of
    /// logits per sequence (`None`: every row).
    fn run_batch(
        &self,
        batch: &[SeqTokens<'_>],
        kv: &mut PagedKv<B>,
        layers: usize,
        tails: Option<&[usize]>,
    ) -> Result<Tensor<B, 2>, ModelError> {
        if batch.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        for s in batch {
            self.check(s.tokens, kv.len(s.seq)?)?;
        }
        let parts: Vec<_> = batch.iter().map(|s| (s.seq, s.tokens.len())).collect();
        let mut paged = kv.prepare(&parts)?;
        paged.fused = B::fused_fit(&self.device());
        let mut x = self.embed(batch.iter().flat_map(|s| s.tokens.iter().copied()));
        for (layer, block) in self.net.blocks.iter().take(layers).enumerate() {
            x = block.forward_paged(x, &self.ropes[block.rope], kv, &paged, layer);
        }
        kv.commit(&parts)?;
        if let Some(tails) = tails {
            let rows: Vec<i64> = paged
                .seqs
                .iter()
                .zip(tails)
                .flat_map(|(s, &t)| {
                    let end = s.row_start + s.rows;
                    (end - t.clamp(1, s.rows)..end).map(|r| r as i64)
                })
                .collect();
            let n = rows.len();
            x = x.select(
                0,
                Tensor::from_data(TensorData::new(rows, [n]), &self.device()),
            );
        }
        Ok(self.output(x))
    }

    /// Checks `tokens` continuing a sequence of `start` tokens.
    fn check(&self, tokens: &[u32], start: usize) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        let needed = start + tokens.len();
        if needed > self.config.max_seq_len {
            return Err(ModelError::ContextOverflow {
                needed,
                limit: self.config.max_seq_len,
            });
        }
        Ok(())
    }

    /// Embeddings `[tokens, d_model]` of checked token ids: the residual stream, FP32
    /// whatever the activations' float type.
    fn embed(&self, tokens: impl Iterator<Item = u32>) -> Tensor<B, 2> {
        let ids: Vec<u32> = tokens.collect();
        let x = self
            .net
            .embedding
            .columns(&ids)
            .cast(burn_tensor::DType::F32);
        match self.config.embed_scale {
            Some(scale) => x.mul_scalar(scale),
            None => x,
        }
    }

    /// Final norm and output layer: FP32 logits whatever the activations' float type.
    fn output(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.net.norm.forward(x);
        match &self.net.output {
            Some(out) => out.forward_f32(x),
            None => self.net.embedding.forward_f32(x),
        }
    }
}
