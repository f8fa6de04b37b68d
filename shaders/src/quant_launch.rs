//! Launching the quantized-weight kernels on burn's CubeCL backends from burn tensors.

use burn_backend::DType;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::features::Plane;
use cubecl::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::alloc::{empty_on, placeholder};
use crate::epilogue::{finish_product, out_width, GEGLU, RESIDUAL, ROPE_KV, STORE, SWIGLU};
use crate::float::{contiguous_f32, with_float, with_floats};
use crate::quant_matmul::{
    quant_matmul, quant_matvec, quant_rows, MATVEC_MAX_TOKENS, QBLOCK, TILE_ROWS, TILE_TOKENS,
    TILE_UNITS, VECTOR,
};

/// A block-quantized matrix on the device (layout in [`crate::quant_matmul`]).
pub struct QuantTensors<R: CubeRuntime> {
    /// Code words.
    pub quants: CubeTensor<R>,
    /// Scale words.
    pub scales: CubeTensor<R>,
    /// Format code ([`crate::quant_matmul::Q4_0`], `Q4_1` or `Q8_0`).
    pub format: u32,
    /// Output rows.
    pub rows: usize,
    /// Values per row (a multiple of 32).
    pub cols: usize,
}

/// How [`quant_matvec()`] spreads rows over units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatvecShape {
    /// Units sharing one row's blocks.
    pub lanes: usize,
    /// Rows per cube.
    pub rows_per_cube: usize,
    /// Rows each unit adds up (a divisor of `rows_per_cube`; even, or 1).
    pub rows_per_unit: usize,
    /// Whether the `lanes` units of a row group are one plane whose sums meet through
    /// plane operations, with no workgroup memory and no barrier (`rows_per_unit` even).
    pub planes: bool,
}

impl MatvecShape {
    /// One unit per row, 64 rows per cube: each unit walks its own row.
    pub const ROW_PER_UNIT: Self = Self {
        lanes: 1,
        rows_per_cube: 64,
        rows_per_unit: 1,
        planes: false,
    };
    /// 32 units per row, 4 rows per cube: a warp per row on NVIDIA GPUs, where the loads
    /// of neighbouring units coalesce.
    pub const WARP_PER_ROW: Self = Self {
        lanes: 32,
        rows_per_cube: 4,
        rows_per_unit: 1,
        planes: false,
    };

    /// The shape for `tokens` tokens on this device ([`MatvecShape::for_limits`] of its
    /// [`MatvecDevice`]).
    pub fn for_device<R: CubeRuntime>(client: &ComputeClient<R>, tokens: usize) -> Self {
        Self::for_limits(MatvecDevice::of(client), tokens)
    }

    /// The shape for `tokens` tokens on a device with these limits.
    ///
    /// - GPUs: one warp per row, 4 rows per cube.
    /// - CPU-like devices ([`MatvecDevice::cpu_like`]): 8 lanes share the blocks of several
    ///   rows, each lane reading a block's inputs once for all of them (rows times the
    ///   compiled token bound: [`CPU_ROWS_TIMES_TOKENS`] on lavapipe,
    ///   [`SOFTWARE_ROWS_TIMES_TOKENS`] on a browser's fallback adapter; at least 2 rows),
    ///   and as many rows per cube as keep the partial sums within 16 KiB of workgroup
    ///   memory (WebGPU's guarantee) and the units within the device's limit. On lavapipe
    ///   every load is a loop over the SIMD lanes, so reading the inputs once per 16 rows
    ///   instead of once per row made one token's products 3-4x faster (3072 x 576 Q4_1:
    ///   8.4-10.3 ms against 2.5-3.9 ms).
    pub fn for_limits(device: MatvecDevice, tokens: usize) -> Self {
        if !device.cpu_like() {
            return Self::WARP_PER_ROW;
        }
        let lanes = 8;
        let bound = matvec_bound(tokens);
        let rows_times_tokens = match device.software {
            true => SOFTWARE_ROWS_TIMES_TOKENS,
            false => CPU_ROWS_TIMES_TOKENS,
        };
        let rows_per_unit = (rows_times_tokens / bound).max(2);
        let planes = device.planes_of(lanes);
        let budget = device.max_shared.min(16 * 1024);
        // Partial sums (`lanes` per row and token) and totals (one per row and token);
        // none with planes, where the units only have to fit the device.
        let per_row = match planes {
            true => 0,
            false => bound * (lanes + 1) * std::mem::size_of::<f32>(),
        };
        let mut rows_per_cube = 128;
        while rows_per_cube > rows_per_unit
            && (rows_per_cube * per_row > budget
                || rows_per_cube / rows_per_unit * lanes > device.max_units)
        {
            rows_per_cube /= 2;
        }
        Self {
            lanes,
            rows_per_cube,
            rows_per_unit,
            planes,
        }
    }
}

