use half::f16;

use super::{PackedMatrix, QuantMatrix, QuantOps};
use crate::gguf::GgmlType;
use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};

/// Three blocks (an odd count, so the FP16 scales need a padding half) with every code.
fn blocks(ty: GgmlType) -> Vec<u8> {
    let mut bytes = Vec::new();
    for b in 0..3u8 {
        bytes.extend(f16::from_f32(0.125 * f32::from(b + 1)).to_le_bytes());
        if ty == GgmlType::Q4_1 {
            bytes.extend(f16::from_f32(-0.5 + f32::from(b)).to_le_bytes());
        }
        let codes = if ty == GgmlType::Q8_0 { 32u8 } else { 16 };
        bytes.extend((0..codes).map(|j| j.wrapping_mul(37).wrapping_add(b * 101)));
    }
    bytes
}

#[test]
fn packed_words_decode_exactly_as_the_gguf_blocks() {
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let bytes = blocks(ty);
        let mut want = vec![0.0f32; 96];
        ty.dequantize(&bytes, &mut want);
        let packed = PackedMatrix::pack(ty, &bytes, 1, 96).unwrap();
        assert_eq!(packed.dequantize(), want, "{ty:?}");
        // As small as the file, give or take a padding half.
        assert!(
            packed.bytes() as u64 <= ty.bytes_for(96).unwrap() + 2,
            "{ty:?}"
        );
    }
}

#[test]
fn pack_refuses_what_it_cannot_hold() {
    let bytes = blocks(GgmlType::Q8_0);
    assert!(PackedMatrix::pack(GgmlType::F32, &bytes, 1, 96).is_none());
    // Rows of 48 values are not whole blocks; a byte count that disagrees with the shape.
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes, 2, 48).is_none());
    assert!(PackedMatrix::pack(GgmlType::Q8_0, &bytes[..60], 1, 96).is_none());
}

#[test]
fn reference_path_multiplies_by_the_dequantized_matrix() {
    type Cpu = NdArray<f32>;
    let device = Default::default();
    let bytes = blocks(GgmlType::Q4_1);
    let packed = PackedMatrix::pack(GgmlType::Q4_1, &bytes, 3, 32).unwrap();
    let w = QuantMatrix::<Cpu>::upload(&packed, &device);
    assert_eq!(w.download(), packed);
    let values = packed.dequantize();
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(vec![1.0f32; 32], [1, 32]), &device);
    let y: Vec<f32> = Cpu::quant_matmul(x, &w).into_data().to_vec().unwrap();
    for (r, &got) in y.iter().enumerate() {
        let want: f32 = values[r * 32..(r + 1) * 32].iter().sum();
        assert!((got - want).abs() < 1e-4, "row {r}: {got} vs {want}");
    }
    let ids = Tensor::<Cpu, 1, Int>::from_data(TensorData::new(vec![2i64], [1]), &device);
    let row: Vec<f32> = Cpu::quant_rows(ids, &w).into_data().to_vec().unwrap();
    assert_eq!(row, values[64..96]);
}
