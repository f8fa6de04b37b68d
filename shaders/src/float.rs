//! The float types the kernels are compiled for, chosen at each launch from the dtypes of
//! the tensors it binds: FP32, FP16 or BF16 activations, FP32 arithmetic inside.

use burn_backend::DType;
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::{tensor::CubeTensor, CubeRuntime};

/// Runs `$body` with `$F` naming the kernel element type of the float dtype `$dtype`.
macro_rules! with_float {
    ($dtype:expr, $F:ident => $body:expr) => {
        match $dtype {
            burn_backend::DType::F32 => {
                type $F = f32;
                $body
            }
            burn_backend::DType::F16 => {
                type $F = half::f16;
                $body
            }
            burn_backend::DType::BF16 => {
                type $F = half::bf16;
                $body
            }
            other => panic!("the kernels take FP32, FP16 or BF16 floats, not {other:?}"),
        }
    };
}

/// [`with_float!`] for two types: `$X` of dtype `$x` and `$O` of dtype `$o`.
macro_rules! with_floats {
    ($x:expr, $o:expr, $X:ident, $O:ident => $body:expr) => {
        with_float!($x, $X => with_float!($o, $O => $body))
    };
}

pub(crate) use {with_float, with_floats};

/// `t` contiguous and in FP32, as the kernels read weights, tables and the residual
/// stream. burn's `cast` converts (one dispatch) only where the dtype differs, which the
/// engine, keeping them FP32, never makes it do.
pub(crate) fn contiguous_f32<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    cast(into_contiguous(t), DType::F32)
}
