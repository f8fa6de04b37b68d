//! Backend choice at run time. The model is generic over burn's `Backend`; this crate
//! turns a user's choice (`wgpu`, `cpu`, `cuda`) into a concrete backend and device,
//! probing first so a missing driver is one clear sentence, not a panic.

pub mod cuda_check;
mod dtype;
pub mod kernel_cache;
mod kind;
mod probe;
mod run;
mod yield_to_device;

pub use dtype::Dtype;
/// Sends products over many tokens through the tiled kernel on every device (`--tiled-products`).
pub use fornax_shaders::quant_launch::tile_many_tokens_everywhere;
pub use kind::BackendKind;
pub use probe::{probe_wgpu, AdapterSummary};
#[cfg(feature = "cuda")]
pub use run::CudaBackend;
pub use run::{
    run_on, run_on_with, set_cpu_threads, wgpu_device, BackendTask, CpuBackend, DeviceInfo,
    WgpuBackend,
};

/// Why a backend cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("no Vulkan adapter found: install a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers libvulkan1), or use --backend cpu")]
    NoWgpuAdapter,
    #[error("this build has no CUDA support: rebuild with `--features cuda`")]
    CudaNotBuilt,
    #[error("the CUDA driver library (libcuda) was not found on this machine; use --backend wgpu or cpu")]
    NoCudaDriver,
    #[error("unknown backend {0:?} (choose auto, wgpu, cpu or cuda)")]
    Unknown(String),
    #[error("unknown dtype {0:?} (choose auto, f32, f16 or bf16)")]
    UnknownDtype(String),
    #[error("the {kind} backend cannot compute in {dtype} here (the CPU backend computes in FP32; wgpu needs an adapter with shader-f16 for f16 and has no bf16); use --dtype f32")]
    Dtype { kind: BackendKind, dtype: Dtype },
    #[error("this process already computes in another float type on this device; it can be chosen once per process ({dtype} asked)")]
    DtypeSet { dtype: Dtype },
    #[error(transparent)]
    Threads(#[from] fornax_cpu::ThreadsError),
}
