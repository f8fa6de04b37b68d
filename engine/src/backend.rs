//! What the engine needs from a burn backend beyond burn's own operations.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_tensor::backend::{get_device_settings, Backend};
use burn_tensor::DType;

use crate::kv::PagedAttentionOps;
use crate::model::{FusedOps, LayerOps};
use crate::quant::QuantOps;
use crate::sampling::SamplingOps;

/// The CPU backend: burn-ndarray in FP32 with 32-bit integers, the one instantiation the
/// CPU kernels (`fornax-cpu`) serve. 32-bit integers because the KV pool's FP16 and INT8
/// tiers store 32-bit words, which burn's default 64-bit integers would take twice the
/// bytes for (the pool took 1.5 times its `--kv-memory`).
pub type CpuBackend = burn_ndarray::NdArray<f32, i32>;

/// The activations' float type on `device`: what new float tensors are made as (FP32
/// unless the device was given another, `--dtype`). The residual stream, weights' scales,
/// norms' weights, RoPE's table, the KV cache and the logits stay FP32 whatever it is.
pub fn activation_dtype<B: Backend>(device: &B::Device) -> DType {
    get_device_settings::<B>(device).float_dtype.into()
}

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

impl DeviceMemoryInfo for CpuBackend {}

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
