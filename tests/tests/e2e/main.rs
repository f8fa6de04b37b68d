//! Every end-to-end test of `fornax-tests` in one binary: each file is a module, so burn's
//! generic CPU and wgpu code is compiled once for all of them rather than once per file.
//! Tests that use the wgpu device go through [`common::run_on`] (or hold
//! [`common::wgpu_shared`]), so the one test that measures the device allocator can have
//! the device to itself.

mod common;

mod bad_input;
mod cuda_kernels;
mod dequant;
mod device_counts;
mod device_sampling;
mod engine_batching;
mod families;
mod fp16;
mod fused_layers;
mod gemma3;
mod host_tier;
mod kv_kernels;
mod kv_memory;
mod layer_kernels;
mod llama_cpp;
mod paged_model;
mod quant_kernels;
mod reference_cpu;
mod reference_wgpu;
mod sampling_requests;
mod speculative;
mod structured;
mod templates;
mod tiny_model;
mod tokenizer;
