//! Launching the sampling kernel ([`crate::sampling`]) from burn tensors.

use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::alloc::empty_on;
use crate::float::with_float;
use crate::sampling::{sample_rows, SAMPLE_UNITS};

/// The token of each row of `logits` `[rows, vocab]` (FP32, FP16 or BF16) under `params`
/// `[rows * 4]` (temperature, top-k, top-p, draw; FP32): `[rows]` ids of `id_dtype`
/// (32-bit), one launch.
pub fn sample<R: CubeRuntime>(
    logits: CubeTensor<R>,
    params: CubeTensor<R>,
    id_dtype: burn_backend::DType,
) -> CubeTensor<R> {
    let logits = into_contiguous(logits);
    let [rows, vocab] = [logits.meta.shape()[0], logits.meta.shape()[1]];
    let out = empty_on(&logits, [rows], id_dtype);
    if rows == 0 {
        return out;
    }
    assert_eq!(
        params.dtype,
        burn_backend::DType::F32,
        "sampling parameters are FP32"
    );
    let dtype = logits.dtype;
    with_float!(dtype, L => sample_rows::launch::<L, R>(
        &logits.client.clone(),
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(SAMPLE_UNITS as u32),
        logits.into_array_arg(),
        into_contiguous(params).into_array_arg(),
        out.clone().into_array_arg(),
        vocab as u32,
    ));
    out
}
