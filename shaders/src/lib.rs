//! Kernel sources for Fornax. The paged-attention and quantized-matmul kernels land here.
