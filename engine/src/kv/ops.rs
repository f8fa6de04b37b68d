//! Paged attention as a backend operation: our CubeCL kernels on burn's CubeCL backends
//! (wgpu, CUDA), the blocks read in place on the CPU backend (`fornax_cpu::attention`),
//! the burn reference path elsewhere.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_ndarray::NdArrayTensor;
use burn_tensor::{backend::Backend, ops::FloatElem, Tensor, TensorPrimitive};
use fornax_shaders::launch::{self, ArenaTensors, KvArenas};
use fornax_shaders::paged_attention::HEAD_DIM_MULTIPLE;

use fornax_cpu::attention::{AttentionDims, SeqRows, TierRows, Words};

use super::{reference, AttentionShape, LayerKv, PagedBatch, TierArena};
use crate::CpuBackend;

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

    /// Attention of `q` `[tokens, n_heads * head_dim]` (RoPE applied, the first token at
    /// position `start`) over one sequence's contiguous keys and values
    /// `[n_kv_heads, start + tokens, head_dim]`, each query seeing at most `window` keys
    /// where given: `[tokens, n_heads * head_dim]`.
    fn contiguous_attention(
        q: Tensor<Self, 2>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        start: usize,
        n_heads: usize,
        window: Option<usize>,
    ) -> Tensor<Self, 2> {
        reference_contiguous(q, k, v, start, n_heads, window)
    }
}

/// Contiguous attention as burn operations: `q` split into heads, then [`attend`].
///
/// [`attend`]: crate::model::attend
fn reference_contiguous<B: Backend>(
    q: Tensor<B, 2>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    start: usize,
    n_heads: usize,
    window: Option<usize>,
) -> Tensor<B, 2> {
    let [tokens, width] = q.dims();
    let q = q
        .reshape([tokens, n_heads, width / n_heads])
        .swap_dims(0, 1);
    crate::model::attend(q, k, v, start, window)
}

// The CPU attention reads the engine's block layout.
const _: () = assert!(fornax_cpu::attention::TIER_SHIFT == super::TIER_SHIFT);
const _: () = assert!(fornax_cpu::attention::BLOCK_TOKENS == super::BLOCK_TOKENS);

/// One tier arena's storage, held (an `Arc` clone, no copy) while its slices are read.
struct Held {
    f32_rows: NdArrayTensor,
    f16_rows: NdArrayTensor,
    f16_scales: NdArrayTensor,
    i8_rows: NdArrayTensor,
    i8_scales: NdArrayTensor,
}

impl Held {
    fn new(a: &TierArena<CpuBackend>) -> Self {
        let float = |t: &Tensor<CpuBackend, 2>| t.clone().into_primitive().tensor();
        let int = |t: &Tensor<CpuBackend, 2, burn_tensor::Int>| t.clone().into_primitive();
        Self {
            f32_rows: float(a.f32_rows.get()),
            f16_rows: int(a.f16_rows.get()),
            f16_scales: float(a.f16_scales.get()),
            i8_rows: int(a.i8_rows.get()),
            i8_scales: float(a.i8_scales.get()),
        }
    }

    /// The arenas as slices; `None` if one is not FP32 / 32- or 64-bit integers in
    /// standard layout.
    fn rows(&self) -> Option<TierRows<'_>> {
        fn floats(t: &NdArrayTensor) -> Option<&[f32]> {
            match t {
                NdArrayTensor::F32(s) => s.view().to_slice(),
                _ => None,
            }
        }
        fn words(t: &NdArrayTensor) -> Option<Words<'_>> {
            match t {
                NdArrayTensor::I32(s) => s.view().to_slice().map(Words::I32),
                NdArrayTensor::I64(s) => s.view().to_slice().map(Words::I64),
                _ => None,
            }
        }
        Some(TierRows {
            f32_rows: floats(&self.f32_rows)?,
            f16_rows: words(&self.f16_rows)?,
            f16_scales: floats(&self.f16_scales)?,
            i8_rows: words(&self.i8_rows)?,
            i8_scales: floats(&self.i8_scales)?,
        })
    }
}

impl PagedAttentionOps for CpuBackend {
    /// The blocks read where they lie (no gather), threads over (sequence, KV head); the
    /// burn reference path when `batch.kernels` is off.
    fn paged_attention(
        q: Tensor<Self, 2>,
        kv: &LayerKv<Self>,
        batch: &PagedBatch<Self>,
        shape: AttentionShape,
    ) -> Tensor<Self, 2> {
        if !batch.kernels {
            return reference::paged_attention(q, kv, batch, shape);
        }
        let (keys, values) = (Held::new(&kv.keys), Held::new(&kv.values));
        let (Some(k), Some(v)) = (keys.rows(), values.rows()) else {
            return reference::paged_attention(q, kv, batch, shape);
        };
        let device = q.device();
        let dims = q.dims();
        let q = crate::host_values::host_f32(q);
        let seqs: Vec<SeqRows> = batch
            .seqs
            .iter()
            .map(|s| SeqRows {
                row_start: s.row_start,
                rows: s.rows,
                start: s.start,
                table: &s.table,
            })
            .collect();
        let attention = AttentionDims {
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            window: shape.window,
        };
        let out = fornax_cpu::attention::paged_attention(&q, &k, &v, &seqs, attention);
        Tensor::from_data(burn_tensor::TensorData::new(out, dims), &device)
    }

    /// The same arithmetic as the paged attention above, so that the contiguous cache
    /// (`generate`, scoring) and the paged one (the engine) give identical tokens.
    fn contiguous_attention(
        q: Tensor<Self, 2>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        start: usize,
        n_heads: usize,
        window: Option<usize>,
    ) -> Tensor<Self, 2> {
        let device = q.device();
        let [tokens, width] = q.dims();
        let [n_kv_heads, _, head_dim] = k.dims();
        let host = |t: Tensor<Self, 3>| crate::host_values::host_f32(t);
        let dims = AttentionDims {
            n_heads,
            n_kv_heads,
            head_dim,
            window,
        };
        let q = crate::host_values::host_f32(q);
        let out = fornax_cpu::attention::contiguous_attention(&q, &host(k), &host(v), start, dims);
        Tensor::from_data(burn_tensor::TensorData::new(out, [tokens, width]), &device)
    }
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
        // The kernels are written for the FP32 backend types (queries of any float dtype),
        // 32-bit table words and head dimensions that are a multiple of their loop step.
        if !batch.kernels
            || FloatElem::<Self>::dtype() != burn_tensor::DType::F32
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
            let int = |t: &Tensor<Self, 1, burn_tensor::Int>| t.clone().into_primitive();
            launch::decode(
                q,
                kv,
                tables,
                int(&batch.row_seq),
                int(&batch.key_rows),
                shape,
                batch.decode_kernel,
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