/// What [`MatvecShape::for_limits`] reads of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatvecDevice {
    /// The widest plane (warp, subgroup) the device reports: 8 on lavapipe, 32 on NVIDIA
    /// GPUs, and 128 on WebGPU, which tells nothing of planes (cubecl's assumption).
    pub plane_size_max: usize,
    /// Bytes of workgroup memory one cube may use.
    pub max_shared: usize,
    /// Units one cube may have (256 on WebGPU, 1,024 on lavapipe).
    pub max_units: usize,
    /// Whether the adapter was declared a software one ([`declare_software_adapter`]).
    pub software: bool,
    /// The plane width when every plane has it and plane operations work on the device:
    /// cubecl's plane feature, or [`declare_planes`] (cubecl leaves the feature off on
    /// CPU adapters such as lavapipe, whose subgroups are 8 lanes wide). 0 otherwise.
    pub plane_ops: usize,
}

impl MatvecDevice {
    /// The limits of `client`'s device.
    pub fn of<R: CubeRuntime>(client: &ComputeClient<R>) -> Self {
        let hardware = &client.properties().hardware;
        Self {
            plane_size_max: hardware.plane_size_max as usize,
            max_shared: hardware.max_shared_memory_size,
            max_units: hardware.max_units_per_cube as usize,
            software: SOFTWARE_ADAPTER.load(Ordering::Relaxed),
            plane_ops: match client.properties().features.plane.contains(Plane::Ops) {
                true if hardware.plane_size_min == hardware.plane_size_max => {
                    hardware.plane_size_max as usize
                }
                _ => DECLARED_PLANES.load(Ordering::Relaxed),
            },
        }
    }

    /// Whether `lanes` units can add up their sums through plane operations: planes of
    /// exactly that width.
    pub fn planes_of(&self, lanes: usize) -> bool {
        self.plane_ops == lanes
    }

    /// Whether the device reports planes narrower than a GPU's 32 lanes (lavapipe: 8).
    pub fn narrow_planes(&self) -> bool {
        self.plane_size_max < 32
    }

    /// Whether the device computes on CPU cores: narrow planes (lavapipe) or a declared
    /// software adapter.
    pub fn cpu_like(&self) -> bool {
        self.narrow_planes() || self.software
    }
}

/// Set by [`declare_software_adapter`].
static SOFTWARE_ADAPTER: AtomicBool = AtomicBool::new(false);

/// Set by [`declare_planes`].
static DECLARED_PLANES: AtomicUsize = AtomicUsize::new(0);

/// Set by [`tile_many_tokens_everywhere`].
static TILED_EVERYWHERE: AtomicBool = AtomicBool::new(false);

/// Declares that this process's wgpu device runs plane (subgroup) operations on planes of
/// exactly `width` lanes, where cubecl does not say so itself: it leaves its plane feature
/// off on CPU adapters, yet lavapipe's subgroups (8 lanes) run them. On lavapipe the
/// products' sums then meet without workgroup memory or barriers, which LLVM compiles
/// 2-3x faster (a barrier makes a shader a coroutine) and which runs as fast or faster.
pub fn declare_planes(width: usize) {
    DECLARED_PLANES.store(width, Ordering::Relaxed);
}

/// Declares that this process's WebGPU adapter computes on the CPU: a browser's fallback
/// adapter (Chromium's SwiftShader). WebGPU reports no plane size, so without this the
/// products would take a GPU's warp-per-row shape, which left most of SwiftShader's lanes
/// idle (rows of 18 blocks over 32 lanes).
pub fn declare_software_adapter() {
    SOFTWARE_ADAPTER.store(true, Ordering::Relaxed);
}

/// The token bound [`quant_matvec()`] is compiled for at `tokens` tokens: 1, 2, 4 or 8.
fn matvec_bound(tokens: usize) -> usize {
    tokens.max(1).next_power_of_two()
}

/// Rows times compiled tokens one unit adds up on CPU-like devices. The unrolled body
/// grows with both, and lavapipe's compile time faster still: at 4 tokens, 2 / 4 / 8 / 16
/// rows per unit compiled in 0.6 / 1.3 / 3.7 / 16.7 s (3072 x 576 Q4_1, empty shader
/// cache) and ran in 15.4 / 9.7 / 6.5 / 5.1 ms. 16 keeps every variant near a second.
/// (Measured with the sums meeting in workgroup memory; through planes, where lavapipe has
/// them, the default shapes compile 2-3x faster.)
pub const CPU_ROWS_TIMES_TOKENS: usize = 16;

