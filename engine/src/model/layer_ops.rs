//! The element-wise parts of a layer as a backend operation: RMSNorm, SwiGLU's gate and
//! RoPE. burn's operations by default (RMSNorm alone is six of them); done in place in one
//! pass on the CPU backend (`fornax_cpu::layer_ops`); RMSNorm and SwiGLU's gate one kernel
//! each on CubeCL backends (`fornax_shaders::layer_ops`).

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_tensor::{activation::silu, backend::Backend, ops::FloatElem, DType, Int, Tensor};
use burn_tensor::{Element, Shape, TensorData, TensorPrimitive};
use fornax_cpu::layer_ops;
use fornax_shaders::layer_launch;

use super::{Rope, RopeStyle};
use crate::host_values::host_f32;
use crate::CpuBackend;

/// Backends with their own RMSNorm, SwiGLU gate and RoPE.
pub trait LayerOps: Backend {
    /// `x / sqrt(mean(x^2) + eps) * weight` over each row of `x` `[tokens, d]`.
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        reference_rms_norm(x, weight, eps)
    }

    /// `silu(gate) * up`.
    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        silu(gate).mul(up)
    }

    /// `gelu(gate) * up`, GELU in its tanh approximation.
    fn geglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        reference_geglu(gate, up)
    }

    /// RoPE over `x` `[rows, heads * head_dim]` whose row `r` is at `positions[r]`.
    fn rope_rows(
        x: Tensor<Self, 2>,
        heads: usize,
        positions: Tensor<Self, 1, Int>,
        rope: &Rope<Self>,
    ) -> Tensor<Self, 2> {
        rope.apply_rows(x, heads, positions)
    }
}

/// RMSNorm as burn operations.
pub fn reference_rms_norm<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 2> {
    // The statistics in FP32 whatever the activations' float type.
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let rms = x.clone().powi_scalar(2).mean_dim(1).add_scalar(eps).sqrt();
    x.div(rms)
        .mul(weight.cast(DType::F32).unsqueeze())
        .cast(dtype)
}

/// GeGLU's gate as burn operations: `0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * up`.
pub fn reference_geglu<B: Backend>(gate: Tensor<B, 2>, up: Tensor<B, 2>) -> Tensor<B, 2> {
    let inner = gate
        .clone()
        .powi_scalar(3)
        .mul_scalar(0.044715)
        .add(gate.clone())
        .mul_scalar((2.0 / std::f64::consts::PI).sqrt());
    gate.mul(inner.tanh().add_scalar(1.0))
        .mul_scalar(0.5)
        .mul(up)
}

/// On CubeCL backends, RMSNorm (written in the activations' float type: its output feeds a
/// product) and SwiGLU's gate are one kernel each (`fornax_shaders::layer_ops`); burn's
/// operations where the backend's float element is not FP32.
impl<R, F, I, BT> LayerOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        if !f32_backend::<Self>() {
            return reference_rms_norm(x, weight, eps);
        }
        let act = crate::backend::activation_dtype::<Self>(&x.device());
        let out = layer_launch::rms_norm(
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            eps as f32,
            act,
        );
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        if !f32_backend::<Self>() {
            return silu(gate).mul(up);
        }
        let out =
            layer_launch::swiglu(gate.into_primitive().tensor(), up.into_primitive().tensor());
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

/// Whether a CubeCL backend's float element is FP32, the instantiation the kernels' launch
/// glue is written for (tensors of other float dtypes, `--dtype`, come at run time).
fn f32_backend<B: Backend>() -> bool {
    FloatElem::<B>::dtype() == DType::F32
}

/// `x`'s values on the host, with its shape.
fn host<const D: usize>(x: Tensor<CpuBackend, D>) -> (Vec<f32>, Shape) {
    let shape = x.shape();
    (host_f32(x), shape)
}

fn tensor<B: Backend, const D: usize>(
    v: Vec<f32>,
    shape: Shape,
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), device)
}

/// On the CPU backend, in place in one pass (`fornax_cpu::layer_ops`).
impl LayerOps for CpuBackend {
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        let device = x.device();
        let (mut v, shape) = host(x);
        layer_ops::rms_norm(&mut v, &host(weight).0, eps as f32);
        tensor(v, shape, &device)
    }

    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let device = gate.device();
        let (mut g, shape) = host(gate);
        layer_ops::swiglu(&mut g, &host(up).0);
        tensor(g, shape, &device)
    }

    fn geglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let device = gate.device();
        let (mut g, shape) = host(gate);
        layer_ops::geglu(&mut g, &host(up).0);
        tensor(g, shape, &device)
    }

    fn rope_rows(
        x: Tensor<Self, 2>,
        heads: usize,
        positions: Tensor<Self, 1, Int>,
        rope: &Rope<Self>,
    ) -> Tensor<Self, 2> {
        let device = x.device();
        let (mut v, shape) = host(x);
        let at: Vec<usize> = positions
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .map(|p| p as usize)
            .collect();
        let (cos, sin) = rope.host_tables();
        let neox = rope.style() == RopeStyle::Neox;
        layer_ops::rope(&mut v, heads, &at, cos, sin, neox);
        tensor(v, shape, &device)
    }
}
