//! The backends a user can choose.

use std::fmt;
use std::str::FromStr;

use crate::BackendError;

/// A compute backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The fastest available: CUDA when built in and a driver is present, else wgpu on a
    /// real GPU adapter, else the CPU backend (faster than a software Vulkan adapter).
    Auto,
    /// burn-wgpu on Vulkan (a GPU, or Mesa lavapipe on machines without one).
    Wgpu,
    /// burn-ndarray on the host CPU.
    Cpu,
    /// burn-cuda on an NVIDIA GPU (needs the `cuda` feature and the driver).
    Cuda,
}

impl BackendKind {
    /// Every backend, in the order they are listed to users.
    pub const ALL: [BackendKind; 4] = [Self::Auto, Self::Wgpu, Self::Cpu, Self::Cuda];

    /// The backend's name as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Wgpu => "wgpu",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

impl BackendKind {
    /// Resolves `Auto` to a concrete backend by probing; other kinds are returned as is.
    pub fn resolve(self) -> BackendKind {
        if self != Self::Auto {
            return self;
        }
        #[cfg(feature = "cuda")]
        if crate::probe::cuda_driver_present() {
            return Self::Cuda;
        }
        match crate::probe_wgpu() {
            Ok(a) if a.device_type != wgpu::DeviceType::Cpu => Self::Wgpu,
            _ => Self::Cpu,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| BackendError::Unknown(s.to_string()))
    }
}
