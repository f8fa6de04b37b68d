//! Products with quantized weights as a backend operation: our CubeCL kernels on burn's
//! CubeCL backends (wgpu, CUDA), our SIMD kernels on the CPU backend (burn-ndarray),
//! dequantize-then-matmul elsewhere.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_ndarray::NdArrayTensor;
use burn_tensor::TensorPrimitive;
use burn_tensor::{backend::Backend, ops::FloatElem, DType, Int, Tensor, TensorData};
use fornax_shaders::quant_launch::{self, QuantTensors};

use super::QuantMatrix;
use crate::gguf::GgmlType;

/// Backends that can multiply by block-quantized weights.
pub trait QuantOps: Backend {
    /// Whether this backend has kernels for quantized weights, so that keeping weights
    /// quantized pays off; when false the model dequantizes them at load.
    fn has_quant_kernels() -> bool {
        false
    }

    /// Whether quantized words stay in host memory (CPU kernels) rather than on the device.
    fn quant_on_host() -> bool {
        false
    }

    /// Whether this backend's kernels read weights of type `ty` (else they are
    /// dequantized at load).
    fn has_kernels_for(ty: GgmlType) -> bool {
        Self::has_quant_kernels() && super::format_code(ty).is_some()
    }

    /// The largest buffer `device` holds in one piece (`None`: no limit that matters);
    /// larger weights are loaded as bands of rows.
    fn max_buffer_bytes(_device: &Self::Device) -> Option<usize> {
        None
    }

    /// `x @ W^T` for `x` `[tokens, w.cols]`: `[tokens, w.rows]`.
    fn quant_matmul(x: Tensor<Self, 2>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        reference_matmul(x, w)
    }

    /// `x @ W_i^T` for several weights over the same `x` (Q, K and V; gate and up): one
    /// product each here, one pass sharing the input where the backend can.
    fn quant_matmul_many(x: Tensor<Self, 2>, ws: &[&QuantMatrix<Self>]) -> Vec<Tensor<Self, 2>> {
        ws.iter()
            .map(|w| Self::quant_matmul(x.clone(), w))
            .collect()
    }

    /// Rows `ids` of `W`: `[ids, w.cols]`.
    fn quant_rows(ids: Tensor<Self, 1, Int>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        reference_rows(ids, w)
    }

    /// `x @ W` for a dense weight `W` `[in, out]`: burn's matmul here, in the weight's float
    /// type (the activations'), `x` converted to it where it differs.
    fn dense_matmul(x: Tensor<Self, 2>, w: &Tensor<Self, 2>) -> Tensor<Self, 2> {
        x.cast(w.dtype()).matmul(w.clone())
    }
}

/// The reference product: `x @ W^T` over `W` dequantized (see [`dequantized`]).
pub fn reference_matmul<B: Backend>(x: Tensor<B, 2>, w: &QuantMatrix<B>) -> Tensor<B, 2> {
    x.matmul(dequantized(w).transpose())
}

/// The reference row gather over `W` dequantized.
pub fn reference_rows<B: Backend>(ids: Tensor<B, 1, Int>, w: &QuantMatrix<B>) -> Tensor<B, 2> {
    dequantized(w).select(0, ids)
}

/// The reference: `W` read back, dequantized on the host and uploaded as FP32.
pub fn dequantized<B: Backend>(w: &QuantMatrix<B>) -> Tensor<B, 2> {
    let values = w.download().dequantize();
    Tensor::from_data(TensorData::new(values, [w.rows, w.cols]), &w.device())
}

/// Rows dequantized per step of [`by_dequantized_rows`]: 18.9 MB of FP32 at 576 columns.
const ROWS_PER_CHUNK: usize = 8192;

/// `x @ W^T` as FP32 matmuls over chunks of rows dequantized on the device (by
/// [`QuantOps::quant_rows`], FP32); the chunks are transient, so at most [`ROWS_PER_CHUNK`]
/// rows exist in FP32 at a time.
pub(crate) fn by_dequantized_rows<B: QuantOps>(
    x: Tensor<B, 2>,
    w: &QuantMatrix<B>,
) -> Tensor<B, 2> {
    let device = x.device();
    // In FP32 whatever the activations' type: the results feed norms and the residual.
    let x = x.cast(DType::F32);
    let parts: Vec<_> = (0..w.rows)
        .step_by(ROWS_PER_CHUNK)
        .map(|start| {
            let end = (start + ROWS_PER_CHUNK).min(w.rows);
            let ids = Tensor::<B, 1, Int>::arange(start as i64..end as i64, &device);
            x.clone().matmul(B::quant_rows(ids, w).transpose())
        })
        .collect();
    Tensor::cat(parts, 1)
}

/// On the CPU backend, `fornax_cpu`'s SIMD kernels over words kept in host memory.
impl QuantOps for crate::CpuBackend {
    fn has_quant_kernels() -> bool {
        true
    }

