//! The quantized-weight kernels (CubeCL, on wgpu: lavapipe here) against
//! dequantize-then-matmul on random GGUF blocks of every format they read (Q4_0, Q4_1,
//! Q8_0, and the K-quants' groups: Q4_K as K4, Q6_K as K8), and the CPU backend's products
//! (our SIMD kernels) at the end.
//!
//! The reference decodes the original GGUF bytes with the GGUF reader's own decoder and
//! multiplies with burn's FP32 matmul on the same device; the kernels read the repacked
//! words. Both compute in FP32 over the same values and differ only in summation order and
//! fused multiply-adds, so the tolerance is relative to the size of the terms summed:
//! `|kernel - reference| <= 1e-5 * sum_c |x_c w_c|` (about 1e-6 is seen).

use burn_cubecl::cubecl::Runtime;
use burn_tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};
use burn_wgpu::WgpuRuntime;
use fornax_backends::{wgpu_device, CpuBackend as Cpu, WgpuBackend};
use fornax_engine::gguf::GgmlType;
use fornax_engine::quant::{format_code, PackedMatrix, QuantMatrix, QuantOps};
use fornax_shaders::launch::DecodeKernel;
use fornax_shaders::quant_launch::{self, MatvecDevice, MatvecShape, QuantTensors};
use half::f16;
use rand::{rngs::StdRng, Rng, SeedableRng};

type B = WgpuBackend;

const FORMATS: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q5_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
];

/// `cols` rounded up to whole blocks of `ty` (256 values for a K-quant).
fn whole(ty: GgmlType, cols: usize) -> usize {
    cols.next_multiple_of(ty.block_elements() as usize)
}

/// GGUF bytes of a `[rows, cols]` matrix with random scales and codes.
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    if ty.block_elements() == 256 {
        // K-quants: random bytes, then the super-block halves (`d`, and `dmin`) set.
        let bb = ty.block_bytes() as usize;
        let mut bytes: Vec<u8> = (0..rows * cols / 256 * bb).map(|_| rng.random()).collect();
        let halves: &[usize] = match ty {
            GgmlType::Q6_K => &[208],
            GgmlType::Q3_K => &[108],
            GgmlType::Q2_K => &[80, 82],
            _ => &[0, 2],
        };
        for block in bytes.chunks_exact_mut(bb) {
            for &at in halves {
                let h = f16::from_f32(rng.random_range(0.0005f32..0.01));
                block[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        return bytes;
    }
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = f16::from_f32(rng.random_range(0.002f32..0.05));
        bytes.extend(d.to_le_bytes());
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            bytes.extend(f16::from_f32(rng.random_range(-0.4f32..0.1)).to_le_bytes());
        }
        let codes = match ty {
            GgmlType::Q8_0 => 32,
            // The fifth bits, then the nibbles.
            GgmlType::Q5_0 | GgmlType::Q5_1 => 20,
            _ => 16,
        };
        bytes.extend((0..codes).map(|_| rng.random::<u8>()));
    }
    assert_eq!(
        bytes.len() as u64,
        ty.bytes_for((rows * cols) as u64).unwrap()
    );
    bytes
}

pub(crate) struct Case {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Dequantized by the GGUF decoder, `[rows, cols]`.
    pub(crate) values: Vec<f32>,
    pub(crate) weight: QuantMatrix<B>,
}

