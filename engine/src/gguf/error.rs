//! Errors raised while reading a GGUF file.

use thiserror::Error;

/// Everything that can be wrong with a GGUF file, each naming the problem.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GgufError {
    #[error("not a GGUF file: magic bytes are {0:?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated {
        what: &'static str,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("unknown metadata value type {0} for key {1:?}")]
    UnknownValueType(u32, String),
    #[error("metadata string at offset {0} is not valid UTF-8")]
    InvalidUtf8(usize),
    #[error("{what} count {count} is implausible for a file of {len} bytes")]
    ImplausibleCount {
        what: &'static str,
        count: u64,
        len: usize,
    },
    #[error("tensor {name:?} has {n_dims} dimensions (at most 4 supported)")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor {name:?} has an invalid shape {shape:?}")]
    BadShape { name: String, shape: Vec<u64> },
    #[error(
        "tensor {name:?} uses unknown or unsupported quantization type {ggml_type} (Fornax reads {})",
        super::types::GgmlType::names()
    )]
    UnknownTensorType { name: String, ggml_type: u32 },
    #[error(
        "tensor {name:?} of {elements} elements is not a whole number of {block}-element blocks"
    )]
    PartialBlock {
        name: String,
        elements: u64,
        block: u64,
    },
    #[error("tensor {name:?} points past the end of the file (bytes {start}..{end}, file data ends at {len})")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("tensor {name:?} is not aligned to {alignment} bytes (offset {offset})")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("invalid alignment {0} (must be a power of two)")]
    BadAlignment(u64),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
}