    fn quant_on_host() -> bool {
        true
    }

    /// The CubeCL kernels' types and Q5_0.
    fn has_kernels_for(ty: GgmlType) -> bool {
        super::packable(ty)
    }

    fn quant_matmul(x: Tensor<Self, 2>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        Self::quant_matmul_many(x, &[w]).pop().expect("one product")
    }

    fn quant_matmul_many(x: Tensor<Self, 2>, ws: &[&QuantMatrix<Self>]) -> Vec<Tensor<Self, 2>> {
        let host: Option<Vec<&fornax_cpu::InterleavedWeights>> =
            ws.iter().map(|w| w.host()).collect();
        let Some(host) = host else {
            return ws.iter().map(|w| reference_matmul(x.clone(), w)).collect();
        };
        let device = x.device();
        let [tokens, cols] = x.dims();
        let x = crate::host_values::host_f32(x);
        let acts = fornax_cpu::Q8Activations::quantize(&x, tokens, cols);
        fornax_cpu::matmul_many(&host, &acts, fornax_cpu::SimdLevel::best())
            .into_iter()
            .zip(ws)
            .map(|(out, w)| Tensor::from_data(TensorData::new(out, [tokens, w.rows]), &device))
            .collect()
    }

    /// `fornax_cpu::dense`, which reads the weight where it lies: burn-ndarray's matmul
    /// copies a shared weight whole to reshape it, then packs it, on one thread: three
    /// passes over the weight for a decode step's one row (`perf`: 55% of FP32 decoding).
    fn dense_matmul(x: Tensor<Self, 2>, w: &Tensor<Self, 2>) -> Tensor<Self, 2> {
        let [tokens, inp] = x.dims();
        let [_, out] = w.dims();
        let weight = w.clone().into_primitive().tensor();
        let view = match &weight {
            NdArrayTensor::F32(storage) => Some(storage.view()),
            _ => None,
        };
        let Some(values) = view.as_ref().and_then(|v| v.to_slice()) else {
            return x.matmul(w.clone());
        };
        let device = x.device();
        let x = crate::host_values::host_f32(x);
        let y = fornax_cpu::dense::matmul_f32(&x, tokens, values, inp, out);
        Tensor::from_data(TensorData::new(y, [tokens, out]), &device)
    }

    fn quant_rows(ids: Tensor<Self, 1, Int>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        let Some(host) = w.host() else {
            return reference_rows(ids, w);
        };
        let device = ids.device();
        let ids: Vec<usize> = ids
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .map(|i| i as usize)
            .collect();
        let out = host.gather_rows(&ids);
        Tensor::from_data(TensorData::new(out, [ids.len(), w.cols]), &device)
    }
}

pub(crate) fn quant_tensors<R, F, I, BT>(
    w: &QuantMatrix<CubeBackend<R, F, I, BT>>,
) -> QuantTensors<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (quants, scales) = w
        .device_words()
        .expect("CubeCL backends keep quantized words on the device");
    QuantTensors {
        quants: quants.clone().into_primitive(),
        scales: scales.clone().into_primitive(),
        format: super::packed::format_code(w.ggml_type).expect("quantized type"),
        rows: w.rows,
        cols: w.cols,
    }
}

impl<R, F, I, BT> QuantOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn has_quant_kernels() -> bool {
        // The launch glue is written for the FP32 backend types (activations of any float
        // dtype) and 32-bit words.
        FloatElem::<Self>::dtype() == DType::F32 && I::dtype().size() == 4
    }

    /// The storage binding limit (cubecl's largest memory page): 128 MiB on lavapipe and
    /// by default in browsers.
    fn max_buffer_bytes(device: &Self::Device) -> Option<usize> {
        let page = R::client(device).properties().memory.max_page_size;
        Some(usize::try_from(page).unwrap_or(usize::MAX))
    }

    fn quant_matmul(x: Tensor<Self, 2>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        if !Self::has_quant_kernels() {
            return reference_matmul(x, w);
        }
        let x = x.into_primitive().tensor();
        if quant_launch::dequantize_for_many(&x.client, x.meta.shape()[0]) {
            return by_dequantized_rows(Tensor::from_primitive(TensorPrimitive::Float(x)), w);
        }
        let out = quant_launch::matmul(x, &quant_tensors(w), None);
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn quant_rows(ids: Tensor<Self, 1, Int>, w: &QuantMatrix<Self>) -> Tensor<Self, 2> {
        if !Self::has_quant_kernels() {
            return reference_rows(ids, w);
        }
        // FP32: rows start the residual stream (the embedding) or feed FP32 matmuls.
        let like: Tensor<Self, 1> = Tensor::empty([1], (&ids.device(), DType::F32));
        let out = quant_launch::rows(
            ids.into_primitive(),
            &quant_tensors(w),
            &like.into_primitive().tensor(),
        );
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}
