//! Fornax's CPU kernels, the CPU backend's counterpart of `fornax-shaders`.
//!
//! Products with GGUF block-quantized weights (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, and the
//! K-quants' groups of 32 with their super-blocks' scales: [`QuantFormat`]) read the blocks
//! with eight rows interleaved ([`InterleavedWeights`]): activations are quantized to 8
//! bits per block of 32 (as llama.cpp does), one SIMD product covers a block of eight rows
//! on the best level the CPU has (chosen at run time), and the row groups are split over
//! rayon's thread pool. A weight is read once per tile of tokens.

mod activations;
pub mod attention;
pub mod dense;
mod dot;
mod exp;
mod format;
mod interleaved;
pub mod layer_ops;
mod levels_check;
mod matmul;
mod simd;
mod threads;

pub use activations::Q8Activations;
pub use format::{QuantFormat, QuantWeights, WeightsError, QBLOCK, SUPER_GROUPS};
pub use interleaved::{InterleavedWeights, RowBlocks, LANES};
pub use levels_check::check_levels;
pub use matmul::matmul_many;
pub use simd::SimdLevel;
pub use threads::{set_threads, threads, ThreadsError};
