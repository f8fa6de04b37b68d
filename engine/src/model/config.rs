//! Llama hyper-parameters, read from GGUF metadata.

use super::ModelError;
use crate::gguf::GgufFile;

/// RoPE's frequency base where a file names none (Llama's).
const DEFAULT_ROPE_THETA: f64 = 10000.0;

/// Hyper-parameters of a Llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Inner size of the SwiGLU feed-forward layer.
    pub d_ff: usize,
    /// Maximum context length in tokens.
    pub max_seq_len: usize,
    /// RoPE frequency base (10,000 in `new` and when the file names none).
    pub rope_theta: f64,
    /// Epsilon of the RMS norms (1e-5 in `new`).
    pub rms_eps: f64,
    /// Whether the output layer reuses the token embedding (true in `new`).
    pub tied_embeddings: bool,
}

impl LlamaConfig {
    /// The sizes, in field order, with Llama's defaults for the rest: RoPE base 10,000,
    /// norm epsilon 1e-5, tied embeddings.
    pub fn new(
        vocab_size: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        d_ff: usize,
        max_seq_len: usize,
    ) -> Self {
        Self {
            vocab_size,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads,
            d_ff,
            max_seq_len,
            rope_theta: DEFAULT_ROPE_THETA,
            rms_eps: 1e-5,
            tied_embeddings: true,
        }
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Weights one decoder block multiplies a token by (Q, K, V, O and the feed-forward).
    pub fn layer_weights(&self) -> usize {
        let kv = self.n_kv_heads * self.head_dim();
        self.d_model * (2 * self.d_model + 2 * kv) + 3 * self.d_model * self.d_ff
    }

    /// Weights the output layer multiplies a token by.
    pub fn head_weights(&self) -> usize {
        self.vocab_size * self.d_model
    }

    /// Reads the hyper-parameters of a `llama` GGUF file.
    pub fn from_gguf(file: &GgufFile<'_>) -> Result<Self, ModelError> {
        let arch = file.str("general.architecture")?;
        if !super::ARCHITECTURES.contains(&arch) {
            return Err(ModelError::UnsupportedArchitecture(arch.to_string()));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_key = |k: &str| file.u64(&key(k)).map(|v| v as usize);
        let n_heads = usize_key("attention.head_count")?;
        let vocab_size = match file.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => file.array("tokenizer.ggml.tokens")?.len(),
        };
        let config = Self {
            vocab_size,
            d_model: usize_key("embedding_length")?,
            n_layers: usize_key("block_count")?,
            n_heads,
            n_kv_heads: file
                .get(&key("attention.head_count_kv"))
                .and_then(|v| v.as_u64())
                .map_or(n_heads, |v| v as usize),
            d_ff: usize_key("feed_forward_length")?,
            max_seq_len: usize_key("context_length")?,
            rope_theta: file
                .get(&key("rope.freq_base"))
                .and_then(|v| v.as_f64())
                .unwrap_or(DEFAULT_ROPE_THETA),
            rms_eps: file.f64(&key("attention.layer_norm_rms_epsilon"))?,
            tied_embeddings: file.tensor("output.weight").is_err(),
        };
        config.validate()?;
        if let Some(rope_dims) = file
            .get(&key("rope.dimension_count"))
            .and_then(|v| v.as_u64())
        {
            if rope_dims as usize != config.head_dim() {
                return Err(ModelError::BadConfig(format!(
                    "partial RoPE ({rope_dims} of {} dims) is not supported",
                    config.head_dim()
                )));
            }
        }
        Ok(config)
    }

    /// Checks the sizes are consistent.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::BadConfig(m));
        if [
            self.vocab_size,
            self.d_model,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.d_ff,
            self.max_seq_len,
        ]
        .contains(&0)
        {
            return bad("a size is zero".into());
        }
        if !self.d_model.is_multiple_of(self.n_heads) || !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "d_model {} does not split into {} even heads",
                self.d_model, self.n_heads
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads do not group over {} kv heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        Ok(())
    }
}
