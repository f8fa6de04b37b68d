//! The CUDA kernel check without a GPU: the engine runs a workload on a compile-only
//! CubeCL runtime ([`CheckRuntime`]) that writes each launched kernel in CUDA C++ as
//! `burn-cuda` would; NVRTC and ptxas ([`Toolchain`]) then build each for A100 (sm_80)
//! and H100 (sm_90a), reporting registers, shared memory and spills.

mod runtime;
mod target;
mod toolchain;
mod workload;

use burn_cubecl::CubeBackend;
use fornax_engine::gguf::GgufFile;

use crate::Dtype;

pub use runtime::{CapturedKernel, CheckDevice, CheckRuntime};
pub use target::Target;
pub use toolchain::{parse_ptxas, KernelError, Resources, Toolchain, ToolchainError, CUDA_VERSION};
pub use workload::BATCH;

/// The engine on the compile-only runtime, with `burn-cuda`'s element types.
pub type CheckBackend = CubeBackend<CheckRuntime, f32, i32, u8>;

/// Every distinct kernel the engine launches for `gguf`'s model (prefill, decode at
/// batch 1 and [`BATCH`], scoring, sampling) with activations of each of `dtypes` (F32,
/// F16, Bf16), written in CUDA C++ for `target`.
pub fn capture(
    gguf: &GgufFile,
    target: Target,
    dtypes: &[Dtype],
) -> anyhow::Result<Vec<CapturedKernel>> {
    runtime::take_captured(target);
    for &dtype in dtypes {
        let device = CheckDevice::with_dtype(target, dtype);
        crate::dtype::set_on::<CheckBackend>(&device, crate::BackendKind::Cuda, dtype)?;
        workload::run::<CheckBackend>(gguf, &device)?;
    }
    Ok(runtime::take_captured(target))
}

/// One kernel built for one target.
#[derive(Debug, Clone)]
pub struct KernelRow {
    /// The entry point.
    pub name: String,
    /// Threads per block.
    pub threads: u32,
    /// ptxas's report.
    pub resources: Resources,
    /// Shared memory per block, static and dynamic, in bytes.
    pub shared: usize,
    /// Resident warps per multiprocessor over the most it holds.
    pub occupancy: f64,
}

/// Builds every kernel for `target` on both cores; the kernels that failed come back
/// apart, each with its compiler's message.
pub fn build_all(
    tools: &Toolchain,
    kernels: &[CapturedKernel],
    target: Target,
) -> (Vec<KernelRow>, Vec<KernelError>) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = kernels.len().div_ceil(threads).max(1);
    let results: Vec<Result<KernelRow, KernelError>> = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|k| tools.build(k, target).map(|r| row(k, r, target)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a build thread panicked"))
            .collect()
    });
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(row) => rows.push(row),
            Err(e) => errors.push(e),
        }
    }
    (rows, errors)
}

fn row(kernel: &CapturedKernel, resources: Resources, target: Target) -> KernelRow {
    let (x, y, z) = kernel.cube_dim;
    let threads = x * y * z;
    let shared = resources.static_shared + kernel.dynamic_shared;
    KernelRow {
        name: kernel.name.clone(),
        threads,
        occupancy: occupancy(target, threads, resources.registers, shared),
        shared,
        resources,
    }
}

/// Resident warps per multiprocessor over its 64, from the block size, registers per
/// thread and shared memory per block: the least of the warp, block, register and
/// shared-memory limits (registers allocated per warp in units of 256, shared memory in
/// units of 128 bytes plus the 1 KiB the hardware reserves per block).
pub fn occupancy(target: Target, threads: u32, registers: u32, shared: usize) -> f64 {
    let warps = threads.div_ceil(32).max(1);
    let by_warps = Target::WARPS_PER_SM / warps;
    let per_warp = (registers.max(1) * 32).div_ceil(256) * 256;
    let by_registers = (Target::REGISTERS_PER_SM / per_warp) / warps;
    let block_shared = (shared + Target::RESERVED_SHARED_PER_BLOCK).div_ceil(128) * 128;
    let by_shared = (target.shared_per_sm / block_shared) as u32;
    let blocks = by_warps
        .min(by_registers)
        .min(by_shared)
        .min(Target::BLOCKS_PER_SM);
    f64::from(blocks * warps) / f64::from(Target::WARPS_PER_SM)
}

/// The rows as a Markdown table, one line per distinct entry point and figures (the
/// variants of one kernel that build alike are counted, not repeated).
pub fn table(rows: &[KernelRow]) -> String {
    let mut lines: Vec<(&str, String, usize)> = Vec::new();
    for r in rows {
        let spills = r.resources.spill_stores + r.resources.spill_loads;
        let figures = format!(
            "{} | {} | {} | {} | {:.0}%",
            r.threads,
            r.resources.registers,
            r.shared,
            spills,
            r.occupancy * 100.0
        );
        match lines
            .iter_mut()
            .find(|(n, f, _)| *n == r.name && *f == figures)
        {
            Some((_, _, count)) => *count += 1,
            None => lines.push((&r.name, figures, 1)),
        }
    }
    let mut out = String::from(
        "| kernel | threads | registers | shared bytes | spill bytes | occupancy |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for (name, figures, count) in lines {
        let times = if count > 1 {
            format!(" ×{count}")
        } else {
            String::new()
        };
        out += &format!("| `{name}`{times} | {figures} |\n");
    }
    out
}
