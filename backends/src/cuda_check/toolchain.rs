//! NVRTC and ptxas from NVIDIA's PyPI wheels (`scripts/cuda-tools.sh`): CUDA C++ to PTX
//! as CubeCL's CUDA runtime compiles it, then PTX to machine code with ptxas's
//! resource report. Neither needs a GPU or a driver.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::runtime::CapturedKernel;
use super::target::Target;

/// The CUDA version the tools must match: the one `cudarc` is built for.
pub const CUDA_VERSION: &str = "12.8";

/// Where NVRTC, ptxas and the CUDA headers were installed.
#[derive(Debug, Clone)]
pub struct Toolchain {
    root: PathBuf,
}

/// Why a kernel does not build for a target, with the compiler's words.
#[derive(Debug, Clone, thiserror::Error)]
#[error("kernel {kernel} for {target}: {stage} failed:\n{message}")]
pub struct KernelError {
    /// The kernel's entry point.
    pub kernel: String,
    /// `sm_80` or `sm_90a`.
    pub target: String,
    /// CubeCL, NVRTC or ptxas.
    pub stage: &'static str,
    /// What that stage said.
    pub message: String,
}

/// Why the tools cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error("the CUDA tools are not installed in {0} (run scripts/cuda-tools.sh, or set FORNAX_CUDA_TOOLS)")]
    Missing(PathBuf),
    #[error("could not load NVRTC from {0}: {1}")]
    Nvrtc(PathBuf, String),
}

/// What ptxas reports for one kernel on one target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, in bytes.
    pub static_shared: usize,
    /// Bytes spilled to local memory (stores).
    pub spill_stores: u32,
    /// Bytes read back from spills.
    pub spill_loads: u32,
    /// Stack frame per thread, in bytes.
    pub stack: u32,
}

impl Toolchain {
    /// The tools in `$FORNAX_CUDA_TOOLS`, else in `cuda-tools` of the model cache's folder.
    pub fn find() -> Result<Toolchain, ToolchainError> {
        let root = std::env::var_os("FORNAX_CUDA_TOOLS")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| fornax_engine::store::home().join("cuda-tools"));
        Toolchain::at(&root)
    }

    /// The tools installed (`pip install --target`) in `root`. Loads NVRTC.
    pub fn at(root: &Path) -> Result<Toolchain, ToolchainError> {
        let tools = Toolchain {
            root: root.to_path_buf(),
        };
        for path in [
            tools.nvrtc(),
            tools.ptxas_path(),
            tools.include().join("cuda_runtime.h"),
        ] {
            if !path.exists() {
                return Err(ToolchainError::Missing(root.to_path_buf()));
            }
        }
        // Loaded once by path: cudarc then finds it among the loaded libraries by its
        // soname, `libnvrtc.so.12`, without a search path.
        static NVRTC: std::sync::OnceLock<Result<libloading::Library, String>> =
            std::sync::OnceLock::new();
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
        let loaded = NVRTC.get_or_init(|| unsafe {
            libloading::Library::new(tools.nvrtc()).map_err(|e| e.to_string())
        });
        if let Err(e) = loaded {
            return Err(ToolchainError::Nvrtc(tools.nvrtc(), e.clone()));
        }
        Ok(tools)
    }

    fn nvrtc(&self) -> PathBuf {
        self.root.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
    }

    fn ptxas_path(&self) -> PathBuf {
        self.root.join("nvidia/cuda_nvcc/bin/ptxas")
    }

    fn include(&self) -> PathBuf {
        self.root.join("nvidia/cuda_runtime/include")
    }

    /// Compiles `kernel` for `target` as CubeCL's CUDA runtime would (NVRTC, with its
    /// options), then assembles the PTX with ptxas, which reports its resources.
    pub fn build(&self, kernel: &CapturedKernel, target: Target) -> Result<Resources, KernelError> {
        let arch = target.gpu_architecture();
        let fail = |stage, message: String| KernelError {
            kernel: kernel.name.clone(),
            target: arch.clone(),
            stage,
            message,
        };
        let source = kernel
            .source
            .as_ref()
            .map_err(|e| fail("CubeCL", e.clone()))?;
        let ptx = self
            .nvrtc_compile(source, &arch)
            .map_err(|e| fail("NVRTC", e))?;
        let report = self.ptxas(&ptx, &arch).map_err(|e| fail("ptxas", e))?;
        Ok(parse_ptxas(&report))
    }

    fn nvrtc_compile(&self, source: &str, arch: &str) -> Result<String, String> {
        use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture={arch}"), "-lineinfo".into()],
            // The toolkit's `include` holds both wheels' headers (`mma.h` includes `crt/`).
            include_paths: [self.include(), self.root.join("nvidia/cuda_nvcc/include")]
                .map(|p| p.display().to_string())
                .into(),
            ..Default::default()
        };
        match compile_ptx_with_opts(source, options) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(CompileError::CompileError { log, .. }) => Err(log.to_string_lossy().into_owned()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    fn ptxas(&self, ptx: &str, arch: &str) -> Result<String, String> {
        // A folder per call: calls run side by side.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fornax-ptxas-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let name = "kernel";
        let input = dir.join(format!("{name}.ptx"));
        std::fs::write(&input, ptx).map_err(|e| e.to_string())?;
        let output = Command::new(self.ptxas_path())
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg("-o")
            .arg(dir.join(format!("{name}.cubin")))
            .arg(&input)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.ptxas_path().display()))?;
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        if output.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }
}

/// The numbers in ptxas's `-v` report ("Used 40 registers, 2048 bytes smem", "0 bytes
/// stack frame, 0 bytes spill stores, 0 bytes spill loads").
pub fn parse_ptxas(report: &str) -> Resources {
    let mut r = Resources::default();
    for line in report.lines() {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        for (i, w) in words.iter().enumerate() {
            let value = || i.checked_sub(1).and_then(|j| words[j].parse::<u64>().ok());
            let next = words.get(i + 1).copied().unwrap_or("");
            match (*w, next) {
                ("registers", _) => r.registers = value().unwrap_or(0) as u32,
                ("bytes", "smem") => r.static_shared = value().map_or(0, |v| v as usize),
                ("bytes", "stack") => r.stack = value().unwrap_or(0) as u32,
                ("bytes", "spill") => {
                    let v = value().unwrap_or(0) as u32;
                    match words.get(i + 2).copied() {
                        Some("stores") => r.spill_stores = v,
                        Some("loads") => r.spill_loads = v,
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
    r
}
