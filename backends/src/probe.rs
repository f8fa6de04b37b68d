//! Probing for devices before burn initialises them (burn panics when none exists).

use crate::BackendError;

/// What a wgpu adapter reports about itself.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// Adapter name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Driver type: discrete, integrated, virtual or CPU.
    pub device_type: wgpu::DeviceType,
    /// Driver name and version.
    pub driver: String,
    /// Largest storage-buffer binding, in bytes.
    pub max_storage_binding: u64,
}

/// Finds the best Vulkan adapter: a discrete GPU, then integrated, virtual, then CPU.
pub fn probe_wgpu() -> Result<AdapterSummary, BackendError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    adapters
        .iter()
        .map(|a| (a.get_info(), a.limits()))
        .min_by_key(|(info, _)| rank(info.device_type))
        .map(|(info, limits)| AdapterSummary {
            name: info.name,
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            max_storage_binding: limits.max_storage_buffer_binding_size,
        })
        .ok_or(BackendError::NoWgpuAdapter)
}

/// Whether the CUDA driver library can be loaded.
#[cfg(feature = "cuda")]
pub fn cuda_driver_present() -> bool {
    // SAFETY: only tries to load the driver library and looks its symbols up.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
