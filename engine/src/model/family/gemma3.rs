//! Gemma 3, as llama.cpp's `gemma3` graph runs it: embeddings scaled by `sqrt(d_model)`,
//! RMSNorm on each query and key head, norms after attention and after the feed-forward
//! layer as well as before, GeGLU (tanh), RoPE in the NeoX layout, and sliding-window
//! attention on five layers of every six with their own RoPE base. The file's norm weights
//! already include Gemma's `1 +`.

use super::Meta;
use crate::model::{Activation, ModelConfig, ModelError, RopeStyle};

/// Of every this many layers, all but the last attend over a sliding window.
const WINDOW_PATTERN: usize = 6;
/// RoPE base of the windowed layers where the file names none (the global layers use
/// `rope.freq_base`).
const WINDOW_ROPE_THETA: f64 = 10000.0;

/// Reads `gemma3.*` metadata.
pub(super) fn config(meta: &Meta<'_, '_>) -> Result<ModelConfig, ModelError> {
    let mut c = meta.common()?;
    c.rope_style = RopeStyle::Neox;
    c.activation = Activation::GeluTanh;
    c.embed_scale = Some((c.d_model as f32).sqrt());
    c.qk_norm = true;
    c.post_norms = true;
    let window = meta.usize("attention.sliding_window")?;
    let local_theta = meta
        .opt_f64("rope.freq_base_swa")
        .unwrap_or(WINDOW_ROPE_THETA);
    for (i, layer) in c.layers.iter_mut().enumerate() {
        if i % WINDOW_PATTERN < WINDOW_PATTERN - 1 {
            layer.window = Some(window);
            layer.rope_theta = local_theta;
        }
    }
    Ok(c)
}
