//! The backends a user can choose.

use std::fmt;
use std::str::FromStr;

use crate::BackendError;

/// A compute backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// burn-wgpu on Vulkan (a GPU, or Mesa lavapipe on machines without one).
    Wgpu,
    /// burn-ndarray on the host CPU.
    Cpu,
    /// burn-cuda on an NVIDIA GPU (needs the `cuda` feature and the driver).
    Cuda,
}

impl BackendKind {
    /// Every backend, in the order they are listed to users.
    pub const ALL: [BackendKind; 3] = [Self::Wgpu, Self::Cpu, Self::Cuda];

    /// The backend's name as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Wgpu => "wgpu",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
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