/// Rows times compiled tokens on a browser's fallback adapter (SwiftShader in headless
/// Chromium). There 16 rows per unit lost the device (the first product failed to map its
/// output), while 2 and 4 rows decoded at 0.52-0.54 and 0.54-0.68 tokens/s against
/// 0.25-0.29 with a warp per row.
pub const SOFTWARE_ROWS_TIMES_TOKENS: usize = 4;

/// Whether products over many tokens should go through the tiled kernel on this device.
/// On devices with planes narrower than 32 lanes (lavapipe) it is not, unless
/// [`tile_many_tokens_everywhere`] says so: there the tiled kernel measured about 2x
/// slower than FP32 matmul over rows dequantized by [`rows`] (64 tokens x 1536 x 576
/// Q4_1: 147 ms against 76 ms). A declared software adapter ([`declare_software_adapter`])
/// keeps the tiled kernel: the other way has not been measured in the browser.
pub fn tiled_for_many_tokens<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    TILED_EVERYWHERE.load(Ordering::Relaxed) || !MatvecDevice::of(client).narrow_planes()
}

/// Makes this process multiply more than [`MATVEC_MAX_TOKENS`] tokens with the tiled
/// kernel on every device (`true`), its epilogue fused as on GPUs, so that a decode step
/// of many sequences launches as few kernels as one of a single sequence; `false`
/// restores each device's faster way ([`tiled_for_many_tokens`]). On lavapipe that costs
/// speed: 16 sequences decoded at 3.6 and 3.4 tokens/s against 6.6 and 4.5 (`bench case
/// --backend wgpu --sequences 16 --prompt-tokens 16 --gen-tokens 8`, with and without
/// `--tiled-products`, alternated; 2-core AMD EPYC, 2026-12-03).
pub fn tile_many_tokens_everywhere(on: bool) {
    TILED_EVERYWHERE.store(on, Ordering::Relaxed);
}

/// Whether a product over `tokens` tokens should be FP32 matmuls over dequantized rows
/// rather than our kernels on this device: more tokens than [`MATVEC_MAX_TOKENS`] where
/// the tiled kernel does not pay ([`tiled_for_many_tokens`]).
pub fn dequantize_for_many<R: CubeRuntime>(client: &ComputeClient<R>, tokens: usize) -> bool {
    tokens > MATVEC_MAX_TOKENS && !tiled_for_many_tokens(client)
}

fn output<R: CubeRuntime>(like: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    empty_on(like, shape, like.dtype)
}

/// A KV arena as the epilogue writes it: FP32 (see `fornax_engine::kv`).
fn arena<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    assert_eq!(t.dtype, DType::F32, "the KV arenas are FP32");
    t
}

/// Where Q, K and V go after a product over `[q | k | v]` rows (see
/// [`crate::epilogue::ROPE_KV`]).
pub struct RopeKv<R: CubeRuntime> {
    /// The layer's FP32 key arena `[slots * 32, kv_width]`, written in place.
    pub keys: CubeTensor<R>,
    /// The layer's FP32 value arena, written in place.
    pub values: CubeTensor<R>,
    /// Per token its position and its arena row, interleaved (32-bit integers).
    pub info: CubeTensor<R>,
    /// `[positions, head_dim]`: cos and sin of each rotation angle, interleaved.
    pub table: CubeTensor<R>,
    /// Width of Q.
    pub q_width: usize,
    /// Width of K and of V.
    pub kv_width: usize,
    /// Head dimension.
    pub head_dim: usize,
}

/// What a product does with its results before writing them (see [`crate::epilogue`]).
// Built once per launch and consumed by it: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Epilogue<R: CubeRuntime> {
    /// The product itself.
    Store,
    /// The product plus this `[tokens, rows]` residual (FP32: the residual stream).
    Residual(CubeTensor<R>),
    /// SwiGLU over gate and up rows interleaved: `[tokens, rows / 2]`.
    Swiglu,
    /// GeGLU over gate and up rows interleaved: `[tokens, rows / 2]`.
    Geglu,
    /// RoPE, Q out and K, V into the KV arenas: `[tokens, q_width]`.
    RopeKv(RopeKv<R>),
}

