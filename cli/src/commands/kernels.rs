//! `fornax kernels`: every CubeCL kernel the engine launches for a model, built for a
//! CUDA target with NVRTC and ptxas (no GPU needed), with each kernel's registers, shared
//! memory, spills and occupancy.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use fornax_backends::cuda_check::{self, Target, Toolchain};
use fornax_backends::Dtype;
use fornax_engine::store;

use fornax_options::{model_path, parse};

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// The architecture: sm_80 (A100) or sm_90 (H100).
    #[arg(long, default_value = "sm_90")]
    pub target: String,
    /// The model (an alias or a GGUF path; default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Also write each kernel's CUDA C++ source into this folder.
    #[arg(long)]
    pub sources: Option<PathBuf>,
    /// The activations' float types to run the workload in (f32, f16, bf16).
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    pub dtype: Vec<Dtype>,
}

pub fn run(args: KernelsArgs) -> Result<()> {
    let Some(target) = Target::named(&args.target) else {
        bail!("unknown target {:?} (choose sm_80 or sm_90)", args.target);
    };
    let tools = Toolchain::find()?;
    let path = model_path(args.model.as_deref())?;
    let file = store::ModelFile::open(&path)?;
    let gguf = parse(&file)?;
    if args.dtype.contains(&Dtype::Auto) {
        bail!("name the float types: f32, f16 or bf16");
    }
    let kernels = cuda_check::capture(&gguf, target, &args.dtype)?;
    if let Some(dir) = &args.sources {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (i, k) in kernels.iter().enumerate() {
            let text = k.source.as_deref().unwrap_or_else(|e| e);
            std::fs::write(dir.join(format!("{i:03}-{}.cu", k.name)), text)?;
        }
    }
    let (rows, errors) = cuda_check::build_all(&tools, &kernels, target);
    println!(
        "{} ({}, {}): {} distinct kernels of a decode step at batch 1 and {}, prefill, scoring \
         and sampling with {} activations, built with NVRTC and ptxas (CUDA {})\n",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        ),
        target.gpu_architecture(),
        target.part,
        kernels.len(),
        cuda_check::BATCH,
        args.dtype
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(", "),
        cuda_check::CUDA_VERSION,
    );
    print!("{}", cuda_check::table(&rows));
    for e in &errors {
        eprintln!("{e}");
    }
    if !errors.is_empty() {
        bail!(
            "{} of {} kernels failed to build for {}",
            errors.len(),
            kernels.len(),
            target.gpu_architecture()
        );
    }
    Ok(())
}
