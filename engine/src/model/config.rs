//! Hyper-parameters of a decoder-only transformer, as the family files read them from
//! GGUF metadata (`super::family`).

use super::ModelError;

/// RoPE's frequency base where a file names none (Llama's).
pub(crate) const DEFAULT_ROPE_THETA: f64 = 10000.0;

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent dimensions `(2i, 2i + 1)`: llama.cpp's converter permutes Llama's Q and K
    /// weights for it.
    Adjacent,
    /// Dimension `i` with `i + head_dim / 2` (GPT-NeoX's layout; Gemma, Qwen).
    Neox,
}

/// The gate of the feed-forward layer: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen).
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma).
    GeluTanh,
}

/// What differs from layer to layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Keys a query sees, itself included (`None`: every earlier key).
    pub window: Option<usize>,
    /// RoPE frequency base.
    pub rope_theta: f64,
}

/// Hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture` of the file (`llama` in `new`).
    pub architecture: String,
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
    /// Size of one attention head (`d_model / n_heads` in `new`).
    pub head_dim: usize,
    /// Inner size of the gated feed-forward layer.
    pub d_ff: usize,
    /// Maximum context length in tokens.
    pub max_seq_len: usize,
    /// Epsilon of the RMS norms (1e-5 in `new`).
    pub rms_eps: f64,
    /// Whether the output layer reuses the token embedding (true in `new`).
    pub tied_embeddings: bool,
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// Factor on the token embeddings (Gemma: `sqrt(d_model)`).
    pub embed_scale: Option<f32>,
    /// RMSNorm over each query and key head before RoPE.
    pub qk_norm: bool,
    /// RMSNorm on the attention and feed-forward outputs before their residual adds.
    pub post_norms: bool,
    /// A bias on each of Q, K and V (Qwen2).
    pub qkv_bias: bool,
    /// A divisor per RoPE frequency, `head_dim / 2` of them (Llama 3's `rope_freqs`
    /// tensor, which stretches the low frequencies for long context).
    pub rope_factors: Option<Vec<f32>>,
    /// One entry per block.
    pub layers: Vec<LayerConfig>,
}

impl ModelConfig {
    /// A Llama-style model of these sizes, in field order: RoPE base 10,000 on adjacent
    /// pairs, SwiGLU, norm epsilon 1e-5, tied embeddings, full attention.
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
            architecture: "llama".into(),
            vocab_size,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim: d_model / n_heads.max(1),
            d_ff,
            max_seq_len,
            rms_eps: 1e-5,
            tied_embeddings: true,
            rope_style: RopeStyle::Adjacent,
            activation: Activation::Silu,
            embed_scale: None,
            qk_norm: false,
            post_norms: false,
            qkv_bias: false,
            rope_factors: None,
            layers: vec![
                LayerConfig {
                    window: None,
                    rope_theta: DEFAULT_ROPE_THETA,
                };
                n_layers
            ],
        }
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Width of the queries of one token (`n_heads * head_dim`).
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The distinct RoPE bases, in order of first use.
    pub fn rope_thetas(&self) -> Vec<f64> {
        let mut thetas: Vec<f64> = Vec::new();
        for l in &self.layers {
            if !thetas.contains(&l.rope_theta) {
                thetas.push(l.rope_theta);
            }
        }
        thetas
    }

    /// Weights one decoder block multiplies a token by (Q, K, V, O and the feed-forward).
    pub fn layer_weights(&self) -> usize {
        let kv = self.n_kv_heads * self.head_dim;
        self.d_model * (2 * self.q_width() + 2 * kv) + 3 * self.d_model * self.d_ff
    }

    /// Weights the output layer multiplies a token by.
    pub fn head_weights(&self) -> usize {
        self.vocab_size * self.d_model
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
            self.head_dim,
            self.d_ff,
            self.max_seq_len,
        ]
        .contains(&0)
        {
            return bad("a size is zero".into());
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head size {} is odd", self.head_dim));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads do not group over {} kv heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.layers.len() != self.n_layers {
            return bad(format!(
                "{} layer entries for {} layers",
                self.layers.len(),
                self.n_layers
            ));
        }
        if let Some(f) = &self.rope_factors {
            if f.len() != self.head_dim / 2 || f.iter().any(|&x| x.is_nan() || x <= 0.0) {
                return bad(format!(
                    "{} RoPE factors for heads of {} (want {} positive ones)",
                    f.len(),
                    self.head_dim,
                    self.head_dim / 2
                ));
            }
        }
        if self.layers.iter().any(|l| l.window == Some(0)) {
            return bad("an attention window of zero keys".into());
        }
        Ok(())
    }
}
