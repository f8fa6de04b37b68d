//! Launching the kernels on burn's CubeCL backends (wgpu, CUDA) from burn tensors.

use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::alloc::output_like;
use crate::float::with_float;
use crate::paged_attention::{
    paged_decode, paged_decode_unit_keys, paged_prefill, F32Rows, F32RowsLaunch, TierArenas,
    TierArenasLaunch, BLOCK_TOKENS, UNIT_KEYS_UNITS,
};
use crate::quant_launch::MatvecDevice;

/// The K or V arenas of one layer as device tensors (see [`crate::paged_attention`]).
pub struct ArenaTensors<R: CubeRuntime> {
    pub f32_rows: CubeTensor<R>,
    pub f16_rows: CubeTensor<R>,
    pub f16_scales: CubeTensor<R>,
    pub i8_rows: CubeTensor<R>,
    pub i8_scales: CubeTensor<R>,
}

/// Storage buffers the kernels bind besides the K and V arenas: queries, tables, the row
/// or tile description, the output and CubeCL's metadata.
const OTHER_BUFFERS: u32 = 6;

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

/// Whether the kernels can read K and V of every tier on this device: they bind 16
/// storage buffers, more than browsers allow (10 in Chromium); the FP32-only kernels
/// ([`KvArenas::F32`]) bind 8.
pub fn tiers_fit<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    // `max_bindings` is the device's limit less one that wgpu may use itself.
    client.properties().hardware.max_bindings >= 2 * 5 + OTHER_BUFFERS - 1
}

/// The K and V a kernel reads: every tier, or only the FP32 arenas when every block of
/// the batch is FP32.
// Built once per launch and consumed by it: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum KvArenas<R: CubeRuntime> {
    Tiers {
        keys: ArenaTensors<R>,
        values: ArenaTensors<R>,
    },
    F32 {
        keys: CubeTensor<R>,
        values: CubeTensor<R>,
    },
}

/// Launches `$kernel` for queries and output of type `$F` with the K/V binding `$kv`
/// holds, between the arguments before and after K and V (the same for both bindings).
macro_rules! launch_over {
    ($kernel:ident, $F:ty, $kv:expr, ($($pre:expr),*), ($($post:expr),*)) => {
        match $kv {
            KvArenas::Tiers { keys, values } => $kernel::launch::<$F, TierArenas, R>(
                $($pre,)* keys.into_arg(), values.into_arg(), $($post),*
            ),
            KvArenas::F32 { keys, values } => $kernel::launch::<$F, F32Rows, R>(
                $($pre,)*
                F32RowsLaunch::new(into_contiguous(keys).into_array_arg()),
                F32RowsLaunch::new(into_contiguous(values).into_array_arg()),
                $($post),*
            ),
        }
    };
}

/// Shape of one attention call: heads, head size and the table width.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Columns of the block-table tensor (entries per sequence).
    pub max_blocks: usize,
    /// Keys a query sees, itself included (`None`: every earlier key).
    pub window: Option<usize>,
}

impl AttentionShape {
    fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }

    /// The kernels' `window` argument: 0 for none.
    fn window_arg(&self) -> u32 {
        self.window.map_or(0, |w| w as u32)
    }
}

/// Which decode attention kernel a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// [`paged_decode()`]: 32 units share each tile of keys through workgroup memory (GPUs).
    Tiles,
    /// [`paged_decode_unit_keys()`]: 8 units each take every 8th key, in registers (devices
    /// that compute on CPU cores).
    UnitKeys,
}

impl DecodeKernel {
    /// The kernel for `client`'s device.
    pub fn for_device<R: CubeRuntime>(client: &ComputeClient<R>) -> Self {
        Self::for_limits(MatvecDevice::of(client))
    }

    /// The kernel for a device with `device`'s limits.
    pub fn for_limits(device: MatvecDevice) -> Self {
        if device.cpu_like() {
            Self::UnitKeys
        } else {
            Self::Tiles
        }
    }
}

