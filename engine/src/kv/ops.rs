//! Paged attention as a backend operation: our CubeCL kernels on burn's CubeCL backends
//! (wgpu, CUDA), the burn reference path elsewhere.

use burn::backend::ndarray::{NdArray, NdArrayTensor, SharedArray};
use burn::tensor::{backend::Backend, ops::FloatElem, Tensor, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use fornax_shaders::launch::{self, ArenaTensors, KvArenas};
use fornax_shaders::paged_attention::HEAD_DIM_MULTIPLE;

use super::{reference, AttentionShape, LayerKv, PagedBatch, TierArena};

/// Backends that can attend over the paged KV cache.
pub trait PagedAttentionOps: Backend {
    /// Attention of `q` `[rows, n_heads * head_dim]` (RoPE applied) over `kv` for the
    /// sequences of `batch`; returns `[rows, n_heads * head_dim]`.
    fn paged_attention(
        q: Tensor<Self, 2>,
        kv: &LayerKv<Self>,
        batch: &PagedBatch<Self>,
        shape: AttentionShape,
    ) -> Tensor<Self, 2> {
        reference::paged_attention(q, kv, batch, shape)
    }
}

impl<E, I, Q> PagedAttentionOps for NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    NdArrayTensor: From<SharedArray<E>> + From<SharedArray<I>>,
{
}

impl<R, F, I, BT> PagedAttentionOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn paged_attention(
        q: Tensor<Self, 2>,
        kv: &LayerKv<Self>,
        batch: &PagedBatch<Self>,
        shape: AttentionShape,
    ) -> Tensor<Self, 2> {
        // The kernels are written for FP32 activations, 32-bit table words and head
        // dimensions that are a multiple of their loop step.
        if !batch.kernels
            || FloatElem::<Self>::dtype() != burn::tensor::DType::F32
            || !shape.head_dim.is_multiple_of(HEAD_DIM_MULTIPLE)
        {
            return reference::paged_attention(q, kv, batch, shape);
        }
        let shape = AttentionShape {
            max_blocks: batch.max_blocks,
            ..shape
        };
        let q = q.into_primitive().tensor();
        // Where every tier fits, one kernel per shape serves all batches (each variant
        // costs a shader compile, minutes on lavapipe).
        let tiers_fit = launch::tiers_fit(&q.client);
        let kv = match (batch.all_f32, tiers_fit && !batch.f32_bindings) {
            (true, false) => KvArenas::F32 {
                keys: kv.keys.f32_rows.get().clone().into_primitive().tensor(),
                values: kv.values.f32_rows.get().clone().into_primitive().tensor(),
            },
            (_, true) => KvArenas::Tiers {
                keys: arenas(&kv.keys),
                values: arenas(&kv.values),
            },
            // FP16 or INT8 blocks on a device that cannot bind every tier (a browser).
            (false, false) => {
                let q = Tensor::from_primitive(TensorPrimitive::Float(q));
                return reference::paged_attention(q, kv, batch, shape);
            }
        };
        let tables = batch.tables.clone().into_primitive();
        let out = if batch.decode_only {
            let int = |t: &Tensor<Self, 1, burn::tensor::Int>| t.clone().into_primitive();
            launch::decode(
                q,
                kv,
                tables,
                int(&batch.row_seq),
                int(&batch.key_rows),
                shape,
            )
        } else {
            launch::prefill(q, kv, tables, batch.tiles.clone().into_primitive(), shape)
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

fn arenas<R, F, I, BT>(a: &TierArena<CubeBackend<R, F, I, BT>>) -> ArenaTensors<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    ArenaTensors {
        f32_rows: a.f32_rows.get().clone().into_primitive().tensor(),
        f16_rows: a.f16_rows.get().clone().into_primitive(),
        f16_scales: a.f16_scales.get().clone().into_primitive().tensor(),
        i8_rows: a.i8_rows.get().clone().into_primitive(),
        i8_scales: a.i8_scales.get().clone().into_primitive().tensor(),
    }
}
