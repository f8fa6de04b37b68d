//! Backend choice at run time. The model is generic over burn's `Backend`; this crate
//! turns a user's choice (`wgpu`, `cpu`, `cuda`) into a concrete backend and device,
//! probing first so a missing driver is one clear sentence, not a panic.

pub mod cuda_check;
pub mod kernel_cache;
mod kind;
mod probe;
mod run;
mod yield_to_device;

/// Sends products over many tokens through the tiled kernel on every device (`--tiled-products`).
pub use fornax_shaders::quant_launch::tile_many_tokens_everywhere;
pub use kind::BackendKind;
pub use probe::{probe_wgpu, AdapterSummary};
#[cfg(feature = "cuda")]
pub use run::CudaBackend;
pub use run::{
    run_on, set_cpu_threads, wgpu_device, BackendTask, CpuBackend, DeviceInfo, WgpuBackend,
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
    #[error(transparent)]
    Threads(#[from] fornax_cpu::ThreadsError),
}
