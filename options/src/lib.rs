//! Command-line options shared by the `fornax` commands, its server and its benchmarks:
//! the model and backend, the paged KV cache, the scheduler, speculative decoding and the
//! elastic window; and loading a model with progress on stderr.

pub mod kv;
pub mod sched;
pub mod spec;
pub mod window;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendKind, BackendTask, Dtype};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::{LoadOptions, Model};
use fornax_engine::store::{self, ModelFile};
use fornax_engine::tokenizer::Tokenizer;
use fornax_engine::EngineBackend;
use indicatif::{ProgressBar, ProgressStyle};

/// Which model and backend to use.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file, or an alias fetched into the cache: smollm2-135m (the default,
    /// SmolLM2-135M-Instruct Q4_1) or gemma3-270m (`fornax models` lists them).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Compute backend: auto (CUDA, else a GPU through wgpu, else CPU), wgpu, cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: BackendKind,
    /// The activations' float type: auto (f16 on CUDA, else f32), f32, f16 (CUDA; wgpu
    /// adapters with shader-f16) or bf16 (CUDA). Products, sums, attention, norms'
    /// statistics and logits stay FP32.
    #[arg(long, default_value = "auto")]
    pub dtype: Dtype,
    /// Dequantize every weight to FP32 at load (the reference path), even where the
    /// backend has kernels for quantized weights.
    #[arg(long)]
    pub dequantize: bool,
    /// Run each layer operation by operation (the reference path) instead of as the fused
    /// kernels (CubeCL backends with quantized weights).
    #[arg(long)]
    pub reference_ops: bool,
    /// Multiply more than 8 tokens at a time with the tiled quantized kernel, its epilogue
    /// fused, on every device, as GPUs and the browser do: a decode step of many sequences
    /// then launches at most 8 kernels per layer. On lavapipe the default, FP32 matmuls
    /// over dequantized rows, is faster.
    #[arg(long)]
    pub tiled_products: bool,
    /// Threads of the CPU backend (default: the available parallelism).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
}

impl ModelArgs {
    /// The model path: a file as given, or an alias's file (fetched when missing); the
    /// default model when none is given.
    pub fn path(&self) -> Result<PathBuf> {
        model_path(self.model.as_deref())
    }

    /// Runs `task` on the chosen backend, with the CPU thread count asked for (default:
    /// the available parallelism), this thread being one of the CPU backend's threads.
    pub fn run_on<T: BackendTask>(&self, task: T) -> Result<T::Output> {
        fornax_backends::set_cpu_threads(self.cpu_threads())?;
        fornax_backends::tile_many_tokens_everywhere(self.tiled_products);
        Ok(fornax_backends::run_on_with(
            self.backend,
            self.dtype,
            task,
        )?)
    }

    /// The CPU thread count asked for, else the available parallelism.
    pub fn cpu_threads(&self) -> usize {
        self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        )
    }

    /// How to load the weights.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            dequantize: self.dequantize,
            reference_ops: self.reference_ops,
        }
    }

    /// Maps the model file.
    pub fn open(&self) -> Result<ModelFile> {
        ModelFile::open(&self.path()?)
    }
}

/// A chat template that replaces the model file's.
#[derive(Args, Debug, Clone, Default)]
pub struct TemplateArgs {
    /// Chat template (Jinja, as in a `tokenizer_config.json`'s `chat_template`) to use
    /// instead of the model file's: for a file without one, or with an older one than
    /// its family's (Qwen2.5's or Llama 3.2's tool calling).
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
}

impl TemplateArgs {
    /// Reads the template, if one was given, into `tok`.
    pub fn apply(&self, tok: &mut Tokenizer) -> Result<()> {
        let Some(path) = &self.chat_template_file else {
            return Ok(());
        };
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the chat template {}", path.display()))?;
        anyhow::ensure!(
            !source.trim().is_empty(),
            "the chat template {} is empty",
            path.display()
        );
        tok.set_chat_template(source);
        Ok(())
    }
}

/// Parses a mapped file, naming the file in errors.
pub fn parse(file: &ModelFile) -> Result<GgufFile<'_>> {
    GgufFile::parse(file.bytes()).context("invalid GGUF model file")
}

/// Builds the tokenizer from the file.
pub fn tokenizer(gguf: &GgufFile<'_>) -> Result<Tokenizer> {
    Tokenizer::from_gguf(gguf).context("cannot build the tokenizer from the model file")
}

/// Loads the model onto `device` with a progress bar on stderr.
pub fn load_model<B: EngineBackend>(
    gguf: &GgufFile<'_>,
    device: &B::Device,
    options: LoadOptions,
) -> Result<Model<B>> {
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} tensors {elapsed}")
            .expect("valid template"),
    );
    let model = Model::from_gguf_with(gguf, device, options, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    model.context("cannot load the model")
}

/// The model `name` stands for: a file as given, or an alias's file (fetched when
/// missing, with a status line); the default model when `None`.
pub fn model_path(name: Option<&Path>) -> Result<PathBuf> {
    with_status(|status| match name {
        Some(name) => store::resolve(name, status),
        None => store::DEFAULT.ensure(status),
    })
}

/// Runs `fetch` (a model fetch) with its stages shown: a spinner on a terminal, else (logs,
/// pipes, where a spinner draws nothing) one line per stage on stderr.
pub fn with_status<T>(fetch: impl FnOnce(&mut dyn FnMut(&str)) -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return fetch(&mut |s| eprintln!("{s}"));
    }
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let out = fetch(&mut |s| spinner.set_message(s.to_string()));
    spinner.finish_and_clear();
    out
}
