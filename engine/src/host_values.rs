//! The CPU backend's tensors as plain FP32 values, for the kernels of `fornax-cpu`.

use burn_ndarray::NdArrayTensor;
use burn_tensor::{Tensor, TensorPrimitive};

use crate::CpuBackend;

/// `x`'s values in row-major order, copied as one block of memory when `x` is shared
/// (burn's `into_data` walks a shared array element by element, which cost 13% of a
/// prefill), taken without a copy when `x` is its array's only owner.
pub(crate) fn host_f32<const D: usize>(x: Tensor<CpuBackend, D>) -> Vec<f32> {
    let primitive = x.into_primitive().tensor();
    if let NdArrayTensor::F32(storage) = &primitive {
        if !storage.is_unique() {
            if let Some(values) = storage.view().to_slice() {
                return values.to_vec();
            }
        }
    }
    Tensor::<CpuBackend, D>::from_primitive(TensorPrimitive::Float(primitive))
        .into_data()
        .into_vec()
        .expect("FP32 values")
}
