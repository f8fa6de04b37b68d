//! The float type a backend computes activations in (`--dtype`).

use std::fmt;
use std::str::FromStr;

use burn_tensor::backend::{get_device_settings, set_default_float_dtype, Backend};
use burn_tensor::FloatDType;

use crate::{BackendError, BackendKind};

/// The activations' float type. Products and sums are FP32 in every case, as are
/// attention scores, softmax, norms' statistics, the KV cache's FP32 tier and the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// FP16 on CUDA; FP32 elsewhere (the CPU backend; wgpu, where lavapipe measured no
    /// gain from FP16: `docs/benchmarks.md`).
    Auto,
    /// FP32.
    F32,
    /// FP16 (IEEE half): CUDA, and wgpu adapters with `shader-f16`.
    F16,
    /// BF16: CUDA (no wgpu adapter here has it).
    Bf16,
}

impl Dtype {
    /// Every choice, in the order they are listed to users.
    pub const ALL: [Dtype; 4] = [Self::Auto, Self::F32, Self::F16, Self::Bf16];

    /// The name typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// The concrete type on `kind` (a resolved backend).
    pub fn resolve(self, kind: BackendKind) -> Dtype {
        match (self, kind) {
            (Self::Auto, BackendKind::Cuda) => Self::F16,
            (Self::Auto, _) => Self::F32,
            (other, _) => other,
        }
    }

    fn float(self) -> FloatDType {
        match self {
            Self::F16 => FloatDType::F16,
            Self::Bf16 => FloatDType::BF16,
            Self::Auto | Self::F32 => FloatDType::F32,
        }
    }
}

/// Makes `dtype` (resolved) the float type of tensors created on `device`, before any is.
/// A device's float type is set once per process: asking another one later is an error.
pub(crate) fn set_on<B: Backend>(
    device: &B::Device,
    kind: BackendKind,
    dtype: Dtype,
) -> Result<(), BackendError> {
    let unsupported = || BackendError::Dtype { kind, dtype };
    if kind == BackendKind::Cpu && dtype != Dtype::F32 {
        return Err(unsupported());
    }
    let wanted = dtype.float();
    if wanted != FloatDType::F32 && !B::supports_dtype(device, wanted.into()) {
        return Err(unsupported());
    }
    // Setting fails once the device's settings exist (a first tensor, or an earlier task
    // in this process): then they must already say the same.
    if wanted != FloatDType::F32 && set_default_float_dtype::<B>(device, wanted).is_ok() {
        return Ok(());
    }
    let current = get_device_settings::<B>(device).float_dtype;
    if current == wanted {
        Ok(())
    } else {
        Err(BackendError::DtypeSet { dtype })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| BackendError::UnknownDtype(s.to_string()))
    }
}
