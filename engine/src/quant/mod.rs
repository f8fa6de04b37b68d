//! Block-quantized weights (GGUF Q4_0, Q4_1, Q8_0) kept quantized, and the matrix
//! products over them: our CubeCL kernels on burn's CubeCL backends (words on the device),
//! our SIMD kernels (`fornax-cpu`) on the CPU backend (words in host memory), a
//! dequantize-then-matmul reference for everything else.

mod matrix;
mod ops;
mod packed;
#[cfg(test)]
mod tests;

pub use matrix::{QuantMatrix, QuantStore};
pub use ops::QuantOps;
pub(crate) use ops::{by_dequantized_rows, quant_tensors};
pub use packed::{cpu_format, format_code, packable, PackedMatrix};
