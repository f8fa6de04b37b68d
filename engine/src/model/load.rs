//! Builds a [`Model`] from GGUF tensors (the names llama.cpp gives them): quantized matrices stay quantized on
//! backends with the kernels for them, everything else is dequantized to FP32 on the host.

use burn_tensor::{backend::Backend, Tensor, TensorData};

use super::{
    config_from_gguf, Attention, Block, FusedOps, Joint, Linear, Mlp, Model, ModelError, Net,
    RmsNorm, Rows,
};
use std::borrow::Cow;

use crate::gguf::{GgmlType, GgufError, GgufFile};
use crate::quant::{PackedMatrix, QuantMatrix, QuantOps};
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

    /// A norm's weight or a bias: FP32 whatever the activations' float type.
    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor<B, 1>, ModelError> {
        let v = self.values(name, &[len])?;
        Ok(Tensor::from_data(
            TensorData::new(v, [len]),
            (self.device, burn_tensor::DType::F32),
        ))
    }

    /// Rows `[out, inp]` (row-major) uploaded transposed as `[inp, out]`.
    fn transposed(&self, v: &[f32], out: usize, inp: usize) -> Tensor<B, 2> {
        let mut t = vec![0.0f32; v.len()];
        for (r, row) in v.chunks_exact(inp).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                t[c * out + r] = x;
            }
        }
        Tensor::from_data(TensorData::new(t, [inp, out]), self.device)
    }

    /// Rows per band of a matrix of `out` rows of `row_bytes` bytes (as packed): all of
    /// them where the matrix fits in three quarters of the device's largest buffer, else
    /// as many as fit.
    fn band_rows(&self, out: usize, row_bytes: usize) -> usize {
        let room = B::max_buffer_bytes(self.device).map_or(usize::MAX, |m| m / 4 * 3);
        (room / row_bytes.max(1)).clamp(1, out.max(1))
    }

    /// The `[out, in]` matrix `name` as a layer `in -> out`: quantized blocks uploaded
    /// as they are when the loader keeps them, else FP32; in bands of rows where it is
    /// larger than the device holds in one buffer.
    fn linear(&mut self, name: &str, inp: usize, out: usize) -> Result<Linear<B>, ModelError> {
        let info = self.file.tensor(name)?;
        if self.quantized
            && B::has_kernels_for(info.ggml_type)
            && info.dims_row_major() == [out, inp]
        {
            let bytes = self.file.tensor_bytes(info);
            let row_bytes = bytes.len() / out.max(1);
            let packed_row = PackedMatrix::row_bytes(info.ggml_type, inp).unwrap_or(row_bytes);
            let band = self.band_rows(out, packed_row);
            let packed: Option<Vec<PackedMatrix>> = (0..out)
                .step_by(band)
                .map(|r0| {
                    let r1 = (r0 + band).min(out);
                    let rows = &bytes[r0 * row_bytes..r1 * row_bytes];
                    PackedMatrix::pack(info.ggml_type, rows, r1 - r0, inp)
                })
                .collect();
            if let Some(packed) = packed {
                self.check(name, &[out, inp])?;
                let device = self.device;
                let layers = packed
                    .into_iter()
                    .map(|p| Linear::quantized(QuantMatrix::from_packed(p, device)))
                    .collect();
                return Ok(one_or_bands(layers));
            }
        }
        let v = self.values(name, &[out, inp])?;
        let band = self.band_rows(out, inp * 4);
        let layers = v
            .chunks(band * inp)
            .map(|rows| Linear::new(self.transposed(rows, rows.len() / inp, inp)))
            .collect();
        Ok(one_or_bands(layers))
    }
}

