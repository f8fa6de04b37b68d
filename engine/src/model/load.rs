//! Builds a [`LlamaModel`] from GGUF tensors: quantized matrices stay quantized on
//! backends with the kernels for them, everything else is dequantized to FP32 on the host.

use burn_tensor::{backend::Backend, Tensor, TensorData};

use super::{
    Attention, Block, FusedOps, Joint, Linear, Llama, LlamaConfig, LlamaModel, Mlp, ModelError,
    RmsNorm, Rope, Rows,
};
use crate::gguf::{GgufError, GgufFile};
use crate::quant::{format_code, PackedMatrix, QuantMatrix, QuantOps};
use fornax_shaders::quant_matmul::QBLOCK;

/// How the weights are loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Dequantize every matrix to FP32 even where quantized kernels exist (the reference
    /// path, `--dequantize`).
    pub dequantize: bool,
    /// Keep Q, K, V and gate, up as separate matrices and run each layer operation by
    /// operation (the reference for the fused kernels, `--reference-ops`).
    pub reference_ops: bool,
}

struct Loader<'f, 'a, B: Backend> {
    file: &'f GgufFile<'a>,
    device: &'f B::Device,
    done: usize,
    total: usize,
    progress: &'f mut dyn FnMut(usize, usize),
    /// Keep quantized matrices quantized.
    quantized: bool,
    /// Join Q, K, V and gate, up into one matrix each (for the fused kernels).
    join: bool,
}

impl<B: QuantOps> Loader<'_, '_, B> {
    /// Checks that `name` has row-major shape `dims` and counts it as loaded.
    fn check(&mut self, name: &str, dims: &[usize]) -> Result<(), ModelError> {
        let found = self.file.tensor(name)?.dims_row_major();
        if found != dims {
            return Err(GgufError::ShapeMismatch {
                name: name.to_string(),
                expected: dims.iter().map(|&d| d as u64).collect(),
                found: found.iter().map(|&d| d as u64).collect(),
            }
            .into());
        }
        self.done += 1;
        (self.progress)(self.done, self.total);
        Ok(())
    }

    /// Dequantizes `name` after checking its row-major shape.
    fn values(&mut self, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.check(name, dims)?;
        Ok(self.file.dequantize(name)?.0)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor<B, 1>, ModelError> {
        let v = self.values(name, &[len])?;
        Ok(Tensor::from_data(TensorData::new(v, [len]), self.device))
    }

    /// A GGUF matrix stored `[out, in]`, uploaded transposed as `[in, out]`.
    fn transposed(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let v = self.values(name, &[out, inp])?;
        let mut t = vec![0.0f32; v.len()];
        for (r, row) in v.chunks_exact(inp).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                t[c * out + r] = x;
            }
        }
        Ok(Tensor::from_data(
            TensorData::new(t, [inp, out]),
            self.device,
        ))
    }

    /// The `[out, in]` matrix `name` as a layer `in -> out`: quantized blocks uploaded
    /// as they are when the loader keeps them, else FP32.
    fn linear(&mut self, name: &str, inp: usize, out: usize) -> Result<Linear<B>, ModelError> {
        let info = self.file.tensor(name)?;
        let packed = match self.quantized && info.dims_row_major() == [out, inp] {
            true => PackedMatrix::pack(info.ggml_type, self.file.tensor_bytes(info), out, inp),
            false => None,
        };
        match packed {
            Some(packed) => {
                self.check(name, &[out, inp])?;
                Ok(Linear::quantized(QuantMatrix::from_packed(
                    packed,
                    self.device,
                )))
            }
            None => Ok(Linear::new(self.transposed(name, out, inp)?)),
        }
    }
}

impl<B: QuantOps> Loader<'_, '_, B> {
    /// The `[width, inp]` matrices `parts` (name, width) as one joined quantized layer
    /// when the loader joins and they share a quantized format, else one layer each.
    fn joint(
        &mut self,
        parts: &[(String, usize)],
        inp: usize,
        rows: Rows,
    ) -> Result<Joint<B>, ModelError> {
        if let Some(layer) = self.joined(parts, inp, rows)? {
            let widths = parts.iter().map(|p| p.1).collect();
            return Ok(Joint::One {
                layer,
                widths,
                rows,
            });
        }
        let layers = parts
            .iter()
            .map(|(name, width)| self.linear(name, inp, *width))
            .collect::<Result<_, _>>()?;
        Ok(Joint::Parts(layers))
    }

