//! Fornax engine core: GGUF weights, tokenizer, the model families on burn, the paged KV
//! cache, continuous batching, sampling and generation. Without its features it has no
//! threads or file-system calls, so it also builds for wasm32; `store` (default) adds
//! models on disk (aliases fetched and checked, files memory-mapped) and `redis` the
//! shared KV tier on Redis.
//!
//! A model by alias or path, a chat reply streamed token by token, then a batch engine
//! answering two prompts together (`examples/library.rs`, run by the test command):
//!
//! ```no_run
#![doc = include_str!("../examples/library.rs")]
//! ```

mod backend;
pub use backend::{CpuBackend, DeviceMemory, DeviceMemoryInfo, EngineBackend};
pub mod device_counts;
pub mod gguf;
pub mod grammar;
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
#[cfg(feature = "store")]
pub mod store;

mod engine;
pub use engine::{Engine, Event, Request, PROMPT_SCORE_CHUNK};
