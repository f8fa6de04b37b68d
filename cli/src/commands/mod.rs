//! Sub-commands and what they share: model and backend selection, loading with progress.

pub mod bench;
pub mod generate;
pub mod info;
pub mod kv_args;
pub mod models;
pub mod perplexity;
pub mod sched_args;
pub mod serve;
pub mod spec_args;
pub mod tokenize;
pub mod window_args;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use fornax::model_file::ModelFile;
use fornax::model_store;
use fornax_backends::{BackendKind, BackendTask};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::{LoadOptions, Model};
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
        match &self.model {
            Some(p) if p.exists() => Ok(p.clone()),
            Some(p) => match p.to_str().and_then(model_store::alias) {
                Some(alias) => fetch_with_spinner(alias),
                // A bare name is taken for an alias; a path is left to fail to open.
                None if p.components().count() == 1 && p.extension().is_none() => {
                    anyhow::bail!(
                        "no model file or alias {} (aliases: {})",
                        p.display(),
                        model_store::alias_names()
                    )
                }
                None => Ok(p.clone()),
            },
            None => fetch_with_spinner(model_store::DEFAULT),
        }
    }

    /// Runs `task` on the chosen backend, with the CPU thread count asked for (default:
    /// the available parallelism), this thread being one of the CPU backend's threads.
    pub fn run_on<T: BackendTask>(&self, task: T) -> Result<T::Output> {
        fornax_backends::set_cpu_threads(self.cpu_threads())?;
        fornax_backends::tile_many_tokens_everywhere(self.tiled_products);
        Ok(fornax_backends::run_on(self.backend, task)?)
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

/// An alias's file, fetched when missing: with a spinner on a terminal, else (logs,
/// pipes, where a spinner draws nothing) one line per stage on stderr.
fn fetch_with_spinner(alias: &model_store::Alias) -> Result<PathBuf> {
    if !std::io::stderr().is_terminal() {
        return alias.ensure(&mut |s| eprintln!("{s}"));
    }
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let path = alias.ensure(&mut |s| spinner.set_message(s.to_string()));
    spinner.finish_and_clear();
    path
}

/// `fornax fetch [ALIAS]`: the alias's file (default model if none), fetched when missing.
pub fn fetch(name: Option<String>) -> Result<()> {
    let alias = match name {
        None => model_store::DEFAULT,
        Some(n) => model_store::alias(&n).with_context(|| {
            format!(
                "no model alias {n:?} (aliases: {})",
                model_store::alias_names()
            )
        })?,
    };
    let path = fetch_with_spinner(alias)?;
    println!("{}", path.display());
    Ok(())
}
