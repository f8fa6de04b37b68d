//! Errors raised while loading or running the model.

use thiserror::Error;

use crate::gguf::GgufError;

/// What can go wrong building or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "unsupported architecture {0:?}: Fornax runs {supported}",
        supported = crate::model::ARCHITECTURES.join(", ")
    )]
    UnsupportedArchitecture(String),
    #[error("invalid model configuration: {0}")]
    BadConfig(String),
    #[error("context overflow: {needed} tokens needed, the model's context is {limit}")]
    ContextOverflow { needed: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("empty input: at least one token is needed")]
    EmptyInput,
    #[error("reading results back from the device failed: {0}")]
    Readback(String),
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    /// The output's grammar failed to match (a generation under a constraint).
    #[error("constrained decoding failed: {0}")]
    Grammar(#[from] crate::grammar::GrammarError),
}
