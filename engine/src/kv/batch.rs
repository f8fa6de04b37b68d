//! A ragged batch as the attention kernels see it: rows of many sequences, their block
//! tables, and where each new token's keys and values are written.

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use fornax_shaders::launch::DecodeKernel;

use super::{store::ids, BLOCK_TOKENS, TIER_SHIFT};

/// One sequence's part of a batch.
#[derive(Debug, Clone)]
pub struct BatchSeq {
    /// First row of this sequence in the batch's `[rows, ..]` activations.
    pub row_start: usize,
    /// New tokens (rows) of this sequence.
    pub rows: usize,
    /// Tokens already cached: the first new token's row in the sequence's blocks.
    pub start: usize,
    /// Position of the first new token (for RoPE): `start` plus any tokens an elastic
    /// window dropped.
    pub position: usize,
    /// Block-table entries (`tier << 28 | slot`), covering `start + rows` tokens.
    pub table: Vec<u32>,
}

impl BatchSeq {
    /// Keys visible to this sequence's last row.
    pub fn total(&self) -> usize {
        self.start + self.rows
    }
}

/// Host and device descriptions of one forward pass over the paged cache.
#[derive(Debug, Clone)]
pub struct PagedBatch<B: Backend> {
    pub seqs: Vec<BatchSeq>,
    /// Use the CubeCL kernels where the backend has them (else the burn reference path).
    pub kernels: bool,
    /// Run layers whose weights are joined as the fused kernels (set by the model where
    /// the backend can bind them).
    pub fused: bool,
    /// Per new row its RoPE position and FP32 arena row, interleaved (the fused kernels'
    /// one binding for both).
    pub rope_rows: Tensor<B, 1, Int>,
    /// FP32 arena row of each new token.
    pub write_rows: Tensor<B, 1, Int>,
    /// Position of each row (for RoPE).
    pub positions: Tensor<B, 1, Int>,
    /// Row of each new token in its sequence's cache: it attends to keys `0..=row`.
    pub key_rows: Tensor<B, 1, Int>,
    /// `[n_seqs, max_blocks]` block tables, zero-padded.
    pub tables: Tensor<B, 2, Int>,
    pub max_blocks: usize,
    /// Sequence index of each row (decode kernel).
    pub row_seq: Tensor<B, 1, Int>,
    /// Query tiles of at most 32 rows, four words each: sequence, first row, first key
    /// row, rows.
    pub tiles: Tensor<B, 1, Int>,
    /// Whether every block of the batch is FP32, so the kernels may bind only the FP32
    /// arenas: they do where the device cannot bind every tier (browsers), or always with
    /// `f32_bindings`.
    pub all_f32: bool,
    pub f32_bindings: bool,
    /// The decode attention kernel to run (`None`: the device's own choice); tests set it
    /// to run both kernels on one device.
    pub decode_kernel: Option<DecodeKernel>,
    /// Whether every sequence has exactly one new row.
    pub decode_only: bool,
    /// The same rows over the sliding pool, for windowed layers (when there is one).
    pub sliding: Option<Box<PagedBatch<B>>>,
}

impl<B: Backend> PagedBatch<B> {
    /// Uploads the description of `seqs` with their FP32 `write_rows`.
    pub fn new(seqs: Vec<BatchSeq>, write_rows: &[u32], kernels: bool, device: &B::Device) -> Self {
        let mut rope_rows = Vec::with_capacity(2 * write_rows.len());
        let max_blocks = seqs.iter().map(|s| s.table.len()).max().unwrap_or(1).max(1);
        let mut tables = vec![0u32; seqs.len() * max_blocks];
        let mut positions = Vec::new();
        let mut key_rows = Vec::new();
        let mut row_seq = Vec::new();
        let mut tiles: Vec<u32> = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            tables[i * max_blocks..i * max_blocks + s.table.len()].copy_from_slice(&s.table);
            positions.extend((s.position..s.position + s.rows).map(|p| p as u32));
            for (r, p) in (s.position..s.position + s.rows).enumerate() {
                rope_rows.extend([p as u32, write_rows[s.row_start + r]]);
            }
            key_rows.extend((s.start..s.total()).map(|p| p as u32));
            row_seq.extend(std::iter::repeat_n(i as u32, s.rows));
            for first in (0..s.rows).step_by(BLOCK_TOKENS) {
                tiles.extend([
                    i as u32,
                    (s.row_start + first) as u32,
                    (s.start + first) as u32,
                    (s.rows - first).min(BLOCK_TOKENS) as u32,
                ]);
            }
        }
        let v: Vec<i64> = tables.iter().map(|&x| i64::from(x)).collect();
        let tables = Tensor::from_data(TensorData::new(v, [seqs.len(), max_blocks]), device);
        Self {
            decode_only: seqs.iter().all(|s| s.rows == 1),
            all_f32: seqs
                .iter()
                .all(|s| s.table.iter().all(|&e| e >> TIER_SHIFT == 0)),
            f32_bindings: false,
            decode_kernel: None,
            kernels,
            fused: false,
            write_rows: ids(write_rows, device),
            rope_rows: ids(&rope_rows, device),
            positions: ids(&positions, device),
            key_rows: ids(&key_rows, device),
            tables,
            max_blocks,
            row_seq: ids(&row_seq, device),
            tiles: ids(&tiles, device),
            seqs,
            sliding: None,
        }
    }

    /// The batch a layer attends over: the sliding pool's for windowed layers.
    pub fn for_layer(&self, sliding: bool) -> &PagedBatch<B> {
        match &self.sliding {
            Some(windowed) if sliding => windowed,
            _ => self,
        }
    }
}