/// A `[rows, cols]` case (`cols` rounded up to whole blocks of `ty`).
pub(crate) fn case(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Case {
    let cols = whole(ty, cols);
    let device = wgpu_device().expect("a wgpu adapter").0;
    let mut rng = StdRng::seed_from_u64(seed);
    let bytes = random_blocks(ty, rows, cols, &mut rng);
    let mut values = vec![0.0f32; rows * cols];
    ty.dequantize(&bytes, &mut values);
    let packed = PackedMatrix::pack(ty, &bytes, rows, cols).expect("a kernel format");
    assert_eq!(
        packed.dequantize(),
        values,
        "repacked words decode as the file"
    );
    Case {
        ty,
        rows,
        cols,
        values,
        weight: QuantMatrix::upload(&packed, &device),
    }
}

pub(crate) fn host(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// Runs `tokens` random rows through the kernels (`shape` for the matrix-vector one, or
/// the device's default) and checks them against the reference; returns the worst error
/// relative to the tolerance.
fn check(c: &Case, tokens: usize, shape: Option<MatvecShape>) -> f32 {
    let device = wgpu_device().unwrap().0;
    let x: Tensor<B, 2> =
        Tensor::random([tokens, c.cols], Distribution::Uniform(-1.0, 1.0), &device);
    let w = Tensor::<B, 2>::from_data(TensorData::new(c.values.clone(), [c.rows, c.cols]), &device);
    let reference = host(x.clone().matmul(w.transpose()));
    let tensors = QuantTensors {
        quants: c.weight.device_words().unwrap().0.clone().into_primitive(),
        scales: c.weight.device_words().unwrap().1.clone().into_primitive(),
        format: format_code(c.ty).unwrap(),
        rows: c.rows,
        cols: c.cols,
    };
    let out = quant_launch::matmul(x.clone().into_primitive().tensor(), &tensors, shape);
    let kernel = host(Tensor::from_primitive(TensorPrimitive::Float(out)));
    let xs = host(x);
    let mut worst = 0.0f32;
    for t in 0..tokens {
        for r in 0..c.rows {
            let scale: f32 = (0..c.cols)
                .map(|k| (xs[t * c.cols + k] * c.values[r * c.cols + k]).abs())
                .sum();
            let diff = (kernel[t * c.rows + r] - reference[t * c.rows + r]).abs();
            worst = worst.max(diff / (1e-5 * scale));
        }
    }
    eprintln!(
        "{:?} [{} x {}], {tokens} tokens, {}: worst error {:.3} of the tolerance",
        c.ty,
        c.rows,
        c.cols,
        match (tokens, shape) {
            (9.., _) => "tiled".to_string(),
            (_, Some(s)) => format!("matvec {} lanes x {} rows", s.lanes, s.rows_per_unit),
            (_, None) => "matvec (device default)".to_string(),
        },
        worst
    );
    assert!(worst <= 1.0, "{:?} {tokens} tokens: {worst}", c.ty);
    worst
}

#[test]
fn matvec_kernel_matches_dequantize_then_matmul() {
    let _shared = crate::common::wgpu_shared();
    let client = WgpuRuntime::client(&wgpu_device().unwrap().0);
    let shapes = [
        MatvecShape::ROW_PER_UNIT,
        MatvecShape::WARP_PER_ROW,
        // Several rows per unit, the last unit partly past the last row.
        MatvecShape {
            lanes: 1,
            rows_per_cube: 32,
            rows_per_unit: 2,
            planes: false,
        },
        // Through planes where the device has 8-lane ones (lavapipe); the fallback
        // adapter's shapes below take workgroup memory.
        MatvecShape {
            lanes: 8,
            rows_per_cube: 32,
            rows_per_unit: 4,
            planes: MatvecDevice::of(&client).planes_of(8),
        },
    ];
    for (i, ty) in FORMATS.into_iter().enumerate() {
        // A format only changes how a block's codes decode, which every shape and token
        // count shares; each (format, shape, tokens) is a shader lavapipe compiles from
        // cold in seconds. So the model's format (Q4_1) takes every shape at every token
        // count, the others every shape at one token count each, in turn.
        let every = ty == GgmlType::Q4_1;
        let pick = |counts: &[usize], j: usize| -> Vec<usize> {
            match every {
                true => counts.to_vec(),
                false => vec![counts[(i + j) % counts.len()]],
            }
        };
        // Odd row counts: cubes that are partly past the last row.
        let c = case(ty, 67, 96, i as u64);
        for (j, shape) in shapes.into_iter().enumerate() {
            for tokens in pick(&[1, 3, 8], j) {
                check(&c, tokens, Some(shape));
            }
        }
        let c = case(ty, 131, 576, 10 + i as u64);
        for tokens in pick(&[1, 2, 5], 0) {
            check(&c, tokens, None);
        }
        // What a browser's fallback adapter (SwiftShader) runs.
        for tokens in pick(&[1, 2, 5], 1) {
            check(
                &c,
                tokens,
                Some(MatvecShape::for_limits(WEBGPU_FALLBACK, tokens)),
            );
        }
    }
}

/// WebGPU's limits on a fallback adapter: no plane size (cubecl assumes 128), 16 KiB of
/// workgroup memory, 256 units per cube.
const WEBGPU_FALLBACK: MatvecDevice = MatvecDevice {
    plane_size_max: 128,
    max_shared: 16 * 1024,
    max_units: 256,
    software: true,
    plane_ops: 0,
};

#[test]
fn matvec_shapes_fit_the_device() {
    let lavapipe = MatvecDevice {
        plane_size_max: 8,
        max_shared: 32 * 1024,
        max_units: 1024,
        software: false,
        plane_ops: 8,
    };
    let gpu = MatvecDevice {
        plane_size_max: 32,
        max_shared: 48 * 1024,
        max_units: 1024,
        software: false,
        plane_ops: 32,
    };
    let webgpu_gpu = MatvecDevice {
        software: false,
        ..WEBGPU_FALLBACK
    };
    for tokens in 1..=8 {
        assert_eq!(
            MatvecShape::for_limits(gpu, tokens),
            MatvecShape::WARP_PER_ROW
        );
        assert_eq!(
            MatvecShape::for_limits(webgpu_gpu, tokens),
            MatvecShape::WARP_PER_ROW
        );
        for device in [lavapipe, WEBGPU_FALLBACK] {
            let s = MatvecShape::for_limits(device, tokens);
            let bound = tokens.next_power_of_two();
            let units = s.lanes * s.rows_per_cube / s.rows_per_unit;
            let shared = match s.planes {
                true => 0,
                false => bound * s.rows_per_cube * (s.lanes + 1) * 4,
            };
            assert_eq!(
                s.rows_per_cube % s.rows_per_unit,
                0,
                "{device:?} {tokens}: {s:?}"
            );
            assert_eq!(s.rows_per_cube % 2, 0, "{device:?} {tokens}: {s:?}");
            assert!(units <= device.max_units, "{device:?} {tokens}: {s:?}");
            assert!(shared <= 16 * 1024, "{device:?} {tokens}: {s:?}");
        }
    }
    // Lavapipe adds up 16 rows per unit at one token, a fallback adapter 4 (16 lost
    // SwiftShader's device), both 2 at eight tokens.
    let rows = |device, tokens| MatvecShape::for_limits(device, tokens).rows_per_unit;
    assert_eq!((rows(lavapipe, 1), rows(WEBGPU_FALLBACK, 1)), (16, 4));
    assert_eq!((rows(lavapipe, 8), rows(WEBGPU_FALLBACK, 8)), (2, 2));
    // Lavapipe's lanes add up through its 8-lane planes; WebGPU tells nothing of planes.
    for tokens in 1..=8 {
        assert!(MatvecShape::for_limits(lavapipe, tokens).planes);
        assert!(!MatvecShape::for_limits(WEBGPU_FALLBACK, tokens).planes);
        assert!(!MatvecShape::for_limits(gpu, tokens).planes);
    }
    // cubecl reports no planes on CPU adapters: the device setup declares lavapipe's.
    let (device, adapter) = wgpu_device().unwrap();
    if adapter.starts_with("llvmpipe") {
        let client = WgpuRuntime::client(&device);
        assert_eq!(MatvecDevice::of(&client).plane_ops, 8, "{adapter}");
        assert!(MatvecShape::for_device(&client, 1).planes, "{adapter}");
    }
    // Decode attention: registers on CPU cores, workgroup-memory tiles on GPUs.
    for (device, kernel) in [
        (lavapipe, DecodeKernel::UnitKeys),
        (WEBGPU_FALLBACK, DecodeKernel::UnitKeys),
        (gpu, DecodeKernel::Tiles),
        (webgpu_gpu, DecodeKernel::Tiles),
    ] {
        assert_eq!(DecodeKernel::for_limits(device), kernel, "{device:?}");
    }
}

#[test]
fn tiled_kernel_matches_dequantize_then_matmul() {
    let _shared = crate::common::wgpu_shared();
    for (i, ty) in FORMATS.into_iter().enumerate() {
        // 67 rows: two row tiles, the second with 3 rows; 40 tokens: a full and a partial
        // token tile; 9 tokens: the smallest batch that takes the tiled kernel.
        let c = case(ty, 67, 96, 20 + i as u64);
        check(&c, 9, None);
        check(&c, 40, None);
        let c = case(ty, 131, 576, 30 + i as u64);
        check(&c, 33, None);
    }
}

#[test]
fn row_gather_matches_the_dequantized_rows() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().unwrap().0;
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let c = case(ty, 67, 1056, 40 + i as u64);
        let ids = [66u32, 0, 5, 5, 31];
        let idx = Tensor::<B, 1, Int>::from_data(
            TensorData::new(ids.map(|i| i as i32).to_vec(), [ids.len()]),
            &device,
        );
        let rows = host(B::quant_rows(idx, &c.weight));
        for (n, &id) in ids.iter().enumerate() {
            let want = &c.values[id as usize * c.cols..(id as usize + 1) * c.cols];
            let got = &rows[n * c.cols..(n + 1) * c.cols];
            for (g, w) in got.iter().zip(want) {
                // Exact up to a fused multiply-add in `d * q + m`.
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                    "{ty:?} row {id}: {g} vs {w}"
                );
            }
        }
    }
}

