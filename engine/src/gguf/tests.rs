//! Parser tests on synthetic files: every value type, both versions, and bad input.

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::*;

fn all_values_file(version: u32) -> GgufWriter {
    GgufWriter::new(version)
        .meta("general.architecture", Value::String("llama".into()))
        .meta("u8", Value::U8(7))
        .meta("i8", Value::I8(-7))
        .meta("u16", Value::U16(700))
        .meta("i16", Value::I16(-700))
        .meta("u32", Value::U32(70_000))
        .meta("i32", Value::I32(-70_000))
        .meta("f32", Value::F32(1.5))
        .meta("bool", Value::Bool(true))
        .meta("u64", Value::U64(1 << 40))
        .meta("i64", Value::I64(-(1 << 40)))
        .meta("f64", Value::F64(-2.25))
        .meta(
            "strings",
            Value::Array(vec![
                Value::String("a".into()),
                Value::String("héllo".into()),
            ]),
        )
        .meta(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)])]),
        )
        .tensor_f32("w", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor_f32("b", &[5], &[0.5; 5])
}

#[test]
fn reads_every_value_type_in_v2_and_v3() {
    for version in [2, 3] {
        let bytes = all_values_file(version).build();
        let f = GgufFile::parse(&bytes).unwrap();
        assert_eq!(f.version, version);
        assert_eq!(f.get("i8"), Some(&Value::I8(-7)));
        assert_eq!(f.get("i16"), Some(&Value::I16(-700)));
        assert_eq!(f.u64("u32").unwrap(), 70_000);
        assert_eq!(f.get("i64").and_then(Value::as_i64), Some(-(1 << 40)));
        assert_eq!(f.f64("f32").unwrap(), 1.5);
        assert_eq!(f.f64("f64").unwrap(), -2.25);
        assert_eq!(f.get("bool").and_then(Value::as_bool), Some(true));
        assert_eq!(f.array("strings").unwrap()[1].as_str(), Some("héllo"));
        assert_eq!(
            f.array("nested").unwrap()[0],
            Value::Array(vec![Value::I32(1), Value::I32(2)])
        );
        let (w, dims) = f.dequantize("w").unwrap();
        assert_eq!(dims, vec![2, 3]);
        assert_eq!(w, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(f.dequantize("b").unwrap().0, vec![0.5; 5]);
        assert_eq!(f.tensor("b").unwrap().offset % 32, 0);
    }
}

#[test]
fn wrong_types_and_missing_keys_are_named() {
    let bytes = all_values_file(3).build();
    let f = GgufFile::parse(&bytes).unwrap();
    assert!(matches!(f.u64("f64"), Err(GgufError::WrongType { .. })));
    assert_eq!(f.str("nope"), Err(GgufError::MissingKey("nope".into())));
    assert!(matches!(f.tensor("x"), Err(GgufError::MissingTensor(_))));
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = all_values_file(3).build();
    bytes[0] = b'X';
    assert_eq!(
        GgufFile::parse(&bytes).unwrap_err(),
        GgufError::BadMagic(*b"XGUF")
    );
    let bytes = all_values_file(1).build();
    assert_eq!(
        GgufFile::parse(&bytes).unwrap_err(),
        GgufError::UnsupportedVersion(1)
    );
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = all_values_file(3).build();
    for len in 0..bytes.len() - 1 {
        let err = GgufFile::parse(&bytes[..len]).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. }
                    | GgufError::ImplausibleCount { .. }
                    | GgufError::TensorOutOfBounds { .. }
            ),
            "len {len}: {err}"
        );
    }
}

#[test]
fn tensor_past_the_end_is_named() {
    let bytes = GgufWriter::new(3)
        .tensor_raw("big", &[64], 0, vec![0u8; 16])
        .build();
    match GgufFile::parse(&bytes).unwrap_err() {
        GgufError::TensorOutOfBounds { name, end, .. } => {
            assert_eq!(name, "big");
            assert_eq!(end, 256);
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn unknown_quantization_type_is_named() {
    let bytes = GgufWriter::new(3)
        .tensor_raw("q", &[256], 99, vec![0u8; 256])
        .build();
    let err = GgufFile::parse(&bytes).unwrap_err();
    assert_eq!(
        err,
        GgufError::UnknownTensorType {
            name: "q".into(),
            ggml_type: 99
        }
    );
    assert!(err
        .to_string()
        .contains("unknown or unsupported quantization type 99"));
}

#[test]
fn huge_counts_do_not_allocate() {
    let mut bytes = all_values_file(3).build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::parse(&bytes).unwrap_err(),
        GgufError::ImplausibleCount { .. }
    ));
}

/// Random byte flips, truncations and splices must give an error or a file, never a panic.
#[test]
fn random_corruption_never_panics() {
    let good = all_values_file(3).build();
    let mut rng = StdRng::seed_from_u64(0x6775_6666);
    let mut errors = 0;
    for _ in 0..20_000 {
        let mut bytes = good.clone();
        for _ in 0..rng.random_range(1..8) {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = match rng.random_range(0..3) {
                0 => rng.random(),
                1 => 0xff,
                _ => bytes[i] ^ (1 << rng.random_range(0..8)),
            };
        }
        if rng.random_bool(0.2) {
            bytes.truncate(rng.random_range(0..bytes.len()));
        }
        match GgufFile::parse(&bytes) {
            Ok(f) => {
                for t in &f.tensors {
                    let _ = f.dequantize(&t.name).unwrap();
                }
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
        }
    }
    assert!(errors > 1_000, "only {errors} corruptions were detected");
}

/// A K-quant tensor cut short, or shaped off its 256-value super-blocks, is named.
#[test]
fn truncated_or_misshapen_k_quant_tensors_are_named() {
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0] {
        let blocks = 2;
        let bytes = vec![0u8; blocks * ty.block_bytes() as usize];
        let elements = blocks as u64 * ty.block_elements();
        let file = GgufWriter::new(3)
            .tensor("w", &[elements], ty, bytes.clone())
            .build();
        let f = GgufFile::parse(&file).unwrap();
        assert_eq!(f.dequantize("w").unwrap().0, vec![0.0; elements as usize]);
        for cut in [1, ty.block_bytes() as usize] {
            let err = GgufFile::parse(&file[..file.len() - cut]).unwrap_err();
            assert!(
                matches!(&err, GgufError::TensorOutOfBounds { name, .. } if name == "w"),
                "{}: {err}",
                ty.name()
            );
        }
        let odd = GgufWriter::new(3)
            .tensor_raw("w", &[elements - 16], ty.id(), bytes)
            .build();
        let err = GgufFile::parse(&odd).unwrap_err();
        assert!(
            matches!(&err, GgufError::PartialBlock { name, .. } if name == "w"),
            "{}: {err}",
            ty.name()
        );
        assert!(err.to_string().contains("blocks"), "{err}");
    }
}
