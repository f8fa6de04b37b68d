//! Host-side pieces of the Fornax command line that tests reuse: the model store
//! (default model download and checks) and opening GGUF files from disk.

pub mod model_file;
pub mod model_store;
