//! A layer as few kernels: products whose epilogue does the layer's element-wise work.
//! With Q, K and V joined (`[q | k | v]` rows) and gate and up joined (rows interleaved), a
//! decoder block is seven dispatches on CubeCL backends: RMSNorm, the QKV product with
//! RoPE and the KV write, attention, the O product with the residual add, RMSNorm, the
//! gate-up product with SwiGLU, the down product with the residual add
//! (`fornax_shaders::epilogue`). The defaults are the same work as separate operations.

use burn_cubecl::{tensor::CubeTensor, BoolElement, CubeBackend, CubeRuntime};
use burn_cubecl::{FloatElement, IntElement};
use burn_tensor::{backend::Backend, Tensor, TensorPrimitive};
use fornax_shaders::quant_launch::{self, Epilogue, RopeKv};

use super::joint::split;
use super::{LayerOps, Rope, Rows};
use crate::kv::{AttentionShape, KvStore, PagedBatch};
use crate::quant::{by_dequantized_rows, quant_tensors, QuantMatrix, QuantOps};

/// Where the QKV product's results go: RoPE from `rope`, K and V into `store`'s FP32
/// arenas of `layer` at the rows `batch` reserved.
pub struct QkvTarget<'a, B: Backend> {
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
    /// into the KV arenas.
    fn qkv_rope_kv(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        to: QkvTarget<'_, Self>,
    ) -> Tensor<Self, 2> {
        let q_width = to.shape.n_heads * to.shape.head_dim;
        let kv_width = to.shape.n_kv_heads * to.shape.head_dim;
        let widths = [q_width, kv_width, kv_width];
        let [q, k, v]: [Tensor<Self, 2>; 3] =
            split(Self::quant_matmul(x, w), &widths, Rows::Stacked)
                .try_into()
                .unwrap_or_else(|_| unreachable!("Q, K and V"));
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

    /// `silu(gate) * up` from `x @ W^T` with gate and up rows interleaved in `w`.
    fn gate_up_swiglu(x: Tensor<Self, 2>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        let out = Self::quant_matmul(x, w);
        let half = out.dims()[1] / 2;
        let [gate, up]: [Tensor<Self, 2>; 2] = split(out, &[half, half], Rows::Interleaved)
            .try_into()
            .unwrap_or_else(|_| unreachable!("gate and up"));
        Self::swiglu(gate, up)
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
        let epilogue = Epilogue::RopeKv(RopeKv {
            keys: float(keys.clone()),
            values: float(values.clone()),
            info: to.batch.rope_rows.clone().into_primitive(),
            table: float(
                to.rope
                    .pairs()
                    .expect("fused blocks rotate adjacent pairs")
                    .clone(),
            ),
            q_width: to.shape.n_heads * to.shape.head_dim,
            kv_width: to.shape.n_kv_heads * to.shape.head_dim,
            head_dim: to.shape.head_dim,
        });
        product_then(x, w, epilogue)
    }

    fn matmul_residual(
        x: Tensor<Self, 2>,
        w: &QuantMatrix<Self>,
        residual: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        product_then(x, w, Epilogue::Residual(float(residual)))
    }

    fn gate_up_swiglu(x: Tensor<Self, 2>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        product_then(x, w, Epilogue::Swiglu)
    }
}
