//! Llama (and the models that share its GGUF layout, such as SmolLM2): pre-norm blocks,
//! SwiGLU, RoPE on adjacent pairs, full attention.

use super::Meta;
use crate::model::{ModelConfig, ModelError};

/// Reads `llama.*` metadata.
pub(super) fn config(meta: &Meta<'_, '_>) -> Result<ModelConfig, ModelError> {
    meta.common()
}
