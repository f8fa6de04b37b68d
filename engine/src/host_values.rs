//! The CPU backend's tensors as plain FP32 values, for the kernels of `fornax-cpu`.

use burn_ndarray::{NdArray, NdArrayTensor, SharedArray};
use burn_tensor::{Tensor, TensorPrimitive};

/// `x`'s values in row-major order, copied as one block of memory when `x` is shared
/// (burn's `into_data` walks a shared array element by element, which cost 13% of a
/// prefill), taken without a copy when `x` is its array's only owner. Panics when the
/// backend is not FP32: callers check first.
pub(crate) fn host_f32<E, I, Q, const D: usize>(x: Tensor<NdArray<E, I, Q>, D>) -> Vec<f32>
where
    E: burn_ndarray::FloatNdArrayElement,
    I: burn_ndarray::IntNdArrayElement,
    Q: burn_ndarray::QuantElement,
    NdArrayTensor: From<SharedArray<E>> + From<SharedArray<I>>,
{
    let primitive = x.into_primitive().tensor();
    if let NdArrayTensor::F32(storage) = &primitive {
        if !storage.is_unique() {
            if let Some(values) = storage.view().to_slice() {
                return values.to_vec();
            }
        }
    }
    Tensor::<NdArray<E, I, Q>, D>::from_primitive(TensorPrimitive::Float(primitive))
        .into_data()
        .into_vec()
        .expect("FP32 values")
}
