//! The fused layer kernels: products whose epilogue does a layer's element-wise work
//! (`fornax_shaders::epilogue`), against the product followed by burn's operations, on
//! random data of odd sizes through every kernel that carries an epilogue; then the real
//! model through the fused kernels against the same model operation by operation.
//!
//! The product inside both is the same kernel with the same sums, so the epilogues are held
//! to FP32 rounding: `1e-5` relative. The model is held to `1e-3` on every logit.

use burn_tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};
use fornax_backends::{wgpu_device, BackendKind, BackendTask, DeviceInfo, WgpuBackend};
use fornax_engine::device_counts::counted;
use fornax_engine::gguf::{GgmlType, GgufFile};
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Logits, Model, Rope, RopeStyle};
use fornax_engine::quant::format_code;
use fornax_engine::seq_cache::{PagedSeq, SeqCache};
use fornax_engine::store::ModelFile;
use fornax_engine::{logits_to_vec, prefill_logits, EngineBackend};
use fornax_shaders::quant_launch::{self, Epilogue, MatvecShape, QuantTensors, RopeKv};
use fornax_shaders::quant_matmul::MATVEC_MAX_TOKENS;

use crate::common::{gemma_file, model_file, read_reference, run_on, Prompts};
use crate::quant_kernels::{case, host, Case};

type B = WgpuBackend;
type R = burn_wgpu::WgpuRuntime;
type CubeTensor = burn_cubecl::tensor::CubeTensor<R>;

/// A float tensor as the launchers take it.
pub(crate) fn float<const D: usize>(t: Tensor<B, D>) -> CubeTensor {
    t.into_primitive().tensor()
}

/// A launcher's output as a float tensor.
pub(crate) fn tensor(t: CubeTensor) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn words(c: &Case) -> QuantTensors<R> {
    QuantTensors {
        quants: c.weight.device_words().unwrap().0.clone().into_primitive(),
        scales: c.weight.device_words().unwrap().1.clone().into_primitive(),
        format: format_code(c.ty).unwrap(),
        rows: c.rows,
        cols: c.cols,
    }
}

/// Largest `|a - b| / max(1, |b|)`.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// The ways a product with an epilogue is computed: the matrix-vector kernel (as the
/// device lays it out, and a unit per row), the tiled kernel, and a product followed by
/// the stand-alone epilogue kernel.
#[derive(Debug, Clone, Copy)]
enum Route {
    Matvec(Option<MatvecShape>),
    Tiled,
    Separate,
}

fn routes(tokens: usize) -> Vec<Route> {
    match tokens <= MATVEC_MAX_TOKENS {
        true => vec![
            Route::Matvec(None),
            Route::Matvec(Some(MatvecShape::ROW_PER_UNIT)),
            Route::Separate,
        ],
        false => vec![Route::Tiled, Route::Separate],
    }
}

/// `x @ W^T` then `epilogue`, through `route`.
fn through(route: Route, x: Tensor<B, 2>, c: &Case, epilogue: Epilogue<R>) -> Tensor<B, 2> {
    let w = words(c);
    tensor(match route {
        Route::Matvec(shape) => quant_launch::matmul_then(float(x), &w, shape, epilogue),
        Route::Tiled => quant_launch::matmul_then(float(x), &w, None, epilogue),
        Route::Separate => quant_launch::finish(quant_launch::matmul(float(x), &w, None), epilogue),
    })
}

const TOKENS: [usize; 5] = [1, 3, 8, 13, 40];

#[test]
fn residual_and_swiglu_epilogues_match_separate_operations() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    // An epilogue sees only a row's finished sum, whatever the format, and `quant_kernels`
    // checks every format's sums at every shape and kernel: the epilogues are checked
    // on the model's format (Q4_1). Each (tokens, route, epilogue) is a shader lavapipe
    // compiles from cold in a second or more.
    let ty = GgmlType::Q4_1;
    // Odd heights: the last pair has one row.
    let c = case(ty, 77, 96, 40);
    let gate_up = case(ty, 90, 64, 50);
    for tokens in TOKENS {
        let x = Tensor::<B, 2>::random([tokens, c.cols], Distribution::Uniform(-1.0, 1.0), &device);
        let res =
            Tensor::<B, 2>::random([tokens, c.rows], Distribution::Uniform(-4.0, 4.0), &device);
        let product = tensor(quant_launch::matmul(float(x.clone()), &words(&c), None));
        let want = host(product + res.clone());
        let xg = Tensor::<B, 2>::random([tokens, 64], Distribution::Uniform(-2.0, 2.0), &device);
        let both = tensor(quant_launch::matmul(
            float(xg.clone()),
            &words(&gate_up),
            None,
        ));
        let pairs = both.reshape([tokens, 45, 2]);
        let part = |p| pairs.clone().narrow(2, p, 1).reshape([tokens, 45]);
        let want_swiglu = host(burn_tensor::activation::silu(part(0)) * part(1));
        for route in routes(tokens) {
            let got = host(through(
                route,
                x.clone(),
                &c,
                Epilogue::Residual(float(res.clone())),
            ));
            let err = worst(&got, &want);
            assert!(
                err < 1e-5,
                "{ty:?} residual, {tokens} tokens, {route:?}: {err}"
            );
            let got = host(through(route, xg.clone(), &gate_up, Epilogue::Swiglu));
            let err = worst(&got, &want_swiglu);
            assert!(
                err < 1e-5,
                "{ty:?} SwiGLU, {tokens} tokens, {route:?}: {err}"
            );
        }
    }
}

