//! Damaged copies of the real model file: each gives an error naming the problem.

use crate::common::model_file;
use fornax_engine::gguf::{GgufError, GgufFile};
use fornax_engine::model::{config_from_gguf, ModelError};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn header_len(bytes: &[u8]) -> usize {
    let f = GgufFile::parse(bytes).unwrap();
    let first = f.tensors.iter().map(|t| t.offset).min().unwrap();
    bytes.len() - f.tensors.iter().map(|t| t.offset + t.size).max().unwrap() as usize
        + first as usize
}

#[test]
fn truncated_file_is_named() {
    let bytes = model_file().bytes();
    for len in [0, 3, 7, 100, 5_000, 1_000_000, bytes.len() - 1] {
        let err = GgufFile::parse(&bytes[..len]).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. }
                    | GgufError::TensorOutOfBounds { .. }
                    | GgufError::ImplausibleCount { .. }
            ),
            "len {len}: {err}"
        );
    }
    let err = GgufFile::parse(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(err.to_string().contains("points past the end"), "{err}");
}

#[test]
fn wrong_magic_is_named() {
    let mut bytes = model_file().bytes()[..4096].to_vec();
    bytes[..4].copy_from_slice(b"GGML");
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert_eq!(err, GgufError::BadMagic(*b"GGML"));
    assert!(err.to_string().contains("not a GGUF file"));
}

/// Finds the tensor-table entry of `name` in the header: returns the offset just after
/// its name bytes.
fn tensor_entry(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .unwrap()
        + key.len()
}

#[test]
fn tensor_past_the_end_is_named() {
    let mut bytes = model_file().bytes().to_vec();
    let at = tensor_entry(&bytes, "output_norm.weight");
    // n_dims (u32), one dim (u64), type (u32), then the offset (u64).
    let off = at + 4 + 8 + 4;
    bytes[off..off + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    match GgufFile::parse(&bytes).unwrap_err() {
        GgufError::TensorOutOfBounds { name, .. } => assert_eq!(name, "output_norm.weight"),
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn unknown_quantization_type_is_named() {
    let mut bytes = model_file().bytes().to_vec();
    let at = tensor_entry(&bytes, "blk.0.attn_q.weight");
    let ty = at + 4 + 2 * 8;
    bytes[ty..ty + 4].copy_from_slice(&77u32.to_le_bytes());
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert_eq!(
        err,
        GgufError::UnknownTensorType {
            name: "blk.0.attn_q.weight".into(),
            ggml_type: 77
        }
    );
}

#[test]
fn other_architecture_is_named() {
    let mut bytes = model_file().bytes().to_vec();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // value type (u32 = 8, string), length (u64 = 5), then "llama".
    assert_eq!(&bytes[at + 12..at + 17], b"llama");
    bytes[at + 12..at + 17].copy_from_slice(b"gemma");
    let file = GgufFile::parse(&bytes).unwrap();
    let err = config_from_gguf(&file).unwrap_err();
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture(a) if a == "gemma"),
        "{err}"
    );
}

/// Seeded random corruption of the real header (and its tensor table): never a panic.
#[test]
fn random_corruption_of_the_real_header_never_panics() {
    let good = model_file().bytes();
    let header = header_len(good);
    let mut rng = StdRng::seed_from_u64(2026);
    let (mut ok, mut errors) = (0, 0);
    for case in 0..2_000 {
        let mut bytes = good[..header + 4096].to_vec();
        for _ in 0..rng.random_range(1..6) {
            // Favour the fixed header and the tensor table, where lengths and counts live.
            let i = if rng.random_bool(0.5) {
                rng.random_range(0..64)
            } else {
                rng.random_range(0..header)
            };
            bytes[i] = rng.random();
        }
        if case % 5 == 0 {
            bytes.truncate(rng.random_range(0..bytes.len()));
        }
        match GgufFile::parse(&bytes) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
        }
    }
    eprintln!("random corruption: {errors} errors, {ok} still parsed, 0 panics");
    assert!(errors > 500);
}
