//! A small model with random weights, for unit tests of the layers (never for claims
//! about the real model).

use burn_tensor::{backend::Backend, Distribution, Tensor};

use super::{Attention, Block, Joint, Linear, Llama, LlamaConfig, LlamaModel, Mlp, RmsNorm, Rope};

impl<B: Backend> LlamaModel<B> {
    /// Random weights of scale 0.1 for `config` (tied embeddings); seed the backend first
    /// with `B::seed` for reproducible values.
    pub fn random(config: LlamaConfig, device: &B::Device) -> Self {
        let w = |rows: usize, cols: usize| {
            Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 0.1), device)
        };
        let lin = |i: usize, o: usize| Linear::new(w(i, o));
        let norm = || RmsNorm::new(Tensor::ones([config.d_model], device), config.rms_eps);
        let (d, hd) = (config.d_model, config.head_dim());
        let blocks = (0..config.n_layers)
            .map(|_| Block {
                attn_norm: norm(),
                attn: Attention {
                    qkv: Joint::Parts(vec![
                        lin(d, config.n_heads * hd),
                        lin(d, config.n_kv_heads * hd),
                        lin(d, config.n_kv_heads * hd),
                    ]),
                    o: lin(config.n_heads * hd, d),
                    n_heads: config.n_heads,
                    n_kv_heads: config.n_kv_heads,
                },
                ffn_norm: norm(),
                mlp: Mlp {
                    gate_up: Joint::Parts(vec![lin(d, config.d_ff), lin(d, config.d_ff)]),
                    down: lin(config.d_ff, d),
                },
            })
            .collect();
        Self {
            net: Llama {
                embedding: Linear::new(w(d, config.vocab_size)),
                output: None,
                blocks,
                norm: norm(),
            },
            rope: Rope::new(hd, config.max_seq_len, config.rope_theta, device),
            config,
        }
    }
}