/// The Q5 types go to the device as K5 (four code words and three scale words a block),
/// the K-quants with FP32 scales, and every type comes back as the host packed it: the
/// same words, or (the K-quants, whose scales come back factored again) the same codes
/// and values.
#[test]
fn words_come_back_from_the_device_as_packed() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().unwrap().0;
    let mut rng = StdRng::seed_from_u64(50);
    for ty in [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q5_K,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
        GgmlType::Q2_K,
    ] {
        // Three rows of Q5_0 blocks: an odd block count, so a padding half.
        let (rows, cols) = (3, whole(ty, 32));
        let bytes = random_blocks(ty, rows, cols, &mut rng);
        let packed = PackedMatrix::pack(ty, &bytes, rows, cols).unwrap();
        let w = QuantMatrix::<B>::upload(&packed, &device);
        let back = w.download();
        if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K) {
            let (quants, scales) = w.device_words().expect("on the device");
            assert_eq!(quants.dims()[0], rows * cols / 32 * 4, "{ty:?}");
            assert_eq!(scales.dims()[0], rows * cols / 32 * 3, "{ty:?}");
        }
        assert_eq!(back.quants, packed.quants, "{ty:?}");
        assert_eq!(back.dequantize(), packed.dequantize(), "{ty:?}");
        if ty.block_elements() == 32 {
            assert_eq!(back, packed, "{ty:?}");
        }
    }
}

