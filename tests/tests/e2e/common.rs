//! Shared helpers of the end-to-end tests: the real model and the reference outputs in
//! `shared/reference/` (llama.cpp and a float reference of the same GGUF).

use std::path::PathBuf;
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use fornax_backends::{BackendError, BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Logits, Model};
use fornax_engine::sampling::argmax;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::score::{perplexity, token_logprobs};
use fornax_engine::seq_cache::{PagedSeq, SeqCache};
use fornax_engine::store::ModelFile;
use fornax_engine::{generate_in, prefill, Engine, EngineBackend, Event, GenerateParams, Request};
use serde::Deserialize;

/// The folder with reference outputs: `$FORNAX_REFERENCE`, else `tests/reference`
/// (a copy of the team's `shared/reference`).
pub fn reference_dir() -> PathBuf {
    match std::env::var_os("FORNAX_REFERENCE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference"),
    }
}

/// Reads and parses one reference JSON file.
pub fn read_reference<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = reference_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Who is using the process's one wgpu device: every test that does holds it shared; a
/// test that measures the device allocator holds it alone, so no other test's buffers
/// move its figures.
static WGPU_USE: RwLock<()> = RwLock::new(());

/// Shares the wgpu device with the other tests for as long as the guard lives.
pub fn wgpu_shared() -> RwLockReadGuard<'static, ()> {
    WGPU_USE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Has the wgpu device alone (no other test runs on it) for as long as the guard lives.
pub fn wgpu_alone() -> RwLockWriteGuard<'static, ()> {
    WGPU_USE.write().unwrap_or_else(PoisonError::into_inner)
}

/// [`fornax_backends::run_on`], sharing the wgpu device (see [`wgpu_shared`]) when the
/// task runs on it; on wgpu in the float type `$FORNAX_TEST_DTYPE` where set (a test's
/// child process: a device's float type is set once per process).
pub fn run_on<T: BackendTask>(kind: BackendKind, task: T) -> Result<T::Output, BackendError> {
    let kind = kind.resolve();
    let _shared = (kind == BackendKind::Wgpu).then(wgpu_shared);
    let dtype = match std::env::var("FORNAX_TEST_DTYPE") {
        Ok(name) if kind == BackendKind::Wgpu => name.parse()?,
        _ => fornax_backends::Dtype::F32,
    };
    fornax_backends::run_on_with(kind, dtype, task)
}

/// The default model file, fetched once per test process if missing.
pub fn model_file() -> &'static ModelFile {
    static FILE: OnceLock<ModelFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = fornax_engine::store::ensure_default_model(&mut |s| eprintln!("{s}"))
            .expect("default model");
        ModelFile::open(&path).expect("open model")
    })
}

/// The Gemma 3 270M file (alias `gemma3-270m`), fetched once per test process if missing.
pub fn gemma_file() -> &'static ModelFile {
    static FILE: OnceLock<ModelFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let alias = fornax_engine::store::alias("gemma3-270m").expect("the gemma3-270m alias");
        let path = alias
            .ensure(&mut |s| eprintln!("{s}"))
            .expect("Gemma 3 model");
        ModelFile::open(&path).expect("open model")
    })
}

/// `prompts.json`.
#[derive(Debug, Deserialize)]
pub struct Prompts {
    pub prompts: Vec<PromptCase>,
}

/// One reference prompt.
#[derive(Debug, Deserialize)]
pub struct PromptCase {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub float_reference: FloatReference,
}

/// What the float reference computed for a prompt.
#[derive(Debug, Deserialize)]
pub struct FloatReference {
    pub top20_last_logits: Vec<(u32, f32)>,
    pub greedy_ids: Vec<u32>,
    pub steps: Vec<Step>,
}

/// One greedy step of the reference.
#[derive(Debug, Deserialize)]
pub struct Step {
    pub token: u32,
    pub margin_top1_top2_logit: f32,
}

/// `perplexity.json`.
#[derive(Debug, Deserialize)]
pub struct Perplexity {
    pub n_tokens: usize,
    pub n_scored: usize,
    pub perplexity: f64,
    pub ids: Vec<u32>,
}

/// Checks our greedy tokens against the reference: they must be equal, except that a
/// divergence is allowed at a step where the reference's top-2 margin is below
/// `min_margin` (tokens after it are then not compared). Returns how many matched.
pub fn check_greedy(
    ours: &[u32],
    reference: &FloatReference,
    min_margin: f32,
) -> Result<usize, String> {
    for (i, (&a, step)) in ours.iter().zip(&reference.steps).enumerate() {
        assert_eq!(step.token, reference.greedy_ids[i]);
        if a != step.token {
            return if step.margin_top1_top2_logit < min_margin {
                Ok(i)
            } else {
                Err(format!(
                    "step {i}: got {a}, reference {} with top-2 margin {:.3} (>= {min_margin})",
                    step.token, step.margin_top1_top2_logit
                ))
            };
        }
    }
    if ours.len() < reference.greedy_ids.len() {
        return Err(format!("only {} tokens generated", ours.len()));
    }
    Ok(ours.len())
}

