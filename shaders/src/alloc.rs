//! The device tensors the launchers allocate: outputs and placeholders.

use burn_backend::{DType, Shape};
use burn_cubecl::{ops::numeric::empty_device_dtype, tensor::CubeTensor, CubeRuntime};

/// An uninitialised tensor of `shape` and `dtype` on `like`'s device.
pub(crate) fn empty_on<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> CubeTensor<R> {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        dtype,
    )
}

/// An uninitialised tensor of `q`'s shape and dtype on its device.
pub(crate) fn output_like<R: CubeRuntime>(q: &CubeTensor<R>) -> CubeTensor<R> {
    empty_on(q, q.meta.shape().clone(), q.dtype)
}

/// A one-element FP32 placeholder on `like`'s device for an array a kernel variant does
/// not read.
pub(crate) fn placeholder<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty_on(like, [1], DType::F32)
}
