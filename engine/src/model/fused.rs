//! A layer as few kernels: products whose epilogue does the layer's element-wise work.
//! With Q, K and V joined (`[q | k | v]` rows) and gate and up joined (rows interleaved), a
//! Llama block is seven dispatches on CubeCL backends: RMSNorm, the QKV product with
//! RoPE and the KV write, attention, the O product with the residual add, RMSNorm, the
//! gate-up product with SwiGLU, the down product with the residual add
//! (`fornax_shaders::epilogue`). A Gemma block is nine: its head norms (and NeoX RoPE) take
//! a kernel after the QKV product, and each post norm one kernel with its residual add, the
//! one after attention with the FFN's norm too (`fornax_shaders::layer_ops`). The defaults
//! are the same work as separate operations.

use burn_cubecl::{tensor::CubeTensor, BoolElement, CubeBackend, CubeRuntime};
use burn_cubecl::{FloatElement, IntElement};
use burn_tensor::{backend::Backend, Tensor, TensorPrimitive};
use fornax_shaders::layer_launch::{self, HeadWork, Norm};
use fornax_shaders::quant_launch::{self, Epilogue, RopeKv};

use super::attention::per_head;
use super::joint::split;
use super::{Activation, LayerOps, RmsNorm, Rope, RopeStyle, Rows};
use crate::kv::{AttentionShape, KvStore, PagedBatch};
use crate::quant::{by_dequantized_rows, quant_tensors, QuantMatrix, QuantOps};

/// Where the QKV product's results go: the query and key head norms where the block has
/// them, RoPE from `rope`, K and V into `store`'s FP32 arenas of `layer` at the rows
/// `batch` reserved.
pub struct QkvTarget<'a, B: Backend> {
    /// Q, K and V's biases, end to end (Qwen2).
    pub bias: Option<&'a Tensor<B, 1>>,
    pub head_norms: Option<&'a (RmsNorm<B>, RmsNorm<B>)>,
    pub rope: &'a Rope<B>,
    pub store: &'a mut KvStore<B>,
    pub layer: usize,
    pub batch: &'a PagedBatch<B>,
    pub shape: AttentionShape,
}

/// Backends whose products can carry a layer's element-wise work.
pub trait FusedOps: QuantOps + LayerOps {
    /// Whether the fused kernels exist here, so that the loader joins Q, K, V and gate, up.
    fn has_fused_layers() -> bool {
        false
    }

    /// Whether the fused kernels can be bound on `device` (browsers limit bindings).
    fn fused_fit(_device: &Self::Device) -> bool {
        Self::has_fused_layers()
    }

    /// Q with RoPE from `x @ [Wq | Wk | Wv]^T` (`w` stacked); K with RoPE and V written
    /// into the KV arenas; the biases, then the head norms, before RoPE where `to` has
    /// them.
    fn qkv_rope_kv(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        to: QkvTarget<'_, Self>,
    ) -> Tensor<Self, 2> {
        let q_width = to.shape.n_heads * to.shape.head_dim;
        let kv_width = to.shape.n_kv_heads * to.shape.head_dim;
        let widths = [q_width, kv_width, kv_width];
        let qkv = Self::quant_matmul(x, w);
        let qkv = match to.bias {
            Some(bias) => qkv + bias.clone().unsqueeze_dim(0),
            None => qkv,
        };
        let [q, k, v]: [Tensor<Self, 2>; 3] = split(qkv, &widths, Rows::Stacked)
            .try_into()
            .unwrap_or_else(|_| unreachable!("Q, K and V"));
        let (q, k) = match to.head_norms {
            Some((qn, kn)) => (
                per_head(qn, q, to.shape.n_heads),
                per_head(kn, k, to.shape.n_kv_heads),
            ),
            None => (q, k),
        };
        let positions = to.batch.positions.clone();
        let k = Self::rope_rows(k, to.shape.n_kv_heads, positions.clone(), to.rope);
        to.store.write(to.layer, to.batch.write_rows.clone(), k, v);
        Self::rope_rows(q, to.shape.n_heads, positions, to.rope)
    }

    /// `residual + x @ W^T`.
    fn matmul_residual(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        residual: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        residual + Self::quant_matmul(x, w)
    }

    /// `act(gate) * up` from `x @ W^T` with gate and up rows interleaved in `w`.
    fn gate_up_gated(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        let out = Self::quant_matmul(x, w);
        let half = out.dims()[1] / 2;
        let [gate, up]: [Tensor<Self, 2>; 2] = split(out, &[half, half], Rows::Interleaved)
            .try_into()
            .unwrap_or_else(|_| unreachable!("gate and up"));
        match activation {
            Activation::Silu => Self::swiglu(gate, up),
            Activation::GeluTanh => Self::geglu(gate, up),
        }
    }

