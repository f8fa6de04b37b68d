//! Host-side pieces of the Fornax command line that tests reuse: the model store
//! (default model download and checks), the compiled-kernel cache, opening GGUF files
//! from disk, the engine loop that serves requests from a thread, and the
//! OpenAI-compatible HTTP server.

pub mod engine_loop;
pub mod kernel_cache;
pub mod kv_remote;
pub mod model_file;
pub mod model_store;
pub mod server;
