//! `fornax`: run Llama-family GGUF models on wgpu, CPU or CUDA.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fornax",
    version,
    about = "Fornax: LLM inference on burn (wgpu, CPU, CUDA)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming tokens to stdout.
    Generate(commands::generate::GenerateArgs),
    /// Print token ids of TEXT as a JSON array (or decode ids with --decode).
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Print the model, the backend and the adapter.
    Info(fornax_options::ModelArgs),
    /// Perplexity of a text file under the model.
    Perplexity(commands::perplexity::PerplexityArgs),
    /// Fetch a model by alias (default: the default model) into the cache if missing, and
    /// print its path.
    Fetch {
        /// A model alias (`fornax models` lists them).
        alias: Option<String>,
    },
    /// List the model aliases, which are cached, and each cached file's architecture and
    /// tensor types.
    Models,
    /// Serve the OpenAI-compatible HTTP API (completions, chat, models, health, metrics).
    Serve(commands::serve::ServeArgs),
    /// Build every kernel the engine launches for a CUDA target with NVRTC and ptxas (no
    /// GPU needed) and print each kernel's registers, shared memory, spills and occupancy.
    Kernels(commands::kernels::KernelsArgs),
    /// Benchmarks (not tests): print measured figures.
    #[command(subcommand)]
    Bench(fornax_bench::BenchCommand),
}

/// Mesa's Vulkan driver prints "XDG_RUNTIME_DIR is invalid or not set" (twice) when the
/// wgpu probe starts it without that directory. Fornax opens no window, so when the
/// user's is missing it points the variable at a private directory of its own, before any
/// thread starts.
fn ensure_runtime_dir() {
    let valid = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .is_some_and(|p| p.is_absolute() && p.is_dir());
    if valid {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
        let dir = std::env::temp_dir().join(format!("fornax-runtime-{uid}"));
        let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        if made.is_ok() || dir.is_dir() {
            std::env::set_var("XDG_RUNTIME_DIR", dir);
        }
    }
}

fn main() {
    ensure_runtime_dir();
    let cli = Cli::parse();
    // Before any backend starts: CUDA's compiled kernels are kept for later runs.
    fornax_backends::kernel_cache::keep_compiled_kernels(
        &fornax_engine::store::home().join("kernels"),
    );
    let result = match cli.command {
        Command::Generate(a) => commands::generate::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Fetch { alias } => commands::fetch(alias),
        Command::Models => commands::models::run(),
        Command::Serve(a) => commands::serve::run(a),
        Command::Kernels(a) => commands::kernels::run(a),
        Command::Bench(b) => fornax_bench::run(b),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
