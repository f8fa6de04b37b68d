//! Kernels of Fornax, written once in CubeCL: burn compiles them to WGSL for wgpu (lavapipe
//! here, WebGPU in the browser) and to CUDA for burn-cuda.

mod alloc;
pub mod epilogue;
mod float;
pub mod launch;
pub mod layer_launch;
pub mod layer_ops;
pub mod paged_attention;
pub mod quant_launch;
pub mod quant_matmul;
pub mod sampling;
pub mod sampling_launch;