/// RoPE on Q and K and the write of K and V into arena rows, against the product, burn's
/// RoPE and the rows compared on the host; rows not written stay zero.
#[test]
fn rope_kv_epilogue_matches_separate_operations() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    let (heads, kv_heads, head_dim, slots) = (3, 1, 16, 64);
    let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    let rope = Rope::<B>::new(head_dim, 512, 10_000.0, None, RopeStyle::Adjacent, &device);
    let c = case(GgmlType::Q4_1, q_width + 2 * kv_width, 96, 60);
    for tokens in TOKENS {
        let x = Tensor::<B, 2>::random([tokens, c.cols], Distribution::Uniform(-1.0, 1.0), &device);
        let positions: Vec<u32> = (0..tokens).map(|t| (37 * t as u32 + 5) % 512).collect();
        let rows: Vec<u32> = (0..tokens)
            .map(|t| (11 * t as u32 + 3) % slots as u32)
            .collect();
        let info: Vec<i32> = positions
            .iter()
            .zip(&rows)
            .flat_map(|(&p, &r)| [p as i32, r as i32])
            .collect();
        let ints = |v: Vec<i32>| {
            Tensor::<B, 1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &device)
        };
        let product = tensor(quant_launch::matmul(float(x.clone()), &words(&c), None));
        let pos = ints(positions.iter().map(|&p| p as i32).collect());
        let q = rope.apply_rows(product.clone().narrow(1, 0, q_width), heads, pos.clone());
        let k = host(rope.apply_rows(product.clone().narrow(1, q_width, kv_width), kv_heads, pos));
        let v = host(product.narrow(1, q_width + kv_width, kv_width));
        let want_q = host(q);
        for route in routes(tokens) {
            let keys = Tensor::<B, 2>::zeros([slots, kv_width], &device);
            let values = Tensor::<B, 2>::zeros([slots, kv_width], &device);
            let epilogue = Epilogue::RopeKv(RopeKv {
                keys: float(keys.clone()),
                values: float(values.clone()),
                info: ints(info.clone()).into_primitive(),
                table: float(rope.pairs().clone()),
                q_width,
                kv_width,
                head_dim,
            });
            let got_q = host(through(route, x.clone(), &c, epilogue));
            let err = worst(&got_q, &want_q);
            assert!(err < 1e-5, "Q, {tokens} tokens, {route:?}: {err}");
            let (keys, values) = (host(keys), host(values));
            for (arena, want, name) in [(&keys, &k, "K"), (&values, &v, "V")] {
                for slot in 0..slots {
                    let row = &arena[slot * kv_width..(slot + 1) * kv_width];
                    match rows.iter().position(|&r| r as usize == slot) {
                        // Tokens that share a row write it alike only when they are the same
                        // token; the rows chosen above are distinct for up to 64 tokens.
                        Some(t) => {
                            let err = worst(row, &want[t * kv_width..(t + 1) * kv_width]);
                            assert!(
                                err < 1e-5,
                                "{name} of token {t}, {tokens} tokens, {route:?}: {err}"
                            );
                        }
                        None => {
                            assert!(row.iter().all(|&x| x == 0.0), "{name} row {slot} untouched")
                        }
                    }
                }
            }
        }
    }
}

/// A real model through the fused kernels and operation by operation, fed the same
/// tokens: every logit of the prefill and of `steps` greedy steps per prompt, and the
/// kernels each path launched for its first decode step.
struct FusedAgainstReference {
    file: fn() -> &'static ModelFile,
    prompts: Vec<(String, Vec<u32>)>,
    steps: usize,
}

