//! The WebGPU device burn runs on, and what the page is told about its adapter.

use std::cell::RefCell;

use burn_wgpu::{graphics::WebGpu, init_setup_async, RuntimeOptions, WgpuDevice};

/// burn's wgpu backend in FP32 with 32-bit integers: what our kernels read.
pub type WebBackend = burn_wgpu::Wgpu<f32, i32>;

/// The adapter WebGPU gave us and the limits burn requested from it (all it allows).
#[derive(Debug, Clone)]
pub struct Adapter {
    /// What the browser tells of the adapter (often little: names are hidden), its type
    /// and subgroup sizes.
    pub name: String,
    /// Largest storage buffer one kernel can bind, in bytes.
    pub max_binding: u64,
    /// Storage buffers one kernel can bind.
    pub max_buffers: u32,
    /// Whether the adapter has `shader-f16` (the engine does not need it).
    pub shader_f16: bool,
}

impl Adapter {
    /// One line for the page.
    pub fn describe(&self) -> String {
        format!(
            "{}, storage bindings up to {} MiB and {} per kernel, shader-f16 {}",
            self.name,
            self.max_binding >> 20,
            self.max_buffers,
            if self.shader_f16 { "yes" } else { "no" }
        )
    }
}

thread_local! {
    static DEVICE: RefCell<Option<(WgpuDevice, Adapter)>> = const { RefCell::new(None) };
}

/// The WebGPU device, set up on first use (a device can be set up only once).
pub async fn device() -> (WgpuDevice, Adapter) {
    if let Some(ready) = DEVICE.with_borrow(Clone::clone) {
        return ready;
    }
    let device = WgpuDevice::default();
    let setup = init_setup_async::<WebGpu>(&device, RuntimeOptions::default()).await;
    let info = setup.adapter.get_info();
    let limits = setup.device.limits();
    let known: Vec<&str> = [&info.name, &info.driver, &info.driver_info]
        .into_iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let adapter = Adapter {
        name: format!(
            "{} ({:?}, {:?}; subgroups {}{}-{})",
            match known.is_empty() {
                true => "unnamed adapter".to_string(),
                false => known.join(", "),
            },
            info.device_type,
            info.backend,
            match setup.device.features().contains(wgpu::Features::SUBGROUP) {
                true => "",
                false => "not supported, reported ",
            },
            info.subgroup_min_size,
            info.subgroup_max_size,
        ),
        max_binding: limits.max_storage_buffer_binding_size,
        max_buffers: limits.max_storage_buffers_per_shader_stage,
        shader_f16: setup.device.features().contains(wgpu::Features::SHADER_F16),
    };
    DEVICE.with_borrow_mut(|d| *d = Some((device.clone(), adapter.clone())));
    (device, adapter)
}

/// Sets up the WebGPU device and describes its adapter (see [`Adapter::describe`]).
///
/// `fallback`: whether the browser calls its adapter a fallback one (`isFallbackAdapter`,
/// a software implementation such as SwiftShader). The kernels then take the shapes
/// measured on CPU-like devices, which WebGPU's missing plane sizes would otherwise hide.
#[wasm_bindgen::prelude::wasm_bindgen(js_name = webgpuAdapter)]
pub async fn webgpu_adapter(fallback: bool) -> String {
    if fallback {
        fornax_shaders::quant_launch::declare_software_adapter();
    }
    let line = device().await.1.describe();
    match fallback {
        true => format!("{line}, fallback adapter (CPU kernel shapes)"),
        false => line,
    }
}
