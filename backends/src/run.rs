//! Runs backend-generic work on the backend a user chose.

use burn_wgpu::{graphics::Vulkan, init_setup, RuntimeOptions, WgpuDevice};
use fornax_engine::EngineBackend;

use crate::{dtype, probe_wgpu, BackendError, BackendKind, Dtype};

/// The wgpu backend (FP32 unless its device is given another float type: [`run_on_with`]).
pub type WgpuBackend = burn_wgpu::Wgpu<f32, i32>;
pub use fornax_engine::CpuBackend;
/// The CUDA backend (FP32 unless its device is given another float type).
#[cfg(feature = "cuda")]
pub type CudaBackend = burn_cuda::Cuda<f32, i32>;

/// What a task is told about the device it runs on.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The backend in use.
    pub kind: BackendKind,
    /// Human-readable device or adapter name.
    pub adapter: String,
    /// The activations' float type ([`Dtype::resolve`]d).
    pub dtype: Dtype,
}

impl DeviceInfo {
    fn new(kind: BackendKind, adapter: String, dtype: Dtype) -> Self {
        Self {
            kind,
            adapter,
            dtype,
        }
    }
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

/// Runs `task` on the chosen backend in FP32, or says why that backend cannot be used.
pub fn run_on<T: BackendTask>(kind: BackendKind, task: T) -> Result<T::Output, BackendError> {
    run_on_with(kind, Dtype::F32, task)
}

/// Runs `task` on the chosen backend computing in `dtype`, or says why that backend
/// cannot be used so.
pub fn run_on_with<T: BackendTask>(
    kind: BackendKind,
    dtype: Dtype,
    task: T,
) -> Result<T::Output, BackendError> {
    let kind = kind.resolve();
    let dtype = dtype.resolve(kind);
    match kind {
        BackendKind::Auto => unreachable!("resolved above"),
        BackendKind::Wgpu => {
            let (device, adapter) = wgpu_device()?;
            if device == WgpuDevice::Cpu {
                crate::yield_to_device::lower_this_thread();
            }
            start::<WgpuBackend, T>(task, device, DeviceInfo::new(kind, adapter, dtype))
        }
        BackendKind::Cpu => {
            let adapter = format!(
                "host CPU ({}, {} threads)",
                fornax_cpu::SimdLevel::best().name(),
                fornax_cpu::threads()
            );
            let info = DeviceInfo::new(kind, adapter, dtype);
            start::<CpuBackend, T>(task, Default::default(), info)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            if !crate::probe::cuda_driver_present() {
                return Err(BackendError::NoCudaDriver);
            }
            let device = burn_cuda::CudaDevice::new(0);
            let adapter = "CUDA device 0".to_string();
            start::<CudaBackend, T>(task, device, DeviceInfo::new(kind, adapter, dtype))
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => Err(BackendError::CudaNotBuilt),
    }
}

/// Gives `device` the float type `info.dtype` and runs `task` there.
fn start<B: EngineBackend, T: BackendTask>(
    task: T,
    device: B::Device,
    info: DeviceInfo,
) -> Result<T::Output, BackendError> {
    dtype::set_on::<B>(&device, info.kind, info.dtype)?;
    Ok(task.run::<B>(device, info))
}
