//! The transformer on burn, generic over the backend, and the model families it runs.

mod attention;
mod block;
mod config;
mod error;
mod family;
mod fused;
mod joint;
mod kv_cache;
mod layer_ops;
mod linear;
mod load;
mod mlp;
mod random;
mod rms_norm;
mod rope;
#[cfg(test)]
mod tests;
mod transformer;

pub(crate) use attention::attend;
pub use attention::Attention;
pub use block::Block;
pub use config::{Activation, LayerConfig, ModelConfig, RopeStyle};
pub use error::ModelError;
pub use family::{config_from_gguf, ARCHITECTURES};
pub use fused::{FusedOps, QkvTarget};
pub use joint::{Joint, Rows};
pub use kv_cache::KvCache;
pub use layer_ops::{reference_geglu, reference_rms_norm, LayerOps};
pub use linear::Linear;
pub use linear::Weight;
pub use load::LoadOptions;
pub use mlp::Mlp;
pub use rms_norm::RmsNorm;
pub use rope::Rope;
pub use transformer::{Logits, Model, Net, SeqTokens};