/// One layer, or the bands of one.
fn one_or_bands<B: Backend>(mut layers: Vec<Linear<B>>) -> Linear<B> {
    match layers.len() {
        1 => layers.pop().expect("one layer"),
        _ => Linear::bands(layers),
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
        // Parts of different types join as Q8_0 where each widens to it exactly (Gemma's
        // Q4_K_M files keep Q and K in Q5_0 beside V in Q8_0 in half the layers).
        let ty = match infos.iter().all(|i| i.ggml_type == infos[0].ggml_type) {
            true => infos[0].ggml_type,
            false => GgmlType::Q8_0,
        };
        let same_width = parts.iter().all(|p| p.1 == parts[0].1);
        if !B::has_kernels_for(ty)
            || !inp.is_multiple_of(QBLOCK)
            || (rows == Rows::Interleaved && !same_width)
        {
            return Ok(None);
        }
        let mut bytes: Vec<Cow<[u8]>> = Vec::with_capacity(infos.len());
        for info in &infos {
            let raw = self.file.tensor_bytes(info);
            bytes.push(match info.ggml_type == ty {
                true => Cow::Borrowed(raw),
                false => match info.ggml_type.widened_to_q8_0(raw) {
                    Some(wide) => Cow::Owned(wide),
                    None => return Ok(None),
                },
            });
        }
        let total: usize = parts.iter().map(|p| p.1).sum();
        // A row is whole blocks of the type (32 values, or 256 for the K-quants).
        let Some(row_bytes) = ty.bytes_for(inp as u64).map(|b| b as usize) else {
            return Ok(None);
        };
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

impl<B: QuantOps + FusedOps> Model<B> {
    /// Loads a GGUF of a supported architecture onto `device`, keeping quantized matrices
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
    /// bytes: block-quantized matrices take their packed size where `B` keeps them
    /// quantized (the file's, or wider for the K-quants' groups), everything else 4 bytes
    /// a value. Devices cap a single buffer (WebGPU's
    /// storage binding), so this tells before loading whether the weights can fit.
    pub fn largest_weight(file: &GgufFile<'_>, options: LoadOptions) -> Option<(String, u64)> {
        let quantized = !options.dequantize && B::has_quant_kernels();
        file.tensors
            .iter()
            .map(|t| match quantized && B::has_kernels_for(t.ggml_type) {
                true => {
                    let cols = t.shape.first().copied().unwrap_or(0) as usize;
                    let rows = t.elements() / cols.max(1) as u64;
                    let packed = PackedMatrix::row_bytes(t.ggml_type, cols)
                        .map_or(t.size, |row| row as u64 * rows);
                    (t.name.clone(), packed)
                }
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
        let c = config_from_gguf(file)?;
        let (d, hd) = (c.d_model, c.head_dim);
        let per_layer = 9
            + 2 * usize::from(c.qk_norm)
            + 2 * usize::from(c.post_norms)
            + 3 * usize::from(c.qkv_bias);
        let total = 2 + per_layer * c.n_layers + usize::from(!c.tied_embeddings);
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
            let mut norm = |s: &str, len: usize| -> Result<RmsNorm<B>, ModelError> {
                Ok(RmsNorm::new(l.vector(&n(s), len)?, c.rms_eps))
            };
            let attn_norm = norm("attn_norm", d)?;
            let head_norms = match c.qk_norm {
                true => Some((norm("attn_q_norm", hd)?, norm("attn_k_norm", hd)?)),
                false => None,
            };
            let ffn_norm = norm("ffn_norm", d)?;
            let post_norms = match c.post_norms {
                true => Some((norm("post_attention_norm", d)?, norm("post_ffw_norm", d)?)),
                false => None,
            };
            let bias = match c.qkv_bias {
                true => {
                    let kv = c.n_kv_heads * hd;
                    let mut b = |s: &str, len| l.vector(&format!("blk.{i}.{s}.bias"), len);
                    let parts = vec![
                        b("attn_q", c.q_width())?,
                        b("attn_k", kv)?,
                        b("attn_v", kv)?,
                    ];
                    Some(Tensor::cat(parts, 0))
                }
                false => None,
            };
            blocks.push(Block {
                attn_norm,
                attn: Attention {
                    qkv: l.joint(
                        &[
                            (n("attn_q"), c.q_width()),
                            (n("attn_k"), c.n_kv_heads * hd),
                            (n("attn_v"), c.n_kv_heads * hd),
                        ],
                        d,
                        Rows::Stacked,
                    )?,
                    o: l.linear(&n("attn_output"), c.q_width(), d)?,
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                    head_norms,
                    bias,
                    window: c.layers[i].window,
                },
                ffn_norm,
                mlp: Mlp {
                    gate_up: l.joint(
                        &[(n("ffn_gate"), c.d_ff), (n("ffn_up"), c.d_ff)],
                        d,
                        Rows::Interleaved,
                    )?,
                    down: l.linear(&n("ffn_down"), c.d_ff, d)?,
                    activation: c.activation,
                },
                post_norms,
                rope: Self::rope_index(&c, i),
            });
        }
        let norm = RmsNorm::new(l.vector("output_norm.weight", d)?, c.rms_eps);
        Ok(Self {
            net: Net {
                embedding,
                output,
                blocks,
                norm,
            },
            ropes: Self::rope_tables(&c, device),
            config: c,
        })
    }
}
