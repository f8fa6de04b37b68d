//! Launching the layer kernels ([`crate::layer_ops`]) on burn's CubeCL backends from burn
//! tensors. Inputs may be FP32, FP16 or BF16 and the normed outputs any of them (the
//! `out` dtype the caller asks); weights, tables and the residual stream are FP32.

use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::{tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use burn_backend::DType;

use crate::alloc::{empty_on, output_like, placeholder};
use crate::float::{contiguous_f32, with_float, with_floats};
use crate::layer_ops::{norm_residual as norm_residual_kernel, qkv_heads as qkv_heads_kernel};
use crate::layer_ops::{rms_norm as rms_norm_kernel, swiglu as swiglu_kernel};
use crate::layer_ops::{ELEMENT_UNITS, NORM_UNITS};
use crate::quant_launch::RopeKv;

/// RMSNorm of each row of `x` `[rows, d]` with `weight` `[d]`, written as `out`: one
/// launch.
pub fn rms_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
    out: DType,
) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let shape = x.meta.shape().clone();
    let (rows, d) = (shape[0], shape[1]);
    let dtype = x.dtype;
    let out = empty_on(&x, shape, out);
    if rows == 0 {
        return out;
    }
    let weight = contiguous_f32(weight);
    with_floats!(dtype, out.dtype, X, O => rms_norm_kernel::launch::<X, O, R>(
        &x.client.clone(),
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(NORM_UNITS as u32),
        x.into_array_arg(),
        weight.into_array_arg(),
        out.clone().into_array_arg(),
        d as u32,
        eps,
    ));
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
    let dtype = gate.dtype;
    let up = cast(into_contiguous(up), dtype);
    with_float!(dtype, F => swiglu_kernel::launch::<F, R>(
        &gate.client.clone(),
        CubeCount::Static(n.div_ceil(ELEMENT_UNITS) as u32, 1, 1),
        CubeDim::new_1d(ELEMENT_UNITS as u32),
        gate.into_array_arg(),
        up.into_array_arg(),
        out.clone().into_array_arg(),
        n as u32,
    ));
    out
}

/// An RMSNorm's weight `[d]` and epsilon.
pub struct Norm<R: CubeRuntime> {
    pub weight: CubeTensor<R>,
    pub eps: f32,
}

/// How [`qkv_heads`] treats the heads: RMSNorm over each query head and each key head
/// (one epsilon for both) where given, and RoPE's pairing.
pub struct HeadWork<R: CubeRuntime> {
    pub norms: Option<(Norm<R>, Norm<R>)>,
    /// Angle `i` pairs dimensions `i, i + head_dim / 2` (else `2 i, 2 i + 1`).
    pub neox: bool,
}

/// Q with RoPE from `qkv` `[tokens, q_width + 2 kv_width]` (`[q | k | v]`), written as
/// `out`, the head norms applied first where `work` has them; K with RoPE and V written
/// into the (FP32) arenas of `to` (whose `table` is laid out for both pairings alike). One
/// launch, a cube per head and token.
pub fn qkv_heads<R: CubeRuntime>(
    qkv: CubeTensor<R>,
    to: RopeKv<R>,
    work: HeadWork<R>,
    out: DType,
) -> CubeTensor<R> {
    let qkv = into_contiguous(qkv);
    let tokens = qkv.meta.shape()[0];
    let out = empty_on(&qkv, [tokens, to.q_width], out);
    if tokens == 0 {
        return out;
    }
    let (heads, kv_heads) = (to.q_width / to.head_dim, to.kv_width / to.head_dim);
    let normed = work.norms.is_some();
    let (q_norm, k_norm, eps) = match work.norms {
        Some((q, k)) => (contiguous_f32(q.weight), contiguous_f32(k.weight), q.eps),
        None => (placeholder(&qkv), placeholder(&qkv), 0.0),
    };
    let table = contiguous_f32(to.table);
    with_floats!(qkv.dtype, out.dtype, X, O => qkv_heads_kernel::launch::<X, O, R>(
        &qkv.client.clone(),
        CubeCount::Static((heads + kv_heads) as u32, tokens as u32, 1),
        CubeDim::new_1d(NORM_UNITS as u32),
        qkv.into_array_arg(),
        q_norm.into_array_arg(),
        k_norm.into_array_arg(),
        out.clone().into_array_arg(),
        to.keys.into_array_arg(),
        to.values.into_array_arg(),
        into_contiguous(to.info).into_array_arg(),
        table.into_array_arg(),
        heads as u32,
        kv_heads as u32,
        to.head_dim as u32,
        eps,
        normed,
        work.neox,
    ));
    out
}

/// `h = residual + rms(a) * post` over each row of `a` `[rows, d]` (the residual stream,
/// FP32), and with `next` also `rms(h) * next`, written as `out`: one launch.
pub fn norm_residual<R: CubeRuntime>(
    a: CubeTensor<R>,
    post: Norm<R>,
    residual: CubeTensor<R>,
    next: Option<Norm<R>>,
    out: DType,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let a = into_contiguous(a);
    let shape = a.meta.shape().clone();
    let (rows, d) = (shape[0], shape[1]);
    let h = empty_on(&a, shape.clone(), DType::F32);
    let then_norm = next.is_some();
    let (n, next_weight, next_eps) = match next {
        Some(norm) => (
            empty_on(&a, shape, out),
            contiguous_f32(norm.weight),
            norm.eps,
        ),
        None => (empty_on(&a, [1], out), placeholder(&a), 0.0),
    };
    if rows > 0 {
        let residual = contiguous_f32(residual);
        let post_weight = contiguous_f32(post.weight);
        with_floats!(a.dtype, n.dtype, X, O => norm_residual_kernel::launch::<X, O, R>(
            &a.client.clone(),
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(NORM_UNITS as u32),
            a.into_array_arg(),
            residual.into_array_arg(),
            post_weight.into_array_arg(),
            next_weight.into_array_arg(),
            h.clone().into_array_arg(),
            n.clone().into_array_arg(),
            d as u32,
            post.eps,
            next_eps,
            then_norm,
        ));
    }
    (h, then_norm.then_some(n))
}
