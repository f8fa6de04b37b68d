//! Qwen3, as llama.cpp's `qwen3` graph runs it: Llama's blocks with RMSNorm on each query
//! and key head before RoPE, RoPE in the NeoX layout, no Q/K/V bias, and a head size of
//! its own (`attention.key_length`, not `d_model / heads`).

use super::Meta;
use crate::model::{ModelConfig, ModelError, RopeStyle};

/// Reads `qwen3.*` metadata.
pub(super) fn config(meta: &Meta<'_, '_>) -> Result<ModelConfig, ModelError> {
    let mut c = meta.common()?;
    c.rope_style = RopeStyle::Neox;
    c.qk_norm = true;
    meta.sliding_window(&mut c);
    Ok(c)
}
