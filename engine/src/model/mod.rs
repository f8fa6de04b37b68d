//! The Llama-family transformer on burn, generic over the backend.

mod attention;
mod block;
mod config;
mod error;
mod fused;
mod joint;
mod kv_cache;
mod layer_ops;
mod linear;
mod llama;
mod load;
mod mlp;
mod random;
mod rms_norm;
mod rope;
#[cfg(test)]
mod tests;

pub(crate) use attention::attend;
pub use attention::Attention;
pub use block::Block;
pub use config::LlamaConfig;
pub use error::ModelError;
pub use fused::{FusedOps, QkvTarget};
pub use joint::{Joint, Rows};
pub use kv_cache::KvCache;
pub use layer_ops::{reference_rms_norm, LayerOps};
pub use linear::Linear;
pub use linear::Weight;
pub use llama::{Llama, LlamaModel, Logits, SeqTokens};
pub use load::LoadOptions;
pub use mlp::Mlp;
pub use rms_norm::RmsNorm;
pub use rope::Rope;

/// The `general.architecture` values Fornax runs.
pub const ARCHITECTURES: [&str; 1] = ["llama"];
