//! Model families: each file reads its architecture's GGUF metadata into a
//! [`ModelConfig`], which says what the shared layers do (norms, RoPE layout, activation,
//! attention windows). Adding a family is a new file here and a line in [`FAMILIES`].

mod gemma3;
mod llama;
mod qwen2;
mod qwen3;

use super::{ModelConfig, ModelError};
use crate::gguf::{GgufError, GgufFile};

/// A family's reader of its metadata.
type ReadConfig = fn(&Meta<'_, '_>) -> Result<ModelConfig, ModelError>;

/// Each `general.architecture` Fornax runs, with its reader.
const FAMILIES: [(&str, ReadConfig); 4] = [
    ("llama", llama::config),
    ("gemma3", gemma3::config),
    ("qwen2", qwen2::config),
    ("qwen3", qwen3::config),
];

/// The `general.architecture` values Fornax runs.
pub const ARCHITECTURES: [&str; FAMILIES.len()] = {
    let mut names = [""; FAMILIES.len()];
    let mut i = 0;
    while i < FAMILIES.len() {
        names[i] = FAMILIES[i].0;
        i += 1;
    }
    names
};

/// The hyper-parameters of the model in `file`, read by its family.
pub fn config_from_gguf(file: &GgufFile<'_>) -> Result<ModelConfig, ModelError> {
    let arch = file.str("general.architecture")?;
    let Some((_, read)) = FAMILIES.iter().find(|(name, _)| *name == arch) else {
        return Err(ModelError::UnsupportedArchitecture(arch.to_string()));
    };
    let config = read(&Meta { file, arch })?;
    config.validate()?;
    Ok(config)
}

/// The metadata keys of one architecture (`{arch}.{key}`).
struct Meta<'f, 'a> {
    file: &'f GgufFile<'a>,
    arch: &'f str,
}

impl Meta<'_, '_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required count.
    fn usize(&self, k: &str) -> Result<usize, GgufError> {
        self.file.u64(&self.key(k)).map(|v| v as usize)
    }

    /// An optional count.
    fn opt_usize(&self, k: &str) -> Option<usize> {
        let v = self.file.get(&self.key(k))?;
        v.as_u64().map(|v| v as usize)
    }

    /// An optional number.
    fn opt_f64(&self, k: &str) -> Option<f64> {
        self.file.get(&self.key(k)).and_then(|v| v.as_f64())
    }

    /// A required number.
    fn f64(&self, k: &str) -> Result<f64, GgufError> {
        self.file.f64(&self.key(k))
    }

    /// Every layer attends over the window the file declares, if it declares one
    /// (`attention.sliding_window`, as Mistral's files do).
    fn sliding_window(&self, c: &mut ModelConfig) {
        if let Some(window) = self.opt_usize("attention.sliding_window") {
            c.layers.iter_mut().for_each(|l| l.window = Some(window));
        }
    }

    /// The divisors of RoPE's frequencies in the `rope_freqs` tensor (Llama 3.1+), if
    /// the file has one.
    fn rope_factors(&self) -> Result<Option<Vec<f32>>, ModelError> {
        if self.file.tensor("rope_freqs.weight").is_err() {
            return Ok(None);
        }
        Ok(Some(self.file.dequantize("rope_freqs.weight")?.0))
    }

    /// The sizes every family has, with Llama's conventions for the rest
    /// ([`ModelConfig::new`]); the caller sets what its family does differently.
    fn common(&self) -> Result<ModelConfig, ModelError> {
        let n_heads = self.usize("attention.head_count")?;
        let vocab_size = match self.opt_usize("vocab_size") {
            Some(v) => v,
            None => self.file.array("tokenizer.ggml.tokens")?.len(),
        };
        let mut c = ModelConfig::new(
            vocab_size,
            self.usize("embedding_length")?,
            self.usize("block_count")?,
            n_heads,
            self.opt_usize("attention.head_count_kv").unwrap_or(n_heads),
            self.usize("feed_forward_length")?,
            self.usize("context_length")?,
        );
        c.architecture = self.arch.to_string();
        if let Some(hd) = self.opt_usize("attention.key_length") {
            c.head_dim = hd;
        }
        if let Some(hd) = self.opt_usize("attention.value_length") {
            if hd != c.head_dim {
                return Err(ModelError::BadConfig(format!(
                    "value heads of {hd} and key heads of {} are not supported",
                    c.head_dim
                )));
            }
        }
        if let Some(theta) = self.opt_f64("rope.freq_base") {
            c.layers.iter_mut().for_each(|l| l.rope_theta = theta);
        }
        c.rms_eps = self.f64("attention.layer_norm_rms_epsilon")?;
        c.tied_embeddings = self.file.tensor("output.weight").is_err();
        if let Some(rope_dims) = self.opt_usize("rope.dimension_count") {
            if rope_dims != c.head_dim {
                return Err(ModelError::BadConfig(format!(
                    "partial RoPE ({rope_dims} of {} dims) is not supported",
                    c.head_dim
                )));
            }
        }
        if let Some(kind) = self
            .file
            .get(&self.key("rope.scaling.type"))
            .and_then(|v| v.as_str())
            .filter(|&k| k != "none")
        {
            return Err(ModelError::BadConfig(format!(
                "RoPE scaling {kind:?} is not supported"
            )));
        }
        Ok(c)
    }
}