/// An epilogue's kernel arguments: mode, the four arrays and three sizes.
struct EpilogueArgs<R: CubeRuntime> {
    mode: u32,
    aux_a: CubeTensor<R>,
    aux_b: CubeTensor<R>,
    info: CubeTensor<R>,
    table: CubeTensor<R>,
    sizes: [u32; 3],
}

impl<R: CubeRuntime> Epilogue<R> {
    /// Arguments for a launch on `like`'s device; unused arrays are one-element
    /// placeholders. The residual, the arenas and the table are FP32.
    fn args(self, like: &CubeTensor<R>) -> EpilogueArgs<R> {
        let f32s = || placeholder(like);
        let none = |mode, aux_a| EpilogueArgs {
            mode,
            aux_a,
            aux_b: f32s(),
            info: empty_on(like, [1], DType::U32),
            table: f32s(),
            sizes: [0; 3],
        };
        match self {
            Epilogue::Store => none(STORE, f32s()),
            Epilogue::Residual(r) => none(RESIDUAL, contiguous_f32(r)),
            Epilogue::Swiglu => none(SWIGLU, f32s()),
            Epilogue::Geglu => none(GEGLU, f32s()),
            Epilogue::RopeKv(r) => EpilogueArgs {
                mode: ROPE_KV,
                aux_a: arena(r.keys),
                aux_b: arena(r.values),
                info: into_contiguous(r.info),
                table: contiguous_f32(r.table),
                sizes: [r.q_width as u32, r.kv_width as u32, r.head_dim as u32],
            },
        }
    }

    /// The output's dtype for input of dtype `x`: FP32 where it feeds the residual stream
    /// or a norm (the product itself, a residual add), `x`'s where it feeds the next
    /// product or attention (SwiGLU, GeGLU, Q after RoPE).
    fn out_dtype(&self, x: DType) -> DType {
        match self {
            Epilogue::Store | Epilogue::Residual(_) => DType::F32,
            Epilogue::Swiglu | Epilogue::Geglu | Epilogue::RopeKv(_) => x,
        }
    }

    fn q_width(&self) -> usize {
        match self {
            Epilogue::RopeKv(r) => r.q_width,
            _ => 0,
        }
    }

    fn mode(&self) -> u32 {
        match self {
            Epilogue::Store => STORE,
            Epilogue::Residual(_) => RESIDUAL,
            Epilogue::Swiglu => SWIGLU,
            Epilogue::Geglu => GEGLU,
            Epilogue::RopeKv(_) => ROPE_KV,
        }
    }
}

/// Storage buffers a product with an epilogue binds: input, codes, scales, output, the
/// epilogue's four arrays and CubeCL's metadata.
const EPILOGUE_BUFFERS: u32 = 9;

/// Whether the products with an epilogue can be bound on this device (WebGPU guarantees
/// only 8 storage buffers per kernel; Chromium allows 10).
pub fn epilogue_fits<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    // `max_bindings` is the device's limit less one that wgpu may use itself.
    client.properties().hardware.max_bindings >= EPILOGUE_BUFFERS - 1
}

/// Applies `epilogue` to a product computed elsewhere (`product` `[tokens, rows]`): one
/// dispatch.
pub fn finish<R: CubeRuntime>(product: CubeTensor<R>, epilogue: Epilogue<R>) -> CubeTensor<R> {
    let product = into_contiguous(product);
    let [tokens, rows] = [product.meta.shape()[0], product.meta.shape()[1]];
    let width = out_width(epilogue.mode(), rows, epilogue.q_width());
    let out_dtype = epilogue.out_dtype(product.dtype);
    let out = empty_on(&product, [tokens, width], out_dtype);
    if tokens == 0 {
        return out;
    }
    let a = epilogue.args(&product);
    let units = 256;
    let work = tokens * rows.div_ceil(2);
    with_floats!(product.dtype, out_dtype, P, O => finish_product::launch::<P, O, R>(
        &product.client.clone(),
        CubeCount::Static(work.div_ceil(units) as u32, 1, 1),
        CubeDim::new_1d(units as u32),
        product.into_array_arg(),
        out.clone().into_array_arg(),
        a.aux_a.into_array_arg(),
        a.aux_b.into_array_arg(),
        a.info.into_array_arg(),
        a.table.into_array_arg(),
        rows as u32,
        tokens as u32,
        a.sizes[0],
        a.sizes[1],
        a.sizes[2],
        a.mode,
    ));
    out
}

