//! FP16 compute (`--dtype f16`) on lavapipe against FP32 on both real models: perplexity
//! within 0.5% and greedy tokens equal, except after a step where FP32's own top-2 logit
//! margin is below 0.1.
//!
//! A device's float type is set once per process, so the FP16 side runs in a child process
//! of this test binary ([`fp16_side`], with `FORNAX_TEST_DTYPE=f16`) while this one
//! measures FP32.

use std::path::PathBuf;
use std::process::Command;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo, Dtype};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::Model;
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::EngineBackend;
use serde::{Deserialize, Serialize};

use crate::common::{
    gemma_file, greedy_steps, model_file, read_reference, run_on, Perplexity, Prompts,
};
use crate::llama_cpp::Reference;

/// Allowed relative perplexity difference of FP16 from FP32.
const PPL_TOLERANCE: f64 = 0.005;
/// FP16 may part from FP32's greedy tokens only after a step whose FP32 margin is below this.
const MIN_MARGIN: f32 = 0.1;

/// What one side measured on one model.
#[derive(Debug, Serialize, Deserialize)]
struct Side {
    /// The float type of the activations it ran with.
    dtype: String,
    /// Log-probabilities of the text's tokens after the first.
    logprobs: Vec<f32>,
    /// Per prompt, greedy tokens with their top-1 minus top-2 logit margins.
    greedy: Vec<Vec<(u32, f32)>>,
}

/// A real model and how much of its reference text and prompts to run.
#[derive(Debug, Clone, Copy)]
enum Real {
    SmolLm2,
    Gemma3,
}

impl Real {
    const ALL: [Real; 2] = [Real::SmolLm2, Real::Gemma3];

    /// Text ids to score, prompts to decode greedily and tokens per prompt; tokens scored
    /// per pass (Gemma's 262,144-wide logits: 64 rows fit one lavapipe buffer).
    fn work(self) -> (Vec<u32>, Vec<Vec<u32>>, usize, usize) {
        match self {
            Real::SmolLm2 => {
                let text: Perplexity = read_reference("perplexity.json");
                let prompts: Prompts = read_reference("prompts.json");
                let ids = text.ids[..320].to_vec();
                (
                    ids,
                    prompts.prompts.into_iter().map(|p| p.prompt_ids).collect(),
                    32,
                    256,
                )
            }
            Real::Gemma3 => {
                let r: Reference = read_reference("gemma3/llama_cpp.json");
                let ids = r.text.ids[..192].to_vec();
                (
                    ids,
                    r.prompts.into_iter().take(2).map(|p| p.ids).collect(),
                    16,
                    64,
                )
            }
        }
    }
}

impl BackendTask for Real {
    type Output = Result<Side, String>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Self::Output {
        let file = match self {
            Real::SmolLm2 => model_file(),
            Real::Gemma3 => gemma_file(),
        };
        let gguf = GgufFile::parse(file.bytes()).map_err(|e| e.to_string())?;
        let model =
            Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).map_err(|e| e.to_string())?;
        // What new float tensors on the device hold: the activations' type.
        let made = burn_tensor::Tensor::<B, 1>::zeros([1], &device).dtype();
        let (ids, prompts, steps, chunk) = self.work();
        let dims = model.kv_dims();
        let blocks = ids.len().div_ceil(BLOCK_TOKENS) + 1;
        let capacity = KvCapacity::f32_only(blocks).with_sliding(dims, 1, chunk);
        let mut kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
        let logprobs = token_logprobs_in(&model, &mut PagedSeq::new(&mut kv), &ids, chunk)
            .map_err(|e| e.to_string())?;
        let mut greedy = Vec::new();
        for prompt in &prompts {
            let blocks = (prompt.len() + steps).div_ceil(BLOCK_TOKENS);
            let capacity = KvCapacity::f32_only(blocks).with_sliding(dims, 1, 256);
            let mut kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
            greedy.push(greedy_steps(
                &model,
                &mut PagedSeq::new(&mut kv),
                prompt,
                steps,
            )?);
        }
        Ok(Side {
            dtype: format!("{} ({made:?} tensors)", info.dtype),
            logprobs,
            greedy,
        })
    }
}