impl BackendTask for FusedAgainstReference {
    type Output = Vec<(String, f32, Vec<u32>, Vec<u32>, [u64; 2])>;

    fn run<Bk: EngineBackend>(self, device: Bk::Device, _: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse((self.file)().bytes()).expect("model");
        let load = |reference_ops| {
            let options = LoadOptions {
                reference_ops,
                ..LoadOptions::default()
            };
            Model::<Bk>::from_gguf_with(&gguf, &device, options, &mut |_, _| {}).unwrap()
        };
        let (fused, reference) = (load(false), load(true));
        let layers = fused.config.n_layers;
        assert_eq!(
            fused.matrices().count() + 3 * layers,
            reference.matrices().count(),
            "Q, K, V and gate, up joined"
        );
        self.prompts
            .iter()
            .map(|(prompt, ids)| {
                let blocks = (ids.len() + self.steps).div_ceil(BLOCK_TOKENS);
                let mut caches = [&fused, &reference]
                    .map(|m| m.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32));
                let [kf, kr] = &mut caches;
                let (mut sf, mut sr) = (PagedSeq::new(kf), PagedSeq::new(kr));
                let mut lf = logits_to_vec(prefill_logits(&fused, ids, &mut sf, 256).unwrap());
                let mut lr = logits_to_vec(prefill_logits(&reference, ids, &mut sr, 256).unwrap());
                let (mut worst_diff, mut tf, mut tr) = (0.0f32, Vec::new(), Vec::new());
                let mut dispatches = [0; 2];
                for step in 0..self.steps {
                    let diff = lf
                        .iter()
                        .zip(&lr)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    worst_diff = worst_diff.max(diff);
                    let (a, b) = (
                        fornax_engine::sampling::argmax(&lf),
                        fornax_engine::sampling::argmax(&lr),
                    );
                    tf.push(a);
                    tr.push(b);
                    let (f, cf) = counted(|| sf.forward(&fused, &[a], Logits::Last).unwrap());
                    let (r, cr) = counted(|| sr.forward(&reference, &[a], Logits::Last).unwrap());
                    if step == 0 {
                        dispatches = [cf.dispatches, cr.dispatches];
                    }
                    (lf, lr) = (logits_to_vec(f), logits_to_vec(r));
                }
                (prompt.clone(), worst_diff, tf, tr, dispatches)
            })
            .collect()
    }
}

fn fused_matches_reference_ops(task: FusedAgainstReference) {
    let results = run_on(BackendKind::Wgpu, task).expect("a wgpu adapter");
    for (prompt, diff, fused, reference, [df, dr]) in results {
        eprintln!(
            "{prompt:?}: worst logit difference {diff:.2e}, tokens {fused:?}, \
             {df} dispatches a step fused, {dr} operation by operation"
        );
        assert!(diff <= 1e-3, "{prompt:?}: logits differ by {diff}");
        assert_eq!(fused, reference, "{prompt:?}: greedy tokens");
        assert!(
            df < dr,
            "{prompt:?}: the fused path ran ({df} vs {dr} dispatches)"
        );
    }
}

#[test]
fn real_model_fused_matches_reference_ops() {
    let prompts: Prompts = read_reference("prompts.json");
    fused_matches_reference_ops(FusedAgainstReference {
        file: model_file,
        prompts: prompts
            .prompts
            .into_iter()
            .map(|p| (p.prompt, p.prompt_ids))
            .collect(),
        steps: 8,
    });
}

/// Gemma 3's blocks (head norms, NeoX RoPE, post norms, GeGLU, windowed layers) through
/// the fused kernels against the same file operation by operation.
#[test]
fn gemma_fused_matches_reference_ops() {
    fused_matches_reference_ops(FusedAgainstReference {
        file: gemma_file,
        prompts: crate::gemma3::prompt_ids().into_iter().take(3).collect(),
        steps: 8,
    });
}

/// Qwen2's biased blocks (Q/K/V biases, NeoX RoPE, an untied output) through the fused
/// kernels against the same file operation by operation: the Qwen2 checkpoint in Q8_0.
#[test]
fn qwen2_fused_matches_reference_ops() {
    fn file() -> &'static ModelFile {
        static FILE: std::sync::OnceLock<ModelFile> = std::sync::OnceLock::new();
        FILE.get_or_init(|| crate::families::checkpoint("qwen2-q8_0"))
    }
    fused_matches_reference_ops(FusedAgainstReference {
        file,
        prompts: crate::families::prompt_ids("qwen2"),
        steps: 8,
    });
}