    fn joined(
        &mut self,
        parts: &[(String, usize)],
        inp: usize,
        rows: Rows,
    ) -> Result<Option<Linear<B>>, ModelError> {
        if !(self.quantized && self.join) {
            return Ok(None);
        }
        let mut infos = Vec::with_capacity(parts.len());
        for (name, width) in parts {
            let info = self.file.tensor(name)?;
            if info.dims_row_major() != [*width, inp] {
                return Ok(None);
            }
            infos.push(info);
        }
        let ty = infos[0].ggml_type;
        let same_width = parts.iter().all(|p| p.1 == parts[0].1);
        if format_code(ty).is_none()
            || !inp.is_multiple_of(QBLOCK)
            || infos.iter().any(|i| i.ggml_type != ty)
            || (rows == Rows::Interleaved && !same_width)
        {
            return Ok(None);
        }
        let total: usize = parts.iter().map(|p| p.1).sum();
        let row_bytes = inp / QBLOCK * ty.block_bytes() as usize;
        let bytes: Vec<&[u8]> = infos.iter().map(|i| self.file.tensor_bytes(i)).collect();
        let mut joined = Vec::with_capacity(total * row_bytes);
        match rows {
            Rows::Stacked => bytes.iter().for_each(|b| joined.extend_from_slice(b)),
            Rows::Interleaved => {
                for j in 0..parts[0].1 {
                    for b in &bytes {
                        joined.extend_from_slice(&b[j * row_bytes..(j + 1) * row_bytes]);
                    }
                }
            }
        }
        let Some(packed) = PackedMatrix::pack(ty, &joined, total, inp) else {
            return Ok(None);
        };
        for (name, width) in parts {
            self.check(name, &[*width, inp])?;
        }
        Ok(Some(Linear::quantized(QuantMatrix::from_packed(
            packed,
            self.device,
        ))))
    }
}

impl<B: QuantOps + FusedOps> LlamaModel<B> {
    /// Loads a llama-architecture GGUF onto `device`, keeping quantized matrices
    /// quantized where `B` has kernels for them; `progress(done, total)` is called after
    /// each tensor.
    pub fn from_gguf(
        file: &GgufFile<'_>,
        device: &B::Device,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        Self::from_gguf_with(file, device, LoadOptions::default(), progress)
    }

    /// The largest weight tensor the model would hold on the device, as its name and
    /// bytes: block-quantized matrices take their file size where `B` keeps them
    /// quantized, everything else 4 bytes a value. Devices cap a single buffer (WebGPU's
    /// storage binding), so this tells before loading whether the weights can fit.
    pub fn largest_weight(file: &GgufFile<'_>, options: LoadOptions) -> Option<(String, u64)> {
        let quantized = !options.dequantize && B::has_quant_kernels();
        file.tensors
            .iter()
            .map(|t| match quantized && format_code(t.ggml_type).is_some() {
                true => (t.name.clone(), t.size),
                false => (t.name.clone(), 4 * t.elements()),
            })
            .max_by_key(|(_, bytes)| *bytes)
    }

    /// [`Self::from_gguf`] with options.
    pub fn from_gguf_with(
        file: &GgufFile<'_>,
        device: &B::Device,
        options: LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        let c = LlamaConfig::from_gguf(file)?;
        let (d, hd) = (c.d_model, c.head_dim());
        let total = 2 + 9 * c.n_layers + usize::from(!c.tied_embeddings);
        let mut l = Loader::<B> {
            file,
            device,
            done: 0,
            total,
            progress,
            quantized: !options.dequantize && B::has_quant_kernels(),
            join: B::has_fused_layers() && !options.reference_ops,
        };
        let embedding = l.linear("token_embd.weight", d, c.vocab_size)?;
        let output = match c.tied_embeddings {
            true => None,
            false => Some(l.linear("output.weight", d, c.vocab_size)?),
        };
        let mut blocks = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                attn_norm: RmsNorm::new(l.vector(&n("attn_norm"), d)?, c.rms_eps),
                attn: Attention {
                    qkv: l.joint(
                        &[
                            (n("attn_q"), c.n_heads * hd),
                            (n("attn_k"), c.n_kv_heads * hd),
                            (n("attn_v"), c.n_kv_heads * hd),
                        ],
                        d,
                        Rows::Stacked,
                    )?,
                    o: l.linear(&n("attn_output"), c.n_heads * hd, d)?,
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                },
                ffn_norm: RmsNorm::new(l.vector(&n("ffn_norm"), d)?, c.rms_eps),
                mlp: Mlp {
                    gate_up: l.joint(
                        &[(n("ffn_gate"), c.d_ff), (n("ffn_up"), c.d_ff)],
                        d,
                        Rows::Interleaved,
                    )?,
                    down: l.linear(&n("ffn_down"), c.d_ff, d)?,
                },
            });
        }
        let norm = RmsNorm::new(l.vector("output_norm.weight", d)?, c.rms_eps);
        Ok(Self {
            net: Llama {
                embedding,
                output,
                blocks,
                norm,
            },
            rope: Rope::new(hd, c.max_seq_len, c.rope_theta, device),
            config: c,
        })
    }
}
