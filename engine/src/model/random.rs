//! A small model with random weights, for unit tests of the layers (never for claims
//! about the real model).

use burn_tensor::{backend::Backend, Distribution, Tensor};

use super::{Attention, Block, Joint, Linear, Mlp, Model, ModelConfig, Net, RmsNorm};

impl<B: Backend> Model<B> {
    /// Random weights of scale 0.1 for `config` (tied embeddings); seed the backend first
    /// with `B::seed` for reproducible values.
    pub fn random(config: ModelConfig, device: &B::Device) -> Self {
        let w = |rows: usize, cols: usize| {
            Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 0.1), device)
        };
        let lin = |i: usize, o: usize| Linear::new(w(i, o));
        let ones = |n: usize| RmsNorm::new(Tensor::ones([n], device), config.rms_eps);
        let norm = || ones(config.d_model);
        let (d, hd) = (config.d_model, config.head_dim);
        let blocks = (0..config.n_layers)
            .map(|i| Block {
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
                    head_dim: hd,
                    head_norms: config.qk_norm.then(|| (ones(hd), ones(hd))),
                    bias: None,
                    window: config.layers[i].window,
                },
                ffn_norm: norm(),
                mlp: Mlp {
                    gate_up: Joint::Parts(vec![lin(d, config.d_ff), lin(d, config.d_ff)]),
                    down: lin(config.d_ff, d),
                    activation: config.activation,
                },
                post_norms: config.post_norms.then(|| (norm(), norm())),
                rope: Self::rope_index(&config, i),
            })
            .collect();
        Self {
            net: Net {
                embedding: Linear::new(w(d, config.vocab_size)),
                output: None,
                blocks,
                norm: norm(),
            },
            ropes: Self::rope_tables(&config, device),
            config,
        }
    }
}
