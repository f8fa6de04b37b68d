//! Launching the layer kernels ([`crate::layer_ops`]) on burn's CubeCL backends from burn
//! tensors (FP32).

use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::launch::output_like;
use crate::layer_ops::{rms_norm as rms_norm_kernel, swiglu as swiglu_kernel};
use crate::layer_ops::{ELEMENT_UNITS, NORM_UNITS};

/// RMSNorm of each row of `x` `[rows, d]` with `weight` `[d]`: one launch.
pub fn rms_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let shape = x.meta.shape().clone();
    let (rows, d) = (shape[0], shape[1]);
    let out = output_like(&x);
    if rows == 0 {
        return out;
    }
    rms_norm_kernel::launch::<R>(
        &x.client.clone(),
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(NORM_UNITS as u32),
        x.into_array_arg(),
        into_contiguous(weight).into_array_arg(),
        out.clone().into_array_arg(),
        d as u32,
        eps,
    );
    out
}

/// `silu(gate) * up` (same shapes): one launch.
pub fn swiglu<R: CubeRuntime>(gate: CubeTensor<R>, up: CubeTensor<R>) -> CubeTensor<R> {
    let gate = into_contiguous(gate);
    let n = gate.meta.shape().num_elements();
    let out = output_like(&gate);
    if n == 0 {
        return out;
    }
    swiglu_kernel::launch::<R>(
        &gate.client.clone(),
        CubeCount::Static(n.div_ceil(ELEMENT_UNITS) as u32, 1, 1),
        CubeDim::new_1d(ELEMENT_UNITS as u32),
        gate.into_array_arg(),
        into_contiguous(up).into_array_arg(),
        out.clone().into_array_arg(),
        n as u32,
    );
    out
}
