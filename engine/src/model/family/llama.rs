//! Llama 1-3 (and the models that share its GGUF layout, such as SmolLM2): pre-norm
//! blocks, SwiGLU, RoPE on adjacent pairs, full attention; Llama 3.1+'s long-context RoPE
//! as the divisors of the `rope_freqs` tensor.

use super::Meta;
use crate::model::{ModelConfig, ModelError};

/// Reads `llama.*` metadata and the RoPE divisors where the file has them.
pub(super) fn config(meta: &Meta<'_, '_>) -> Result<ModelConfig, ModelError> {
    let mut c = meta.common()?;
    c.rope_factors = meta.rope_factors()?;
    meta.sliding_window(&mut c);
    Ok(c)
}