/// Decode attention for `q` `[rows, n_heads * head_dim]`: row `r` belongs to sequence
/// `row_seq[r]` and sits at position `row_pos[r]`, attending to keys `0..=row_pos[r]`
/// (the last `shape.window` of them where given).
/// `kernel` chooses the kernel ([`DecodeKernel::for_device`] where `None`).
#[allow(clippy::too_many_arguments)]
pub fn decode<R: CubeRuntime>(
    q: CubeTensor<R>,
    kv: KvArenas<R>,
    tables: CubeTensor<R>,
    row_seq: CubeTensor<R>,
    row_pos: CubeTensor<R>,
    shape: AttentionShape,
    kernel: Option<DecodeKernel>,
) -> CubeTensor<R> {
    let q = into_contiguous(q);
    let rows = q.meta.shape()[0];
    let out = output_like(&q);
    let client = q.client.clone();
    let kernel = kernel.unwrap_or_else(|| DecodeKernel::for_device(&client));
    let count = CubeCount::Static(rows as u32, shape.n_kv_heads as u32, 1);
    let units = match kernel {
        DecodeKernel::Tiles => BLOCK_TOKENS,
        DecodeKernel::UnitKeys => UNIT_KEYS_UNITS,
    };
    let dim = CubeDim::new_1d(units as u32);
    let (tables, row_seq, row_pos) = (
        into_contiguous(tables).into_array_arg(),
        into_contiguous(row_seq).into_array_arg(),
        into_contiguous(row_pos).into_array_arg(),
    );
    let (max_blocks, n_kv, scale) = (
        shape.max_blocks as u32,
        shape.n_kv_heads as u32,
        shape.scale(),
    );
    let dtype = q.dtype;
    let (q_arg, out_arg) = (q.into_array_arg(), out.clone().into_array_arg());
    // The two kernels take the same arguments.
    macro_rules! decode_with {
        ($kernel:ident, $F:ty) => {
            launch_over!(
                $kernel,
                $F,
                kv,
                (&client, count, dim, q_arg),
                (
                    tables,
                    row_seq,
                    row_pos,
                    out_arg,
                    max_blocks,
                    n_kv,
                    scale,
                    shape.window_arg(),
                    shape.head_dim,
                    shape.group()
                )
            )
        };
    }
    with_float!(dtype, F => match kernel {
        DecodeKernel::Tiles => decode_with!(paged_decode, F),
        DecodeKernel::UnitKeys => decode_with!(paged_decode_unit_keys, F),
    });
    out
}

/// Causal prefill attention for `q` `[rows, n_heads * head_dim]` split into query tiles:
/// `tiles` holds `[sequence, first row, first position, rows]` for each tile (at most 32
/// rows of one sequence).
pub fn prefill<R: CubeRuntime>(
    q: CubeTensor<R>,
    kv: KvArenas<R>,
    tables: CubeTensor<R>,
    tiles: CubeTensor<R>,
    shape: AttentionShape,
) -> CubeTensor<R> {
    let q = into_contiguous(q);
    let n_tiles = tiles.meta.shape()[0] / 4;
    let out = output_like(&q);
    let client = q.client.clone();
    let count = CubeCount::Static(n_tiles as u32, shape.n_heads as u32, 1);
    let dim = CubeDim::new_1d(BLOCK_TOKENS as u32);
    let (tables, tiles) = (
        into_contiguous(tables).into_array_arg(),
        into_contiguous(tiles).into_array_arg(),
    );
    let (max_blocks, n_kv, scale) = (
        shape.max_blocks as u32,
        shape.n_kv_heads as u32,
        shape.scale(),
    );
    let dtype = q.dtype;
    let (q_arg, out_arg) = (q.into_array_arg(), out.clone().into_array_arg());
    with_float!(dtype, F => launch_over!(
        paged_prefill,
        F,
        kv,
        (&client, count, dim, q_arg),
        (
            tables,
            tiles,
            out_arg,
            max_blocks,
            n_kv,
            scale,
            shape.window_arg(),
            shape.head_dim,
            shape.group()
        )
    ));
    out
}