/// The FP16 side, run by [`fp16_matches_fp32_on_lavapipe`] in a child process: both
/// models, written as JSON to `$FORNAX_TEST_OUT`.
#[test]
#[ignore = "the FP16 side of fp16_matches_fp32_on_lavapipe, which runs it in a child process"]
fn fp16_side() {
    let out = PathBuf::from(std::env::var_os("FORNAX_TEST_OUT").expect("FORNAX_TEST_OUT"));
    std::fs::write(out, serde_json::to_vec(&both_models()).unwrap()).unwrap();
}

/// Both models measured on wgpu in this process's float type.
fn both_models() -> Vec<Side> {
    Real::ALL
        .into_iter()
        .map(|m| {
            run_on(BackendKind::Wgpu, m)
                .expect("a wgpu adapter")
                .unwrap()
        })
        .collect()
}

#[test]
fn fp16_matches_fp32_on_lavapipe() {
    let out = std::env::temp_dir().join(format!("fornax-fp16-{}.json", std::process::id()));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["fp16::fp16_side", "--exact", "--ignored", "--nocapture"])
        .env("FORNAX_TEST_DTYPE", Dtype::F16.name())
        .env("FORNAX_TEST_OUT", &out)
        .spawn()
        .expect("the FP16 side");
    let f32s = both_models();
    assert!(child.wait().unwrap().success(), "the FP16 side failed");
    let f16s: Vec<Side> = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    let mut failures = Vec::new();
    for ((model, a), b) in Real::ALL.into_iter().zip(&f32s).zip(&f16s) {
        assert!(
            b.dtype.starts_with("f16 (F16"),
            "the child ran in {}",
            b.dtype
        );
        assert!(
            a.dtype.starts_with("f32 (F32"),
            "this process ran in {}",
            a.dtype
        );
        let (pa, pb) = (perplexity(&a.logprobs), perplexity(&b.logprobs));
        let rel = (pb - pa).abs() / pa;
        let worst = a
            .logprobs
            .iter()
            .zip(&b.logprobs)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "{model:?}: perplexity over {} tokens FP16 {pb:.4}, FP32 {pa:.4} ({:+.3}%), max |logprob diff| {worst:.2e}",
            a.logprobs.len() + 1,
            (pb / pa - 1.0) * 100.0
        );
        if rel > PPL_TOLERANCE {
            failures.push(format!("{model:?}: perplexity {pb} against {pa}"));
        }
        // FP16 must have changed something, or it did not run.
        if worst == 0.0 {
            failures.push(format!(
                "{model:?}: FP16 log-probabilities equal FP32's bit for bit"
            ));
        }
        for (i, (ga, gb)) in a.greedy.iter().zip(&b.greedy).enumerate() {
            let parted = ga.iter().zip(gb).position(|(x, y)| x.0 != y.0);
            match parted {
                None => eprintln!(
                    "{model:?} prompt {i}: {}/{} greedy tokens equal",
                    gb.len(),
                    ga.len()
                ),
                Some(s) if ga[s].1 < MIN_MARGIN => eprintln!(
                    "{model:?} prompt {i}: parted at step {s}, FP32 margin {:.3}",
                    ga[s].1
                ),
                Some(s) => failures.push(format!(
                    "{model:?} prompt {i}: FP16 {} against FP32 {} at step {s}, FP32 margin {:.3}",
                    gb[s].0, ga[s].0, ga[s].1
                )),
            }
            if gb.len() != ga.len() {
                failures.push(format!(
                    "{model:?} prompt {i}: {} of {} steps",
                    gb.len(),
                    ga.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
