//! What the engine needs from a burn backend beyond burn's own operations.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_ndarray::{NdArray, NdArrayTensor, SharedArray};
use burn_tensor::backend::Backend;

use crate::kv::PagedAttentionOps;
use crate::model::{FusedOps, LayerOps};
use crate::quant::QuantOps;
use crate::sampling::SamplingOps;

/// Device memory held by the backend's allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Live allocations (slices handed out).
    pub allocations: u64,
    /// Bytes in live allocations.
    pub bytes_in_use: u64,
    /// Bytes the allocator holds from the device.
    pub bytes_reserved: u64,
}

/// Backends that can report their device memory.
pub trait DeviceMemoryInfo: Backend {
    /// Current figures, `None` where the backend cannot tell (host memory).
    fn device_memory(_device: &Self::Device) -> Option<DeviceMemory> {
        None
    }
}

impl<E, I, Q> DeviceMemoryInfo for NdArray<E, I, Q>
where
    E: burn_ndarray::FloatNdArrayElement,
    I: burn_ndarray::IntNdArrayElement,
    Q: burn_ndarray::QuantElement,
    NdArrayTensor: From<SharedArray<E>> + From<SharedArray<I>>,
{
}

impl<R, F, I, BT> DeviceMemoryInfo for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn device_memory(device: &Self::Device) -> Option<DeviceMemory> {
        let usage = R::client(device).memory_usage().ok()?;
        Some(DeviceMemory {
            allocations: usage.number_allocs,
            bytes_in_use: usage.bytes_in_use,
            bytes_reserved: usage.bytes_reserved,
        })
    }
}

/// A backend the whole engine runs on: burn's operations plus our kernels (or their
/// burn reference fallbacks).
pub trait EngineBackend:
    PagedAttentionOps + QuantOps + LayerOps + FusedOps + SamplingOps + DeviceMemoryInfo
{
}

impl<B> EngineBackend for B where
    B: PagedAttentionOps + QuantOps + LayerOps + FusedOps + SamplingOps + DeviceMemoryInfo
{
}
