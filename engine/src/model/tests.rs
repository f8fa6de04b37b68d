//! Model configuration from GGUF metadata. The layers on a small random model run in the
//! end-to-end test binary (`tests/tests/e2e/tiny_model.rs`), which builds the CPU backend
//! anyway: here they would compile burn's generic code once more.

use super::*;
use crate::gguf::{GgufFile, GgufWriter, Value};

#[test]
fn other_architectures_are_refused_by_name() {
    assert_eq!(ARCHITECTURES, ["llama", "gemma3", "qwen2", "qwen3"]);
    let bytes = GgufWriter::new(3)
        .meta("general.architecture", Value::String("gpt2".into()))
        .build();
    let file = GgufFile::parse(&bytes).unwrap();
    let err = config_from_gguf(&file).unwrap_err();
    assert!(matches!(&err, ModelError::UnsupportedArchitecture(a) if a == "gpt2"));
    assert!(err.to_string().contains("gpt2"));
    assert!(
        err.to_string().contains("llama, gemma3, qwen2, qwen3"),
        "{err}"
    );
}

#[test]
fn config_comes_from_metadata() {
    let u = |v: u32| Value::U32(v);
    let bytes = GgufWriter::new(3)
        .meta("general.architecture", Value::String("llama".into()))
        .meta("llama.vocab_size", u(100))
        .meta("llama.embedding_length", u(64))
        .meta("llama.block_count", u(3))
        .meta("llama.attention.head_count", u(8))
        .meta("llama.attention.head_count_kv", u(2))
        .meta("llama.feed_forward_length", u(128))
        .meta("llama.context_length", u(256))
        .meta("llama.rope.freq_base", Value::F32(5e5))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .build();
    let c = config_from_gguf(&GgufFile::parse(&bytes).unwrap()).unwrap();
    assert_eq!(
        (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads),
        (100, 64, 3, 8, 2)
    );
    assert_eq!(
        (c.d_ff, c.max_seq_len, c.layers[2].rope_theta),
        (128, 256, 5e5)
    );
    assert!(c.tied_embeddings);
}

#[test]
fn gemma3_config_windows_five_layers_of_six() {
    let u = |v: u32| Value::U32(v);
    let bytes = GgufWriter::new(3)
        .meta("general.architecture", Value::String("gemma3".into()))
        .meta("gemma3.vocab_size", u(100))
        .meta("gemma3.embedding_length", u(64))
        .meta("gemma3.block_count", u(12))
        .meta("gemma3.attention.head_count", u(4))
        .meta("gemma3.attention.head_count_kv", u(1))
        .meta("gemma3.attention.key_length", u(32))
        .meta("gemma3.attention.value_length", u(32))
        .meta("gemma3.feed_forward_length", u(128))
        .meta("gemma3.context_length", u(256))
        .meta("gemma3.rope.freq_base", Value::F32(1e6))
        .meta("gemma3.attention.sliding_window", u(16))
        .meta("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .build();
    let c = config_from_gguf(&GgufFile::parse(&bytes).unwrap()).unwrap();
    assert_eq!((c.head_dim, c.q_width()), (32, 128));
    assert_eq!(c.embed_scale, Some(8.0));
    assert!(c.qk_norm && c.post_norms);
    assert_eq!(
        (c.rope_style, c.activation),
        (RopeStyle::Neox, Activation::GeluTanh)
    );
    let full: Vec<usize> = (0..12).filter(|&i| c.layers[i].window.is_none()).collect();
    assert_eq!(full, [5, 11]);
    assert!(c.layers.iter().all(|l| match l.window {
        Some(w) => w == 16 && l.rope_theta == 10000.0,
        None => l.rope_theta == 1e6,
    }));
    assert_eq!(c.rope_thetas(), [10000.0, 1e6]);
}

/// A small file of `arch` with the sizes every family reads, plus `extra` metadata.
fn sized(arch: &str, extra: impl FnOnce(GgufWriter) -> GgufWriter) -> Vec<u8> {
    let u = |v: u32| Value::U32(v);
    let k = |key: &str| format!("{arch}.{key}");
    let w = GgufWriter::new(3)
        .meta("general.architecture", Value::String(arch.into()))
        .meta(&k("vocab_size"), u(100))
        .meta(&k("embedding_length"), u(64))
        .meta(&k("block_count"), u(2))
        .meta(&k("attention.head_count"), u(4))
        .meta(&k("attention.head_count_kv"), u(2))
        .meta(&k("attention.key_length"), u(32))
        .meta(&k("attention.value_length"), u(32))
        .meta(&k("feed_forward_length"), u(128))
        .meta(&k("context_length"), u(256))
        .meta(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    extra(w).build()
}

#[test]
fn qwen_families_read_their_head_layouts() {
    let qwen2 = config_from_gguf(&GgufFile::parse(&sized("qwen2", |w| w)).unwrap()).unwrap();
    assert!(qwen2.qkv_bias && !qwen2.qk_norm);
    assert_eq!(qwen2.rope_style, RopeStyle::Neox);
    let qwen3 = config_from_gguf(&GgufFile::parse(&sized("qwen3", |w| w)).unwrap()).unwrap();
    assert!(qwen3.qk_norm && !qwen3.qkv_bias);
    assert_eq!((qwen3.rope_style, qwen3.q_width()), (RopeStyle::Neox, 128));
    // A window the file declares holds on every layer (Mistral-style).
    let windowed = sized("qwen2", |w| {
        w.meta("qwen2.attention.sliding_window", Value::U32(64))
    });
    let c = config_from_gguf(&GgufFile::parse(&windowed).unwrap()).unwrap();
    assert!(c.layers.iter().all(|l| l.window == Some(64)));
}

#[test]
fn llama3_reads_its_rope_divisors_and_refuses_a_wrong_count() {
    let good = sized("llama", |w| {
        w.tensor_f32("rope_freqs.weight", &[16], &[2.0; 16])
    });
    let c = config_from_gguf(&GgufFile::parse(&good).unwrap()).unwrap();
    assert_eq!(c.rope_factors.as_deref(), Some(&[2.0f32; 16][..]));
    let bad = sized("llama", |w| {
        w.tensor_f32("rope_freqs.weight", &[8], &[2.0; 8])
    });
    let err = config_from_gguf(&GgufFile::parse(&bad).unwrap()).unwrap_err();
    assert!(err.to_string().contains("8 RoPE factors"), "{err}");
}
