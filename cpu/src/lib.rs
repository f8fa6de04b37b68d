//! Fornax's CPU kernels, the CPU backend's counterpart of `fornax-shaders`.
//!
//! Products with GGUF block-quantized weights (Q4_0, Q4_1, Q8_0) read the blocks in place:
//! activations are quantized to 8 bits per block of 32 (as llama.cpp does), each block's
//! integer dot product runs on the best SIMD level the CPU has (chosen at run time), and
//! the rows of the weight are split over rayon's thread pool. A weight row is read once
//! per call for all the tokens of the batch.

mod activations;
pub mod attention;
mod dot;
mod format;
pub mod layer_ops;
mod matmul;
mod rows;
mod simd;
mod threads;

pub use activations::Q8Activations;
pub use format::{QuantFormat, QuantWeights, WeightsError, QBLOCK};
pub use matmul::matmul_many;
pub use simd::SimdLevel;
pub use threads::{set_threads, threads, ThreadsError};
