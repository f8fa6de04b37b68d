//! A block-quantized matrix held on the device.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use super::PackedMatrix;
use crate::gguf::GgmlType;

/// A `[rows, cols]` block-quantized matrix on the device: the packed word arrays as
/// 32-bit integer tensors, nothing else (no FP32 copy).
#[derive(Debug, Clone)]
pub struct QuantMatrix<B: Backend> {
    /// The GGUF block type.
    pub ggml_type: GgmlType,
    /// Rows (outputs).
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Code words.
    pub quants: Tensor<B, 1, Int>,
    /// Scale words.
    pub scales: Tensor<B, 1, Int>,
}

fn words<B: Backend>(words: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let bits: Vec<i32> = words.iter().map(|&w| w as i32).collect();
    Tensor::from_data(TensorData::new(bits, [words.len()]), device)
}

impl<B: Backend> QuantMatrix<B> {
    /// Uploads a packed matrix.
    pub fn upload(packed: &PackedMatrix, device: &B::Device) -> Self {
        Self {
            ggml_type: packed.ggml_type,
            rows: packed.rows,
            cols: packed.cols,
            quants: words(&packed.quants, device),
            scales: words(&packed.scales, device),
        }
    }

    /// Reads the words back to the host.
    pub fn download(&self) -> PackedMatrix {
        let host = |t: &Tensor<B, 1, Int>| -> Vec<u32> {
            let data = t.to_data().convert::<i32>();
            data.iter::<i32>().map(|w| w as u32).collect()
        };
        PackedMatrix {
            ggml_type: self.ggml_type,
            rows: self.rows,
            cols: self.cols,
            quants: host(&self.quants),
            scales: host(&self.scales),
        }
    }

    /// Bytes the words take on a device with 32-bit integers.
    pub fn bytes(&self) -> usize {
        4 * (self.quants.dims()[0] + self.scales.dims()[0])
    }
}