/// `x @ W^T` for `x` `[tokens, cols]` (FP32, FP16 or BF16): FP32: `[tokens, rows]`. Up to
/// [`MATVEC_MAX_TOKENS`] tokens go through the matrix-vector kernel (laid out as `matvec`,
/// or as [`MatvecShape::for_device`]), more through the tiled kernel.
pub fn matmul<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: &QuantTensors<R>,
    matvec: Option<MatvecShape>,
) -> CubeTensor<R> {
    matmul_then(x, w, matvec, Epilogue::Store)
}

/// [`matmul`] with `epilogue` applied in the same kernel: one dispatch.
pub fn matmul_then<R: CubeRuntime>(
    x: CubeTensor<R>,
    w: &QuantTensors<R>,
    matvec: Option<MatvecShape>,
    epilogue: Epilogue<R>,
) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let tokens = x.meta.shape()[0];
    assert_eq!(
        x.meta.shape()[1],
        w.cols,
        "input width must equal the weight's columns"
    );
    let width = out_width(epilogue.mode(), w.rows, epilogue.q_width());
    let out_dtype = epilogue.out_dtype(x.dtype);
    let out = empty_on(&x, [tokens, width], out_dtype);
    if tokens == 0 {
        return out;
    }
    let a = epilogue.args(&x);
    let client = x.client.clone();
    let matvec = matvec.unwrap_or_else(|| MatvecShape::for_device(&client, tokens));
    let dtype = x.dtype;
    let (quants, scales) = (
        into_contiguous(w.quants.clone()).into_array_arg(),
        into_contiguous(w.scales.clone()).into_array_arg(),
    );
    if tokens <= MATVEC_MAX_TOKENS {
        assert!(
            !matvec.planes || matvec.rows_per_unit.is_multiple_of(2),
            "planes finish pairs of rows a unit holds: an even number of rows per unit"
        );
        let bound = matvec_bound(tokens);
        with_floats!(dtype, out_dtype, X, O => quant_matvec::launch::<X, O, R>(
            &client,
            CubeCount::Static(w.rows.div_ceil(matvec.rows_per_cube) as u32, 1, 1),
            CubeDim::new_2d(
                matvec.lanes as u32,
                (matvec.rows_per_cube / matvec.rows_per_unit) as u32,
            ),
            VECTOR,
            x.into_array_arg(),
            quants,
            scales,
            out.clone().into_array_arg(),
            a.aux_a.into_array_arg(),
            a.aux_b.into_array_arg(),
            a.info.into_array_arg(),
            a.table.into_array_arg(),
            w.rows as u32,
            w.cols as u32,
            tokens as u32,
            a.sizes[0],
            a.sizes[1],
            a.sizes[2],
            w.format,
            bound,
            matvec.lanes,
            matvec.rows_per_cube,
            matvec.rows_per_unit,
            matvec.planes,
            a.mode,
        ));
    } else {
        with_floats!(dtype, out_dtype, X, O => quant_matmul::launch::<X, O, R>(
            &client,
            CubeCount::Static(
                w.rows.div_ceil(TILE_ROWS) as u32,
                tokens.div_ceil(TILE_TOKENS) as u32,
                1,
            ),
            CubeDim::new_2d(TILE_UNITS as u32, TILE_UNITS as u32),
            x.into_array_arg(),
            quants,
            scales,
            out.clone().into_array_arg(),
            a.aux_a.into_array_arg(),
            a.aux_b.into_array_arg(),
            a.info.into_array_arg(),
            a.table.into_array_arg(),
            w.rows as u32,
            w.cols as u32,
            tokens as u32,
            a.sizes[0],
            a.sizes[1],
            a.sizes[2],
            w.format,
            a.mode,
            dtype != DType::F32,
        ));
    }
    out
}

/// Rows `ids` of `W`, dequantized: `[ids, cols]` in `like`'s float dtype.
pub fn rows<R: CubeRuntime>(
    ids: CubeTensor<R>,
    w: &QuantTensors<R>,
    like: &CubeTensor<R>,
) -> CubeTensor<R> {
    let ids = into_contiguous(ids);
    let n = ids.meta.shape()[0];
    let out = output(like, [n, w.cols]);
    if n == 0 {
        return out;
    }
    let blocks = w.cols / QBLOCK;
    with_float!(out.dtype, F => quant_rows::launch::<F, R>(
        &ids.client.clone(),
        CubeCount::Static(blocks.div_ceil(QBLOCK) as u32, n as u32, 1),
        CubeDim::new_1d(QBLOCK as u32),
        ids.into_array_arg(),
        into_contiguous(w.quants.clone()).into_array_arg(),
        into_contiguous(w.scales.clone()).into_array_arg(),
        out.clone().into_array_arg(),
        w.cols as u32,
        w.format,
    ));
    out
}