/// The checks run on the real model, each on any backend.
#[derive(Debug, Clone, Copy)]
pub enum Check {
    /// Last-position logits of every reference prompt against the float reference.
    Logits,
    /// 32 greedy tokens of every reference prompt.
    Greedy,
    /// Perplexity of `ppl_text.txt`.
    Perplexity,
}

/// Allowed absolute difference of a last-position logit from the float reference.
pub const LOGIT_TOLERANCE: f32 = 0.02;
/// A greedy divergence is allowed only where the reference's top-2 margin is below this.
pub const MIN_MARGIN: f32 = 0.05;
/// Allowed relative perplexity difference from the float reference.
pub const PPL_TOLERANCE: f64 = 0.005;

/// A greedy divergence on a path with 8-bit activations (the CPU kernels, as llama.cpp's)
/// is allowed only where the reference's top-2 margin is below this.
pub const Q8_MIN_MARGIN: f32 = 0.25;

/// A check with the model loaded by `options`, greedy divergences allowed below
/// `min_margin`.
#[derive(Debug, Clone, Copy)]
struct CheckTask {
    check: Check,
    options: LoadOptions,
    min_margin: f32,
}

impl BackendTask for CheckTask {
    type Output = Result<String, String>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).map_err(|e| e.to_string())?;
        let model = Model::<B>::from_gguf_with(&gguf, &device, self.options, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let quantized = model.matrices().filter(|m| m.is_quantized()).count();
        let prompts: Prompts = read_reference("prompts.json");
        let mut report = format!(
            "[{} on {}, {quantized} quantized matrices]\n",
            info.kind, info.adapter
        );
        let mut failures = Vec::new();
        match self.check {
            Check::Logits => {
                for case in &prompts.prompts {
                    let logits = prefill(&model, &case.prompt_ids, &mut model.new_cache(), 256)
                        .map_err(|e| e.to_string())?;
                    let worst = case
                        .float_reference
                        .top20_last_logits
                        .iter()
                        .map(|&(id, want)| (logits[id as usize] - want).abs())
                        .fold(0.0f32, f32::max);
                    let top1 = argmax(&logits);
                    let want_top1 = case.float_reference.top20_last_logits[0].0;
                    report += &format!("{:?}: max |logit diff| over top-20 = {worst:.5}, top-1 {top1} (reference {want_top1})\n", case.prompt);
                    if worst > LOGIT_TOLERANCE || top1 != want_top1 {
                        failures.push(format!(
                            "{:?}: diff {worst} top1 {top1} vs {want_top1}",
                            case.prompt
                        ));
                    }
                }
            }
            Check::Greedy => {
                for case in &prompts.prompts {
                    let params = GenerateParams {
                        max_tokens: 32,
                        ..GenerateParams::default()
                    };
                    // Over the paged KV cache, as `fornax generate` runs (FP32 blocks).
                    let blocks = (case.prompt_ids.len() + params.max_tokens).div_ceil(BLOCK_TOKENS);
                    let mut kv =
                        model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
                    let ours = generate_in(
                        &model,
                        &mut PagedSeq::new(&mut kv),
                        &case.prompt_ids,
                        &params,
                        |_| true,
                    )
                    .map_err(|e| e.to_string())?;
                    match check_greedy(&ours, &case.float_reference, self.min_margin) {
                        Ok(n) => {
                            report += &format!(
                                "{:?}: {n}/32 greedy tokens equal the reference\n",
                                case.prompt
                            )
                        }
                        Err(e) => failures.push(format!("{:?}: {e}", case.prompt)),
                    }
                }
            }
            Check::Perplexity => {
                let reference: Perplexity = read_reference("perplexity.json");
                let logprobs =
                    token_logprobs(&model, &reference.ids, 256).map_err(|e| e.to_string())?;
                let ppl = perplexity(&logprobs);
                let rel = (ppl - reference.perplexity).abs() / reference.perplexity;
                report += &format!(
                    "perplexity {ppl:.4} over {} tokens, reference {:.4}, relative difference {:.4}%\n",
                    logprobs.len(),
                    reference.perplexity,
                    rel * 100.0
                );
                if logprobs.len() != reference.n_scored || rel > PPL_TOLERANCE {
                    failures.push(format!(
                        "perplexity {ppl} vs {} ({} scored)",
                        reference.perplexity,
                        logprobs.len()
                    ));
                }
            }
        }
        if failures.is_empty() {
            Ok(report)
        } else {
            Err(format!("{report}failures:\n{}", failures.join("\n")))
        }
    }
}

