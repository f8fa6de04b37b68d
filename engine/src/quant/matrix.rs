//! A block-quantized matrix where the backend's kernels read it.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

use super::{PackedMatrix, QuantOps};
use crate::gguf::GgmlType;

/// 32-bit words on the device.
pub type WordTensor<B> = Tensor<B, 1, Int>;

/// Where a [`QuantMatrix`]'s words live.
#[derive(Debug, Clone)]
pub enum QuantStore<B: Backend> {
    /// On the device as 32-bit integer tensors (the CubeCL kernels).
    Device {
        /// Code words.
        quants: Tensor<B, 1, Int>,
        /// Scale words.
        scales: Tensor<B, 1, Int>,
    },
    /// In host memory, interleaved for the CPU kernels: shared, never copied.
    Host {
        weights: Arc<fornax_cpu::InterleavedWeights>,
        device: B::Device,
    },
}

/// A `[rows, cols]` block-quantized matrix: the packed words, nothing else (no FP32 copy).
#[derive(Debug, Clone)]
pub struct QuantMatrix<B: Backend> {
    /// The GGUF block type.
    pub ggml_type: GgmlType,
    /// Rows (outputs).
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// The words.
    pub store: QuantStore<B>,
}

fn words<B: Backend>(words: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let bits: Vec<i32> = words.iter().map(|&w| w as i32).collect();
    Tensor::from_data(TensorData::new(bits, [words.len()]), device)
}

impl<B: QuantOps> QuantMatrix<B> {
    /// Places a packed matrix where `B`'s kernels read it ([`QuantOps::quant_on_host`]).
    pub fn upload(packed: &PackedMatrix, device: &B::Device) -> Self {
        Self::from_packed(packed.clone(), device)
    }

    /// As [`QuantMatrix::upload`], taking `packed` (dropped once placed). Panics for a type
    /// without kernels on this backend.
    pub fn from_packed(packed: PackedMatrix, device: &B::Device) -> Self {
        let (ggml_type, rows, cols) = (packed.ggml_type, packed.rows, packed.cols);
        assert!(
            B::has_kernels_for(ggml_type) || super::format_code(ggml_type).is_some(),
            "no kernels for {ggml_type:?} weights on this backend"
        );
        let store = if B::quant_on_host() {
            QuantStore::Host {
                weights: Arc::new(fornax_cpu::InterleavedWeights::new(&packed.cpu_view())),
                device: device.clone(),
            }
        } else {
            let (quants, scales) = packed.device_words();
            QuantStore::Device {
                quants: words(&quants, device),
                scales: words(&scales, device),
            }
        };
        Self {
            ggml_type,
            rows,
            cols,
            store,
        }
    }
}

impl<B: Backend> QuantMatrix<B> {
    /// The words on the device (code words, scale words); `None` when held on the host.
    pub fn device_words(&self) -> Option<(&WordTensor<B>, &WordTensor<B>)> {
        match &self.store {
            QuantStore::Device { quants, scales } => Some((quants, scales)),
            QuantStore::Host { .. } => None,
        }
    }

    /// The interleaved blocks in host memory; `None` when held on the device.
    pub fn host(&self) -> Option<&fornax_cpu::InterleavedWeights> {
        match &self.store {
            QuantStore::Host { weights, .. } => Some(weights),
            QuantStore::Device { .. } => None,
        }
    }

    /// The device the matrix belongs to.
    pub fn device(&self) -> B::Device {
        match &self.store {
            QuantStore::Device { quants, .. } => quants.device(),
            QuantStore::Host { device, .. } => device.clone(),
        }
    }

    /// The packed words, read back from the device if they live there.
    pub fn download(&self) -> PackedMatrix {
        let (quants, scales) = match &self.store {
            QuantStore::Host { weights, .. } => {
                let blocks = weights.to_row_major();
                return PackedMatrix::from_blocks(
                    self.ggml_type,
                    self.rows,
                    self.cols,
                    &blocks.codes,
                    &blocks.scales,
                    &blocks.supers,
                );
            }
            QuantStore::Device { quants, scales } => (quants, scales),
        };
        let host = |t: &Tensor<B, 1, Int>| -> Vec<u32> {
            let data = crate::device_counts::read_back(t.clone()).convert::<i32>();
            data.iter::<i32>().map(|w| w as u32).collect()
        };
        PackedMatrix::from_device_words(
            self.ggml_type,
            self.rows,
            self.cols,
            host(quants),
            host(scales),
        )
    }

    /// Bytes the words take (on a device with 32-bit integers, or in host memory).
    pub fn bytes(&self) -> usize {
        match &self.store {
            QuantStore::Device { quants, scales } => 4 * (quants.dims()[0] + scales.dims()[0]),
            QuantStore::Host { weights, .. } => weights.bytes(),
        }
    }
}