    /// `h = residual + post(a)`, and `next(h)` where given (a post norm, its residual add
    /// and the following pre-norm).
    fn norm_residual(
        a: Tensor<Self, 2>,
        post: &RmsNorm<Self>,
        residual: Tensor<Self, 2>,
        next: Option<&RmsNorm<Self>>,
    ) -> (Tensor<Self, 2>, Option<Tensor<Self, 2>>) {
        let h = residual + post.forward(a);
        let n = next.map(|norm| norm.forward(h.clone()));
        (h, n)
    }
}

impl FusedOps for crate::CpuBackend {}

fn float<R, F, I, BT>(t: Tensor<CubeBackend<R, F, I, BT>, 2>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    t.into_primitive().tensor()
}

/// An RMSNorm as the layer kernels take it.
fn norm<R, F, I, BT>(n: &RmsNorm<CubeBackend<R, F, I, BT>>) -> Norm<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    Norm {
        weight: n.weight.clone().into_primitive().tensor(),
        eps: n.eps as f32,
    }
}

/// `x @ W^T` with `epilogue` in one kernel; on devices that multiply many tokens as FP32
/// matmuls (lavapipe) the epilogue is a second dispatch after the product.
fn product_then<R, F, I, BT>(
    x: Tensor<CubeBackend<R, F, I, BT>, 2>,
    w: &QuantMatrix<CubeBackend<R, F, I, BT>>,
    epilogue: Epilogue<R>,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let x = float(x);
    let out = if quant_launch::dequantize_for_many(&x.client, x.meta.shape()[0]) {
        let product = by_dequantized_rows(Tensor::from_primitive(TensorPrimitive::Float(x)), w);
        quant_launch::finish(float(product), epilogue)
    } else {
        quant_launch::matmul_then(x, &quant_tensors(w), None, epilogue)
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

impl<R, F, I, BT> FusedOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn has_fused_layers() -> bool {
        Self::has_quant_kernels()
    }

    fn fused_fit(device: &Self::Device) -> bool {
        Self::has_fused_layers() && quant_launch::epilogue_fits(&R::client(device))
    }

    fn qkv_rope_kv(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        to: QkvTarget<'_, Self>,
    ) -> Tensor<Self, 2> {
        let (keys, values) = to.store.f32_arenas(to.layer);
        let target = RopeKv {
            keys: float(keys.clone()),
            values: float(values.clone()),
            info: to.batch.rope_rows.clone().into_primitive(),
            table: float(to.rope.pairs().clone()),
            q_width: to.shape.n_heads * to.shape.head_dim,
            kv_width: to.shape.n_kv_heads * to.shape.head_dim,
            head_dim: to.shape.head_dim,
        };
        let neox = to.rope.style() == RopeStyle::Neox;
        if to.head_norms.is_none() && !neox && to.bias.is_none() {
            return product_then(x, w, Epilogue::RopeKv(target));
        }
        let work = HeadWork {
            norms: to.head_norms.map(|(q, k)| (norm(q), norm(k))),
            neox,
        };
        let qkv = product_then(x, w, Epilogue::Store);
        // The biases are one more dispatch: the head kernel does not add them yet.
        let qkv = float(match to.bias {
            Some(bias) => qkv + bias.clone().unsqueeze_dim(0),
            None => qkv,
        });
        let act = crate::backend::activation_dtype::<Self>(&qkv.device);
        let q = layer_launch::qkv_heads(qkv, target, work, act);
        Tensor::from_primitive(TensorPrimitive::Float(q))
    }

    fn matmul_residual(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        residual: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        product_then(x, w, Epilogue::Residual(float(residual)))
    }

    fn gate_up_gated(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        let epilogue = match activation {
            Activation::Silu => Epilogue::Swiglu,
            Activation::GeluTanh => Epilogue::Geglu,
        };
        product_then(x, w, epilogue)
    }

    fn norm_residual(
        a: Tensor<Self, 2>,
        post: &RmsNorm<Self>,
        residual: Tensor<Self, 2>,
        next: Option<&RmsNorm<Self>>,
    ) -> (Tensor<Self, 2>, Option<Tensor<Self, 2>>) {
        let act = crate::backend::activation_dtype::<Self>(&a.device());
        let (h, n) =
            layer_launch::norm_residual(float(a), norm(post), float(residual), next.map(norm), act);
        let tensor = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
        (tensor(h), n.map(tensor))
    }
}