/// Per-token log-probabilities of the first `n` tokens of the reference perplexity text
/// (`perplexity.json`), scored 256 tokens per forward pass, the model loaded by the options.
#[derive(Debug, Clone, Copy)]
pub struct PrefixLogprobs(pub usize, pub LoadOptions);

impl BackendTask for PrefixLogprobs {
    type Output = Vec<f32>;

    fn run<B: fornax_engine::EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Vec<f32> {
        let gguf = GgufFile::parse(model_file().bytes()).expect("model");
        let model =
            Model::<B>::from_gguf_with(&gguf, &device, self.1, &mut |_, _| {}).expect("model");
        let reference: Perplexity = read_reference("perplexity.json");
        let ids = &reference.ids[..self.0.min(reference.ids.len())];
        token_logprobs(&model, ids, 256).expect("scores")
    }
}

/// Runs one check on a backend (weights loaded as the backend keeps them by default) and
/// panics with the report if it fails.
pub fn run_check(kind: BackendKind, check: Check) {
    run_check_with(kind, check, LoadOptions::default(), MIN_MARGIN);
}

/// Runs one check with the model loaded by `options`, greedy divergences allowed where
/// the reference's top-2 margin is below `min_margin`; panics with the report on failure.
pub fn run_check_with(kind: BackendKind, check: Check, options: LoadOptions, min_margin: f32) {
    let task = CheckTask {
        check,
        options,
        min_margin,
    };
    match run_on(kind, task).expect("backend available") {
        Ok(report) => eprintln!("{report}"),
        Err(report) => panic!("{check:?} failed\n{report}"),
    }
}

/// Greedy decoding of `n` tokens after `prompt` over `cache`, with the top-1 minus top-2
/// logit margin of each step.
pub fn greedy_steps<B: fornax_engine::EngineBackend>(
    model: &Model<B>,
    cache: &mut impl SeqCache<B>,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<(u32, f32)>, String> {
    let mut logits = prefill(model, prompt, cache, 256).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let token = argmax(&logits);
        let top = logits[token as usize];
        let second = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != token as usize)
            .map(|(_, &l)| l)
            .fold(f32::MIN, f32::max);
        out.push((token, top - second));
        let step = cache
            .forward(model, &[token], Logits::Last)
            .map_err(|e| e.to_string())?;
        logits = fornax_engine::logits_to_vec(step);
    }
    Ok(out)
}

/// How many leading tokens of `ours` equal `reference`; an error if they part before
/// `must_match` at a step where the reference's margin is at least [`MIN_MARGIN`].
pub fn leading_matches(
    ours: &[u32],
    reference: &[(u32, f32)],
    must_match: usize,
) -> Result<usize, String> {
    let n = ours
        .iter()
        .zip(reference)
        .take_while(|(a, (b, _))| *a == b)
        .count();
    if n < must_match.min(reference.len()) && reference[n].1 >= MIN_MARGIN {
        return Err(format!(
            "tokens part at step {n} (< {must_match}) where the reference margin is {:.3}",
            reference[n].1
        ));
    }
    Ok(n)
}

/// Submits a greedy request of `max_tokens` for each prompt of a wave, runs the engine
/// until it is idle, then the next wave; `on_step` sees the engine after every step.
/// Returns the tokens of each prompt.
pub fn serve_waves<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    prompts: &[Vec<u32>],
    waves: &[&[usize]],
    max_tokens: usize,
    mut on_step: impl FnMut(&Engine<'_, B>),
) -> Vec<Vec<u32>> {
    let mut got = vec![Vec::new(); prompts.len()];
    for wave in waves {
        let mut ids = std::collections::HashMap::new();
        for &i in *wave {
            let request = Request {
                prompt: prompts[i].clone(),
                max_tokens,
                qos: 0,
                sampling: SamplingParams::greedy(),
                stop_ids: vec![],
                constraint: None,
                logprobs: None,
                prompt_logprobs: None,
            };
            ids.insert(engine.submit(request).unwrap(), i);
        }
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
                if let Event::Token { id, token, .. } = event {
                    got[ids[&id]].push(token);
                }
            }
            on_step(engine);
        }
    }
    got
}

/// An engine over `model` with a pool of `blocks` FP32 blocks, the default scheduler and
/// policy.
pub fn f32_engine<B: EngineBackend>(model: &Model<B>, blocks: usize) -> Engine<'_, B> {
    let kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
    Engine::new(model, kv, SchedulerConfig::default(), PolicyKind::default())
}
