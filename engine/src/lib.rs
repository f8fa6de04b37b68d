//! Fornax engine core: GGUF weights, tokenizer, the Llama model on burn, sampling and
//! generation. Free of threads and file-system calls so it also builds for wasm32.

mod backend;
pub use backend::{CpuBackend, DeviceMemory, DeviceMemoryInfo, EngineBackend};
pub mod device_counts;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod prefix;
pub mod quant;
pub mod sampling;
pub mod sched;
pub mod tokenizer;

mod generate;
mod host_values;
pub use generate::{
    generate, generate_in, logits_to_vec, logits_to_vec_async, prefill, prefill_logits,
    GenerateParams, Generation,
};
pub mod score;
pub mod seq_cache;
pub mod spec;

mod engine;
pub use engine::{Engine, Event, Request};
