//! GGUF: the weight file format (header, metadata, tensor table, quantized blocks).
//!
//! Parsing works on a byte slice so the same code runs on native (memory-mapped files)
//! and in the browser (a fetched buffer).

mod error;
mod groups;
mod reader;
#[cfg(test)]
mod tests;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use groups::Group;
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
pub use writer::GgufWriter;
