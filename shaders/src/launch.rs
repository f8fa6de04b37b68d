//! Launching the kernels on burn's CubeCL backends (wgpu, CUDA) from burn tensors.

use burn_cubecl::{
    kernel::into_contiguous, ops::numeric::empty_device_dtype, tensor::CubeTensor, CubeRuntime,
};
use cubecl::prelude::*;

use crate::paged_attention::{paged_decode, paged_prefill, TierArenasLaunch, BLOCK_TOKENS};

/// The K or V arenas of one layer as device tensors (see [`crate::paged_attention`]).
pub struct ArenaTensors<R: CubeRuntime> {
    pub f32_rows: CubeTensor<R>,
    pub f16_rows: CubeTensor<R>,
    pub f16_scales: CubeTensor<R>,
    pub i8_rows: CubeTensor<R>,
    pub i8_scales: CubeTensor<R>,
}

impl<R: CubeRuntime> ArenaTensors<R> {
    fn into_arg(self) -> TierArenasLaunch<R> {
        let arg = |t: CubeTensor<R>| into_contiguous(t).into_array_arg();
        TierArenasLaunch::new(
            arg(self.f32_rows),
            arg(self.f16_rows),
            arg(self.f16_scales),
            arg(self.i8_rows),
            arg(self.i8_scales),
        )
    }
}

/// Shape of one attention call: heads, head size and the table width.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Columns of the block-table tensor (entries per sequence).
    pub max_blocks: usize,
}

impl AttentionShape {
    fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }
}

fn output_like<R: CubeRuntime>(q: &CubeTensor<R>) -> CubeTensor<R> {
    empty_device_dtype(
        q.client.clone(),
        q.device.clone(),
        q.meta.shape().clone(),
        q.dtype,
    )
}

/// Decode attention for `q` `[rows, n_heads * head_dim]`: row `r` belongs to sequence
/// `row_seq[r]` and sits at position `row_pos[r]`, attending to keys `0..=row_pos[r]`.
#[allow(clippy::too_many_arguments)]
pub fn decode<R: CubeRuntime>(
    q: CubeTensor<R>,
    keys: ArenaTensors<R>,
    values: ArenaTensors<R>,
    tables: CubeTensor<R>,
    row_seq: CubeTensor<R>,
    row_pos: CubeTensor<R>,
    shape: AttentionShape,
) -> CubeTensor<R> {
    let q = into_contiguous(q);
    let rows = q.meta.shape()[0];
    let out = output_like(&q);
    paged_decode::launch::<R>(
        &q.client.clone(),
        CubeCount::Static(rows as u32, shape.n_kv_heads as u32, 1),
        CubeDim::new_1d(BLOCK_TOKENS as u32),
        q.into_array_arg(),
        keys.into_arg(),
        values.into_arg(),
        into_contiguous(tables).into_array_arg(),
        into_contiguous(row_seq).into_array_arg(),
        into_contiguous(row_pos).into_array_arg(),
        out.clone().into_array_arg(),
        shape.max_blocks as u32,
        shape.n_kv_heads as u32,
        shape.scale(),
        shape.head_dim,
        shape.group(),
    );
    out
}

/// Causal prefill attention for `q` `[rows, n_heads * head_dim]` split into query tiles:
/// tile `t` covers rows `tile_row[t]..tile_row[t] + tile_len[t]` (at most 32) of sequence
/// `tile_seq[t]`, the first at position `tile_pos[t]`.
#[allow(clippy::too_many_arguments)]
pub fn prefill<R: CubeRuntime>(
    q: CubeTensor<R>,
    keys: ArenaTensors<R>,
    values: ArenaTensors<R>,
    tables: CubeTensor<R>,
    tiles: [CubeTensor<R>; 4],
    shape: AttentionShape,
) -> CubeTensor<R> {
    let q = into_contiguous(q);
    let n_tiles = tiles[0].meta.shape()[0];
    let out = output_like(&q);
    let [tile_seq, tile_row, tile_pos, tile_len] =
        tiles.map(|t| into_contiguous(t).into_array_arg());
    paged_prefill::launch::<R>(
        &q.client.clone(),
        CubeCount::Static(n_tiles as u32, shape.n_heads as u32, 1),
        CubeDim::new_1d(BLOCK_TOKENS as u32),
        q.into_array_arg(),
        keys.into_arg(),
        values.into_arg(),
        into_contiguous(tables).into_array_arg(),
        tile_seq,
        tile_row,
        tile_pos,
        tile_len,
        out.clone().into_array_arg(),
        shape.max_blocks as u32,
        shape.n_kv_heads as u32,
        shape.scale(),
        shape.head_dim,
        shape.group(),
    );
    out
}
