//! The CUDA kernel check, without a GPU: every kernel the engine launches for both real
//! models and the family checkpoints in Q8_0, Q4_K and F32 (decode at batch 1 and 64,
//! prefill, scoring, sampling; FP32 and FP16 activations, and BF16 on the default model),
//! written by CubeCL's CUDA compiler, builds with NVRTC and ptxas for A100 (sm_80) and
//! H100 (sm_90a); and the check fails, naming the kernel, when a kernel does not build.

use std::sync::OnceLock;

use fornax_backends::cuda_check::{self, CapturedKernel, Target, Toolchain};
use fornax_backends::Dtype;
use fornax_engine::gguf::GgufFile;

use crate::common::{gemma_file, model_file};
use crate::families::checkpoint;

fn tools() -> Toolchain {
    Toolchain::find().expect("the CUDA tools (scripts/cuda-tools.sh, run by the test command)")
}

/// The distinct kernels of every model for `target`, captured once: SmolLM2 (Q4_1),
/// Gemma 3 (Q4_K, Q6_K; head size 256, windowed layers) and the family checkpoints
/// (Llama 3 in Q8_0, Qwen2's biases in Q4_K, Qwen3's head norms in F32).
fn kernels(target: Target) -> &'static [CapturedKernel] {
    static ALL: OnceLock<Vec<Vec<CapturedKernel>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        Target::ALL
            .iter()
            .map(|&t| {
                let mut kernels: Vec<CapturedKernel> = Vec::new();
                let families = ["llama3-q8_0", "qwen2-q4_k", "qwen3-f32"].map(checkpoint);
                let files = [model_file(), gemma_file()].into_iter().chain(&families);
                // FP32 and FP16 (CUDA's default) everywhere; BF16 on the default model,
                // whose kernels are those of every family but Gemma's head work.
                for (i, file) in files.enumerate() {
                    let dtypes: &[Dtype] = match i {
                        0 => &[Dtype::F32, Dtype::F16, Dtype::Bf16],
                        _ => &[Dtype::F32, Dtype::F16],
                    };
                    let gguf = GgufFile::parse(file.bytes()).expect("model");
                    for k in cuda_check::capture(&gguf, t, dtypes).expect("the workload") {
                        if !kernels.iter().any(|o| o.id == k.id) {
                            kernels.push(k);
                        }
                    }
                }
                kernels
            })
            .collect()
    });
    let i = Target::ALL
        .iter()
        .position(|&t| t == target)
        .expect("a target");
    &all[i]
}

#[test]
fn every_kernel_builds_for_a100_and_h100() {
    let tools = tools();
    for target in Target::ALL {
        let kernels = kernels(target);
        let (rows, errors) = cuda_check::build_all(&tools, kernels, target);
        let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}", messages.join("\n\n"));
        eprintln!(
            "{} ({}): {} kernels built\n{}",
            target.gpu_architecture(),
            target.part,
            rows.len(),
            cuda_check::table(&rows)
        );
        // FP16 activations (`--dtype f16`, CUDA's default) and BF16: products and
        // attention read and write halves.
        for half in ["__half", "__nv_bfloat16"] {
            for ours in ["quant_matvec", "quant_matmul", "paged_decode", "rms_norm"] {
                assert!(
                    kernels.iter().any(|k| k.name.starts_with(ours)
                        && k.source.as_deref().is_ok_and(|s| s.contains(half))),
                    "no {half} variant of {ours}"
                );
            }
        }
        // Ours and burn's: the paged attention, the quantized products and sampling.
        for ours in ["paged", "matvec", "sample"] {
            assert!(
                rows.iter().any(|r| r.name.contains(ours)),
                "no kernel named *{ours}* among {:?}",
                rows.iter().map(|r| &r.name).collect::<Vec<_>>()
            );
        }
        for r in &rows {
            assert!(
                r.resources.registers > 0,
                "{}: no registers reported",
                r.name
            );
            assert!(
                r.occupancy > 0.0,
                "{} cannot be resident on {}",
                r.name,
                target.part
            );
        }
    }
}

#[test]
fn a_broken_kernel_fails_the_check_with_its_name_and_the_compilers_words() {
    let tools = tools();
    let target = Target::ALL[1];
    let good = kernels(target)
        .iter()
        .find(|k| k.name.contains("paged"))
        .expect("a paged attention kernel");
    assert!(tools.build(good, target).is_ok());

    // An undeclared name in the body: NVRTC refuses it.
    let mut broken = good.clone();
    let source = good.source.clone().expect("source");
    let entry = source.find("__global__").expect("a kernel entry point");
    let body = entry + source[entry..].find("{\n").expect("a kernel body") + 2;
    broken.source = Ok(format!(
        "{}fornax_undeclared += 1;\n{}",
        &source[..body],
        &source[body..]
    ));
    let e = tools
        .build(&broken, target)
        .expect_err("a broken kernel must not build");
    assert_eq!(e.stage, "NVRTC");
    let text = e.to_string();
    assert!(text.contains(&good.name), "{text}");
    assert!(
        text.contains("fornax_undeclared") && text.contains("undefined"),
        "{text}"
    );

    // PTX that ptxas refuses: more shared memory than an H100 block can have.
    let mut huge = good.clone();
    huge.source = Ok(format!(
        "{source}\nextern \"C\" __global__ void fornax_too_big(float* o) {{ __shared__ float s[80000]; s[threadIdx.x] = 1.0f; o[threadIdx.x] = s[threadIdx.x ^ 1]; }}\n"
    ));
    let e = tools
        .build(&huge, target)
        .expect_err("too much shared memory must not build");
    assert!(e.stage == "ptxas" || e.stage == "NVRTC", "{e}");
    assert!(e.to_string().contains(&good.name), "{e}");
}