#[test]
fn model_entry_points_use_the_kernels() {
    let _shared = crate::common::wgpu_shared();
    // What the model calls: the matrix-vector kernel for a few tokens, and for many either
    // the tiled kernel or FP32 products over dequantized chunks of 8,192 rows (lavapipe),
    // here across a chunk boundary.
    assert!(<B as QuantOps>::has_quant_kernels());
    let c = case(GgmlType::Q4_1, 8195, 64, 50);
    let device = wgpu_device().unwrap().0;
    let w = Tensor::<B, 2>::from_data(TensorData::new(c.values.clone(), [c.rows, 64]), &device);
    for tokens in [2, 20] {
        let x: Tensor<B, 2> =
            Tensor::random([tokens, 64], Distribution::Uniform(-1.0, 1.0), &device);
        let want = host(x.clone().matmul(w.clone().transpose()));
        let got = host(B::quant_matmul(x, &c.weight));
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        eprintln!("{tokens} tokens x 8195 rows through QuantOps: max |diff| {worst:.2e}");
        assert!(worst < 1e-4, "{tokens} tokens: {worst}");
    }
}

/// The CPU backend: products and row gathers over three Q4_1 rows (an odd block count, so
/// the FP16 scales need a padding half), multiplied by ones, so the 8-bit activations are
/// exact and each output is its row's sum.
#[test]
fn cpu_backend_products_and_rows_equal_the_dequantized_matrix() {
    let device = Default::default();
    let mut rng = StdRng::seed_from_u64(5);
    let bytes = random_blocks(GgmlType::Q4_1, 3, 32, &mut rng);
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
    let ids = Tensor::<Cpu, 1, Int>::from_data(TensorData::new(vec![2i32], [1]), &device);
    let row: Vec<f32> = Cpu::quant_rows(ids, &w).into_data().to_vec().unwrap();
    assert_eq!(row, values[64..96]);
}

