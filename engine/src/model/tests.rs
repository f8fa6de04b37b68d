//! Model configuration from GGUF metadata. The layers on a small random model run in the
//! end-to-end test binary (`tests/tests/e2e/tiny_model.rs`), which builds the CPU backend
//! anyway: here they would compile burn's generic code once more.

use super::*;
use crate::gguf::{GgufFile, GgufWriter, Value};

#[test]
fn other_architectures_are_refused_by_name() {
    let bytes = GgufWriter::new(3)
        .meta("general.architecture", Value::String("gpt2".into()))
        .build();
    let file = GgufFile::parse(&bytes).unwrap();
    let err = LlamaConfig::from_gguf(&file).unwrap_err();
    assert!(matches!(&err, ModelError::UnsupportedArchitecture(a) if a == "gpt2"));
    assert!(err.to_string().contains("gpt2"));
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
    let c = LlamaConfig::from_gguf(&GgufFile::parse(&bytes).unwrap()).unwrap();
    assert_eq!(
        (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads),
        (100, 64, 3, 8, 2)
    );
    assert_eq!((c.d_ff, c.max_seq_len, c.rope_theta), (128, 256, 5e5));
    assert!(c.tied_embeddings);
}
