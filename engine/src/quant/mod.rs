//! Block-quantized weights (GGUF Q4_0, Q4_1, Q8_0) kept quantized on the device, and the
//! matrix products over them: our CubeCL kernels on burn's CubeCL backends, a
//! dequantize-then-matmul reference elsewhere.

mod matrix;
mod ops;
mod packed;
#[cfg(test)]
mod tests;

pub use matrix::QuantMatrix;
pub use ops::QuantOps;
pub use packed::{format_code, PackedMatrix};