/// The CPU backend keeps quantized words in host memory, the file's size, and its
/// `quant_matmul` is the kernels' product.
#[test]
fn cpu_backend_keeps_blocks_on_the_host_and_multiplies_with_the_kernels() {
    use fornax_cpu::{InterleavedWeights, Q8Activations, SimdLevel, LANES};
    let device = Default::default();
    let mut rng = StdRng::seed_from_u64(11);
    let (rows, cols) = (45, 128);
    let bytes = random_blocks(GgmlType::Q4_1, rows, cols, &mut rng);
    let packed = PackedMatrix::pack(GgmlType::Q4_1, &bytes, rows, cols).unwrap();
    let w = QuantMatrix::<Cpu>::upload(&packed, &device);
    assert!(Cpu::has_quant_kernels() && w.host().is_some() && w.device_words().is_none());
    // The file's bytes, plus the zero rows that fill the last group of eight.
    assert_eq!(w.bytes(), bytes.len() / rows * rows.next_multiple_of(LANES));
    assert_eq!(w.download(), packed);
    let x: Vec<f32> = (0..2 * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let xt = Tensor::<Cpu, 2>::from_data(TensorData::new(x.clone(), [2, cols]), &device);
    let got: Vec<f32> = Cpu::quant_matmul(xt, &w).into_data().to_vec().unwrap();
    let want = InterleavedWeights::new(&packed.cpu_view())
        .matmul_q8(&Q8Activations::quantize(&x, 2, cols), SimdLevel::best());
    assert_eq!(got, want);
}

/// On the CPU backend the K-quants keep the file's codes and scales (a byte a step where
/// the file packs six bits, or four for Q2_K; two halves a super-block): Q4_K, Q5_K and
/// Q6_K take the file's bytes within 3%, Q3_K within 6% and Q2_K 20%, and come back
/// exactly.
#[test]
fn cpu_backend_keeps_k_quants_at_the_file_size() {
    use fornax_cpu::LANES;
    let device = Default::default();
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, cols) = (24, 512);
    for (ty, limit) in [
        (GgmlType::Q4_K, 1.03),
        (GgmlType::Q5_K, 1.03),
        (GgmlType::Q6_K, 1.03),
        (GgmlType::Q3_K, 1.06),
        (GgmlType::Q2_K, 1.2),
    ] {
        let bytes = random_blocks(ty, rows, cols, &mut rng);
        let packed = PackedMatrix::pack(ty, &bytes, rows, cols).unwrap();
        let w = QuantMatrix::<Cpu>::upload(&packed, &device);
        assert_eq!(rows % LANES, 0, "no padding rows");
        let ratio = w.bytes() as f64 / bytes.len() as f64;
        eprintln!(
            "{ty:?}: {} bytes on the host for {} in the file ({ratio:.4}x)",
            w.bytes(),
            bytes.len()
        );
        assert!((1.0..limit).contains(&ratio), "{ty:?}: {ratio}");
        assert_eq!(w.download(), packed, "{ty:?}");
    }
}
