//! Runs backend-generic work on the backend a user chose.

use burn_wgpu::{graphics::Vulkan, init_setup, RuntimeOptions, WgpuDevice};
use fornax_engine::EngineBackend;

use crate::{probe_wgpu, BackendError, BackendKind};

/// The wgpu backend in f32.
pub type WgpuBackend = burn_wgpu::Wgpu<f32, i32>;
pub use fornax_engine::CpuBackend;
/// The CUDA backend in f32.
#[cfg(feature = "cuda")]
pub type CudaBackend = burn_cuda::Cuda<f32, i32>;

/// What a task is told about the device it runs on.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The backend in use.
    pub kind: BackendKind,
    /// Human-readable device or adapter name.
    pub adapter: String,
}

/// Work that is generic over the backend; [`run_on`] picks the concrete one.
pub trait BackendTask {
    /// What the task returns.
    type Output;
    /// Runs the task on backend `B`.
    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Self::Output;
}

/// The wgpu device (initialised once per process) and a description of its adapter.
pub fn wgpu_device() -> Result<(WgpuDevice, String), BackendError> {
    static DEVICE: std::sync::OnceLock<Result<(WgpuDevice, String), String>> =
        std::sync::OnceLock::new();
    // A wgpu device can be initialised only once per process.
    let init = DEVICE.get_or_init(|| {
        let adapter = probe_wgpu().map_err(|e| e.to_string())?;
        let device = match adapter.device_type {
            wgpu::DeviceType::DiscreteGpu => WgpuDevice::DiscreteGpu(0),
            wgpu::DeviceType::IntegratedGpu => WgpuDevice::IntegratedGpu(0),
            wgpu::DeviceType::VirtualGpu => WgpuDevice::VirtualGpu(0),
            _ => WgpuDevice::Cpu,
        };
        let setup = init_setup::<Vulkan>(&device, RuntimeOptions::default());
        declare_fixed_width_subgroups(&setup.device, &setup.adapter);
        let name = format!(
            "{} ({:?}, Vulkan)",
            setup.adapter.get_info().name,
            adapter.device_type
        );
        Ok((device, name))
    });
    init.clone().map_err(|_| BackendError::NoWgpuAdapter)
}

/// Tells the product kernels when the device runs subgroup operations on subgroups of one
/// fixed width, which cubecl does not report for CPU adapters (lavapipe: 8 lanes).
fn declare_fixed_width_subgroups(device: &wgpu::Device, adapter: &wgpu::Adapter) {
    let info = adapter.get_info();
    if device.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size > 0
        && info.subgroup_min_size == info.subgroup_max_size
    {
        fornax_shaders::quant_launch::declare_planes(info.subgroup_min_size as usize);
    }
}

/// Sizes the CPU backend's thread pool (default: the available parallelism). Call before
/// any model work.
pub fn set_cpu_threads(n: usize) -> Result<(), BackendError> {
    Ok(fornax_cpu::set_threads(n)?)
}

/// Runs `task` on the chosen backend, or says why that backend cannot be used.
pub fn run_on<T: BackendTask>(kind: BackendKind, task: T) -> Result<T::Output, BackendError> {
    let kind = kind.resolve();
    match kind {
        BackendKind::Auto => unreachable!("resolved above"),
        BackendKind::Wgpu => {
            let (device, adapter) = wgpu_device()?;
            if device == WgpuDevice::Cpu {
                crate::yield_to_device::lower_this_thread();
            }
            Ok(task.run::<WgpuBackend>(device, DeviceInfo { kind, adapter }))
        }
        BackendKind::Cpu => {
            let adapter = format!(
                "host CPU ({}, {} threads)",
                fornax_cpu::SimdLevel::best().name(),
                fornax_cpu::threads()
            );
            Ok(task.run::<CpuBackend>(Default::default(), DeviceInfo { kind, adapter }))
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            if !crate::probe::cuda_driver_present() {
                return Err(BackendError::NoCudaDriver);
            }
            let device = burn_cuda::CudaDevice::new(0);
            let adapter = "CUDA device 0".to_string();
            Ok(task.run::<CudaBackend>(device, DeviceInfo { kind, adapter }))
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => Err(BackendError::CudaNotBuilt),
    }
}
