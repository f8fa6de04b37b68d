//! Qwen2 and Qwen2.5, as llama.cpp's `qwen2` graph runs them: Llama's blocks with a bias
//! on each of Q, K and V and RoPE in the NeoX layout; the output matrix tied or separate.

use super::Meta;
use crate::model::{ModelConfig, ModelError, RopeStyle};

/// Reads `qwen2.*` metadata.
pub(super) fn config(meta: &Meta<'_, '_>) -> Result<ModelConfig, ModelError> {
    let mut c = meta.common()?;
    c.rope_style = RopeStyle::Neox;
    c.qkv_bias = true;
    meta.sliding_window(&mut c);
    Ok(c)
}
