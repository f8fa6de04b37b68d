//! Host-side pieces of the Fornax command line that tests reuse: the model store
//! (default model download and checks), opening GGUF files from disk, and the engine loop
//! that serves requests from a thread.

pub mod engine_loop;
pub mod model_file;
pub mod model_store;
